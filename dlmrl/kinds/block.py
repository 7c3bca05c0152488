"""``model.kind: block``: a block-diffusion LM (SDAR/TraDo, LLaDA2, the tiny block model): blocks of
``model.block_size`` tokens written left to right, each denoised with bidirectional attention inside the block and
causal attention to the prompt and the finished blocks (an exact key/value cache).

It is a masked-diffusion kind (:class:`~dlmrl.kinds.masked.MaskedDiffusionKind`: the families, the estimators,
the sampled trajectory) with its own block size, sampler (``block_generate``), early stop at EOS (on by default, as
SDAR's ``block_diffusion_generate``) and composite scoring pass (``[prompt | noisy | clean]``, arXiv 2510.06303).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dlmrl.errors import ConfigError
from dlmrl.kinds.base import KINDS, check_key, refuse_claimed_checkpoint, warn_key
from dlmrl.kinds.masked import MaskedDiffusionKind, early_stop_plan

__all__ = ["BlockDiffusionKind"]


class BlockDiffusionKind(MaskedDiffusionKind):
    """Block diffusion (SDAR/TraDo, LLaDA2): blocks of model.block_size left to right, an exact key/value cache of
    the finished blocks, the likelihood estimators per block."""

    name = "block"
    sampling_keys = ("sub_block_size", "causal_context")
    stops_at_eos_by_default = True
    turn_stops_at = "the end of the block where that line ends (model.block_size)"

    def runs_preset(self, preset) -> bool:
        """The diffusion presets and the block-only ones (``policies`` containing ``block``: ``block_just_grpo``)."""
        return "diffusion" in preset.policies or "block" in preset.policies

    def scored_length(self, cfg) -> int:
        """One block (``model.block_size``, at most the completion): every composite pass scores each block's part
        of the plan at once, so an estimator's NFE is its count on one block (left-to-right trajectory: ``⌈B / k⌉``
        levels)."""
        size = cfg.model.block_size
        return min(size, cfg.sampling.gen_length) if isinstance(size, int) and size >= 1 else cfg.sampling.gen_length

    # ----- loading -----------------------------------------------------------------------------------------
    def load(self, model_cfg):
        from dlmrl.models.loading import load_block_policy

        m = model_cfg
        return load_block_policy(m.name_or_path, m.block_size, m.family, m.trust_remote_code, m.dtype,
                                 adapter_kinds=self.adapter_kinds())

    def owns(self, policy) -> bool:
        from dlmrl.models.block_policy import BlockDiffusionPolicy

        return isinstance(policy, BlockDiffusionPolicy)

    def wrap(self, model, tokenizer, cfg):
        from dlmrl.models.block_policy import block_policy_from
        from dlmrl.models.families import FAMILIES

        policy = super().wrap(model, tokenizer, cfg)
        fam = FAMILIES.get(policy.family)
        if fam.block_forward is None or not cfg.model.block_size:
            raise ConfigError(f"config key 'model.kind': block needs a family with a block-causal forward and a block "
                              f"size (model.block_size, or the model's config.block_size); got family "
                              f"{policy.family!r}, block size {cfg.model.block_size}")
        return block_policy_from(policy, cfg.model.block_size, fam.block_forward, fam.prompt_blocks)

    def adopt_model_settings(self, cfg, model) -> None:
        inner = getattr(model, "model", model)  # (a dlmrl policy holds the transformers model)
        config = getattr(inner, "config", None)
        recorded = getattr(config, "block_size", None)  # (a loaded block model's own size)
        if recorded is None:  # (Fast-dLLM v2's config calls it bd_size)
            recorded = getattr(config, "bd_size", None)
        if cfg.model.block_size is None and isinstance(recorded, int):
            cfg.model.block_size = getattr(model, "block_size", None) or recorded

    def check_loaded(self, cfg, policy) -> None:
        if policy.block_size != cfg.model.block_size:
            raise ConfigError(f"config key 'model.block_size': the policy's block size is {policy.block_size} but "
                              f"model.block_size is {cfg.model.block_size}")
        policy.sub_block_size = cfg.sampling.sub_block_size  # (the sampler's sub-blocks: the run's config decides)
        causal = cfg.sampling.causal_context
        if causal is not None:  # (null: the family's clean context, set at load)
            check_key(not (causal and policy.logit_shift), "sampling.causal_context",
                      f"true needs a family whose output at i predicts token i; family {policy.family!r} shifts its "
                      "outputs by one (logit_shift 1): set it null or false")
            # (the causal layout takes a block's first token from the output at the clean position before it: an
            # AR head's prediction, which only a family trained both ways has; another family's output there was
            # never trained to predict the next token, so true would decode and score a layout it never learnt)
            from dlmrl.models.families import FAMILIES

            native = policy.family in FAMILIES and FAMILIES.get(policy.family).clean_context == "causal"
            check_key(not causal or native, "sampling.causal_context",
                      f"true needs a family trained with a causal clean context and an AR head (nemotron_diffusion); "
                      f"family {policy.family!r} attends its context block-causally: set it null or false")
            policy.clean_context = "causal" if causal else "block"

    # ----- the config check ----------------------------------------------------------------------------------
    def check_model(self, cfg) -> None:
        """The family (as the full-diffusion kind) and ``model.block_size``: an integer >= 1, at most the completion
        (resolved from the checkpoint's config.json when null), no guidance, and ``sampling.block_length`` left
        alone or equal to it."""
        refuse_claimed_checkpoint(cfg)  # (a checkpoint another kind claims, e.g. a DiffusionGemma)
        m, s = cfg.model, cfg.sampling
        if m.family != "auto":
            from dlmrl.kinds.families import check_family_matches

            check_family_matches(m.name_or_path, m.family)
        if m.block_size is None:
            from dlmrl.models.loading import checkpoint_block_size

            try:
                m.block_size = checkpoint_block_size(m.name_or_path, m.family)
            except ValueError as e:  # (config.json records a bad block_size: named with its value)
                raise ConfigError(f"config key 'model.block_size': model.kind block needs a block size, and {e}") \
                    from None
            check_key(m.block_size is not None, "model.block_size",
                      f"model.kind block needs a block size, and the config.json of {m.name_or_path!r} (and its "
                      "family) records none or could not be read (a hub checkpoint's needs the hub); set "
                      "model.block_size")
            chosen = False
        else:
            chosen = True
        b = m.block_size
        check_key(isinstance(b, int) and not isinstance(b, bool) and b >= 1, "model.block_size",
                  f"must be an integer >= 1, got {b!r}")
        if chosen:
            _warn_untrained_block_size(m)
        check_key(b <= s.gen_length, "model.block_size",
                  f"{b} is longer than the completion (sampling.gen_length {s.gen_length}); one block is "
                  f"model.block_size {s.gen_length}")
        default_length = type(s)().block_length
        check_key(s.block_length in (default_length, b), "sampling.block_length",
                  f"does not apply to model.kind block, which decodes in the model's blocks (model.block_size {b}); "
                  f"remove it (got {s.block_length})")
        check_key(s.cfg_scale == 0, "sampling.cfg_scale",
                  "classifier-free guidance is not implemented for model.kind block (set it 0)")
        sub = s.sub_block_size
        check_key(sub is None or (isinstance(sub, int) and not isinstance(sub, bool) and 1 <= sub <= b),
                  "sampling.sub_block_size", f"must be null or an integer from 1 to model.block_size {b}, got {sub!r}")
        check_key(s.causal_context is None or isinstance(s.causal_context, bool), "sampling.causal_context",
                  f"must be null, true or false, got {s.causal_context!r}")

    def denoising_blocks(self, cfg) -> tuple[int, str]:
        # (the sampler decodes in the model's blocks; the last may be shorter)
        s, m = cfg.sampling, cfg.model
        return -(-s.gen_length // m.block_size), f"⌈sampling.gen_length {s.gen_length} / model.block_size {m.block_size}⌉"

    def check_step_count(self, key: str, steps: int, blocks: int, where: str, cfg) -> None:
        b = cfg.model.block_size
        if steps == blocks and b > 1:
            warn_key(f"config key {key!r}: {steps} steps over {blocks} blocks ({where}) decode each block of "
                     f"{b} tokens in one step, all of them at once from one forward pass; use "
                     f"{blocks * b} for one token per step")

    def check_cache(self, cfg) -> None:
        check_key(False, "sampling.cache",
                  "is the approximate block cache of a bidirectional model; model.kind 'block' always decodes with its "
                  "exact key/value cache of finished blocks (set it none)")

    def check_estimator(self, cfg, name: str, estimator, section, flat: dict | None = None) -> None:
        # (SPG's block masks tile each block: estimator_sampling gives the estimator one block's canvas)
        super().check_estimator(cfg, name, estimator, section, flat=None)

    def check_tools_in_rollout(self, cfg, estimator_name: str) -> None:
        """Any estimator: a block's attention is causal across blocks, so the turns decoded before an observation
        never attended where it now stands."""

    def estimator_sampling(self, cfg):
        """The sampling of one block (``gen_length = block_length = model.block_size``, ``steps`` per block), so the
        trajectory estimator's NFE counts a block's steps (its passes cover every block at once) and SPG's masks tile
        the policy's blocks."""
        s, m = cfg.sampling, cfg.model
        if not m.block_size:
            return s
        blocks = -(-s.gen_length // m.block_size)
        return dataclasses.replace(s, gen_length=m.block_size, block_length=m.block_size,
                                   steps=max(s.steps // blocks, 1))

    # ----- sizes ---------------------------------------------------------------------------------------------
    def memory_shapes(self, cfg, prompt: int, per_update: int, nfe: int) -> dict:
        length, b = cfg.sampling.gen_length, cfg.model.block_size
        # (each scoring canvas is a composite pass over [prompt | noisy | clean]: P + 2L positions)
        return {"canvases": per_update * nfe, "positions": prompt + 2 * length, "head_positions": None,
                "scored_positions": length, "float_copy_all": True, "cached": True, "rollout_block": b,
                "rollout_forward_positions": b, "dense_mask": True, "prefill_positions": prompt}

    # ----- evaluation ----------------------------------------------------------------------------------------
    def record_sampling(self, sampling: dict, cfg, policy) -> dict:
        # (it decodes in the model's blocks: their size decides the figures, not block_length)
        # (sub-blocks and the clean context's layout decide which tokens a step reveals and what it sees: a record
        # without them could not tell Fast-dLLM v2's sub-blocks of 8 or Nemotron's two layouts apart)
        return {**sampling, "block_length": None, "block_size": getattr(policy, "block_size", cfg.model.block_size),
                "sub_block_size": getattr(policy, "sub_block_size", None),
                "clean_context": getattr(policy, "clean_context", "block")}

    # ----- --dry-run -----------------------------------------------------------------------------------------
    def plan_attention(self, cfg, family: str) -> dict:
        from dlmrl.models.families import FAMILIES

        b = cfg.model.block_size
        prompt = ("the prompt is cut into blocks too, counted back from its end: the family's trained layout"
                  if family in FAMILIES and FAMILIES.get(family).prompt_blocks else
                  "the prompt is one clean block every block attends" if family in FAMILIES else
                  "the prompt's layout is the detected family's: one clean block (tiny) or cut into blocks (sdar)")
        plan = {"block_size": b, "attention": f"block-causal: blocks of {b} tokens, bidirectional inside a block, "
                                              f"causal across blocks ({prompt})"}
        if family in FAMILIES and FAMILIES.get(family).logit_shift:
            plan["logit_shift"] = ("1: the output at i - 1 predicts token i (the family's AR head); a block's first "
                                   "token comes from the previous block's last position and is revealed first")
        causal = cfg.sampling.causal_context
        if causal is None and family in FAMILIES:
            causal = FAMILIES.get(family).clean_context == "causal"
        if causal:
            plan["clean_context"] = ("causal (sampling.causal_context): the prompt and the finished blocks attended "
                                     "token by token, as an autoregressive model; a block attends them and itself both "
                                     "ways, and its first token comes from the output before it, revealed first")
        return plan

    def plan_sampler(self, cfg, preset, written) -> dict:
        """The block-diffusion sampler: blocks of ``model.block_size`` left to right, each denoised against the exact
        key/value cache of the prompt and the finished blocks (``block_generate``)."""
        s, ev, b = cfg.sampling, cfg.eval, cfg.model.block_size
        length = s.gen_length
        blocks = -(-length // b)
        per_block = s.steps // blocks
        out = {"kind": "block diffusion (block_generate)", "gen_length": length, "block_size": b, "blocks": blocks,
               "steps": s.steps, "steps_per_block": per_block,
               "tokens_per_step": round((written[2] if written else length) / s.steps, 3),
               "temperature": s.temperature, "remasking": s.remasking, "threshold": s.threshold,
               "threshold_factor": s.threshold_factor,
               **({"sub_block_size": f"{s.sub_block_size}: each block decoded in sub-blocks of {s.sub_block_size} "
                                     "positions, left to right"} if s.sub_block_size else {}),
               "cache": "exact key/value cache of the prompt and the finished blocks (built once per block)",
               "nfe_per_completion": s.steps, "cache_passes_per_completion": blocks}
        if s.adaptive:
            out.update({"decoding": "threshold (Fast-dLLM) inside each block, at least one token per step",
                        "steps_per_block": f"1 to {b} (data-dependent)", "tokens_per_step": "at least 1",
                        "nfe_per_completion": f"at most {length} (data-dependent)"})
        out.update(early_stop_plan(cfg, out["nfe_per_completion"], self.stops_at_eos_by_default))
        if ev.preset == "none":
            out["eval"] = {"steps": ev.steps, "steps_per_block": ev.steps // blocks if ev.steps % blocks == 0 else None,
                           "temperature": ev.temperature, "batch_size": ev.batch_size,
                           "examples": ev.num_puzzles or "the whole held-out split"}
        return out

    def plan_scoring_pass(self) -> dict:
        return {"scoring_pass": "composite: every block's noised copy next to the clean completion, 2L positions"}


def _warn_untrained_block_size(m) -> None:
    """Warn when ``model.block_size`` is not a size the local checkpoint was trained with, as its ``config.json``
    records them (``block_sizes``, the sizes of dlmrl's block pretraining; else ``block_size``, SDAR's, or ``bd_size``,
    Fast-dLLM v2's): the model
    then decodes blocks it never saw. Hub ids are not fetched here; an unreadable config is left to the load."""
    from dlmrl.models.loading import read_checkpoint_config, resolve_model_path

    path = Path(resolve_model_path(m.name_or_path))
    if not (path / "config.json").is_file():
        return
    try:
        config = read_checkpoint_config(str(path))
    except (OSError, ValueError):
        return
    is_size = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1
    sizes = config.get("block_sizes")
    recorded = config.get("block_size", config.get("bd_size"))  # (Fast-dLLM v2 records it as bd_size)
    if isinstance(sizes, list) and sizes and all(map(is_size, sizes)):
        trained, what = sizes, f"block_sizes {sizes}"
    elif is_size(recorded):
        trained, what = [recorded], f"block_size {recorded}"
    else:
        return
    if m.block_size not in trained:
        warn_key(f"config key 'model.block_size': {m.block_size} is not a block size {m.name_or_path!r} was "
                 f"trained with (its config.json records {what}); it will decode blocks of a size it never saw "
                 f"(remove model.block_size to use {recorded if is_size(recorded) else trained[0]})", stacklevel=5)


KINDS.register("block")(BlockDiffusionKind())
