"""A test oracle for dlmrl's sampler: the semantics of LLaDA's released greedy ``generate`` (ML-GSAI/LLaDA
``generate.py``), and of Fast-dLLM's threshold / factor steps (NVlabs/Fast-dLLM ``llada/generate.py``), written
here independently of :mod:`dlmrl.models.sampler` (plain loops, no shared helper) so that agreement means the
sampler does what the references do.

The reference's steps, as this oracle follows them (temperature 0, ``low_confidence``, no guidance):

1. ``x = [prompt | canvas]`` (the reference's canvas is all masks; an infilling canvas with pre-placed cells
   is this oracle's extension: the reference's own rule ``mask_index = (x == mask_id)`` then simply skips the
   filled cells) and ``attention_mask = [prompt_mask | ones]``;
2. per block, each row's mask count in the block is split over the block's steps, the remainder to the first
   steps (``get_num_transfer_tokens``);
3. per step: one forward pass over the whole ``x``; ``x0 = argmax(logits)``; the confidence of a position is
   ``softmax(logits)[x0]`` over the *whole* vocabulary (mask token included); positions after the current
   block and positions not masked get ``-inf``; each row reveals its ``k`` most confident positions.

Two deliberate differences from the reference's text, both where it leaves the outcome unspecified or does
something dlmrl rules out on purpose:

- **The mask token is excluded from the argmax only.** The reference writes ``x0 = argmax(logits)`` even when
  that is the mask token (the position then stays masked and the step reveals fewer tokens); dlmrl never
  draws the mask token, so the oracle takes the argmax with the mask token's logit at ``-inf`` and leaves the
  confidence (the full softmax's probability of that token) as the reference computes it.
- **Precision and ties.** The softmax is taken in float64 (Fast-dLLM's ``get_transfer_index`` does so; LLaDA's
  own uses the logits' dtype, where probabilities near 1 round to exactly 1.0 and tie), and equal confidences
  go to the leftmost position (``torch.topk``'s order among equal values is unspecified).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class StaleContext:
    """Fast-dLLM's block caches re-derived with forward hooks instead of a key/value cache (the oracle of
    ``cache="prefix" | "dual"``).

    Every attention layer's ``k_proj`` / ``v_proj`` output is recorded on the block's first pass; on the block's
    later passes the outputs at the cached positions (before the block for ``prefix``, outside it for ``dual``)
    are replaced by the recorded ones, the others computed afresh. The rotary embedding is applied after these
    projections, at each position's own index, so the block's queries see the keys and values a cache would
    hold: those of the sequence as it was at the block's first pass. ``NVlabs/Fast-dLLM`` ``llada/generate.py``
    (``generate_with_prefix_cache``, ``generate_with_dual_cache``) runs the block's first step over the whole
    sequence and its later steps over ``x[:, block_start:]`` / the block with ``replace_position``.
    """

    def __init__(self, hf_model: torch.nn.Module, mode: str):
        self.mode, self.recorded, self.state, self.fresh = mode, {}, "off", None
        # (transformers' decoder layers: self_attn.k_proj; LLaDA's released layout: transformer.blocks.<i>.k_proj)
        self.handles = [m.register_forward_hook(self._hook) for name, m in hf_model.named_modules()
                        if name.endswith(("self_attn.k_proj", "self_attn.v_proj"))
                        or (".blocks." in name and name.endswith((".k_proj", ".v_proj")))]

    def _hook(self, module, args, out):
        if self.state == "record":
            self.recorded[module] = out.detach().clone()
        elif self.state == "replay":
            cached = torch.ones(out.shape[1], dtype=torch.bool)
            cached[self.fresh] = False
            out = out.clone()
            out[:, cached] = self.recorded[module][:, cached]
            return out
        return None

    def close(self) -> None:
        for h in self.handles:
            h.remove()


@contextmanager
def stale_context(hf_model, mode):
    ctx = StaleContext(hf_model, mode)
    try:
        yield ctx
    finally:
        ctx.close()


def _schedule(count: int, steps: int) -> list[int]:
    """``count`` tokens over ``steps`` steps, the remainder to the first ones (32 over 5 -> 7, 7, 6, 6, 6)."""
    return [count // steps + (1 if i < count % steps else 0) for i in range(steps)]


def _top_positions(conf: list[float], k: int) -> list[int]:
    """The ``k`` positions of the largest finite values, larger first, equal values leftmost first."""
    finite = [(c, i) for i, c in enumerate(conf) if c != float("-inf")]
    finite.sort(key=lambda ci: (-ci[0], ci[1]))
    return [i for _, i in finite[:k]]


def reference_greedy(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, gen_length: int,
                     block_length: int, steps: int, mask_id: int, canvas: torch.Tensor | None = None,
                     threshold: float | None = None, factor: float | None = None,
                     cache: str | None = None) -> tuple[torch.Tensor, int]:
    """Greedy decoding by the reference's rules: ``((B, L) decoded canvas, forward passes)``.

    ``model(input_ids (B, T), attention_mask (B, T)) -> (B, T, V)`` logits. ``threshold`` / ``factor``: replace
    step 3's "k most confident" by Fast-dLLM's rules, every block run until it is decoded (the schedule of
    step 2 unused, as in Fast-dLLM's ``generate``): ``threshold``: every ranked position with confidence
    ``>= threshold``, the first always; ``factor``: ranked positions ``n = 1, 2, ...`` while
    ``confidence_n >= 1 - factor / (n + 1)``, the first always (the rule as its paper states it; Fast-dLLM's
    loop also reveals everything when only the last position fails, which dlmrl does not reproduce).
    ``cache``: ``"prefix"`` or ``"dual"``: each block's later passes see the keys and values of its first pass at
    the cached positions (:class:`StaleContext`; ``model.model`` is the ``transformers`` module).
    """
    if cache is not None:
        with stale_context(model.model, cache) as ctx:
            return _reference_loop(model, prompt_ids, prompt_mask, gen_length, block_length, steps, mask_id, canvas,
                                   threshold, factor, ctx)
    return _reference_loop(model, prompt_ids, prompt_mask, gen_length, block_length, steps, mask_id, canvas,
                           threshold, factor, None)


def _reference_loop(model, prompt_ids, prompt_mask, gen_length, block_length, steps, mask_id, canvas, threshold,
                    factor, ctx):
    B, P = prompt_ids.shape
    start = torch.full((B, gen_length), mask_id, dtype=torch.long) if canvas is None else canvas.clone()
    x = torch.cat([prompt_ids, start], dim=1)
    attention = torch.cat([prompt_mask.bool(), torch.ones(B, gen_length, dtype=torch.bool)], dim=1)
    num_blocks = gen_length // block_length
    per_block = steps // num_blocks
    passes = 0
    for b in range(num_blocks):
        lo, hi = P + b * block_length, P + (b + 1) * block_length
        counts = [int((x[j, lo:hi] == mask_id).sum()) for j in range(B)]
        plans = [_schedule(c, per_block) for c in counts]
        step = 0
        if ctx is not None:
            ctx.state, ctx.fresh = "record", (slice(lo, hi) if ctx.mode == "dual" else slice(lo, None))
        while True:
            if threshold is None and factor is None and step == per_block:
                break
            if (threshold is not None or factor is not None) and not bool((x[:, lo:hi] == mask_id).any()):
                break
            with torch.no_grad():
                logits = model(x, attention)  # (B, T, V)
                logits = logits if logits.dtype == torch.float64 else logits.float()  # (a float64 model: kept)
            passes += 1
            if ctx is not None:
                ctx.state = "replay"  # (the block's later passes: stale keys and values off the fresh positions)
            probs = torch.softmax(logits.double(), dim=-1)  # the full softmax, mask token included
            chooser = logits.clone()
            chooser[..., mask_id] = float("-inf")  # (deviation: the reference's argmax may pick the mask token)
            tokens = chooser.argmax(dim=-1)  # (B, T): the first index among equal maxima
            p_x0 = probs.gather(-1, tokens[..., None])[..., 0].tolist()  # (B, T)
            masked = (x == mask_id).tolist()
            x0 = tokens.tolist()
            for j in range(B):
                # every position's confidence, -inf off the masked positions and after the current block (the
                # earlier blocks are decoded: their positions are not masked)
                conf = [p_x0[j][t] if masked[j][t] and t < hi else float("-inf") for t in range(x.shape[1])]
                ranked = _top_positions(conf, len(conf))
                if threshold is not None:
                    chosen = [t for n, t in enumerate(ranked) if n == 0 or conf[t] >= threshold]
                elif factor is not None:
                    chosen = ranked[:1]
                    for n, t in enumerate(ranked[1:], start=2):
                        if conf[t] < 1 - factor / (n + 1):
                            break
                        chosen.append(t)
                else:
                    chosen = ranked[: plans[j][step]]
                for t in chosen:
                    x[j, t] = x0[j][t]
            step += 1
    return x[:, P:], passes
