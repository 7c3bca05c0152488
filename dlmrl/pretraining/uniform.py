"""Uniform-noise SFT of the tiny DiffusionGemma on Sudoku solutions (the base of ``model.kind: uniform``).

The uniform-noise counterpart of :mod:`dlmrl.pretraining.ar` and :mod:`dlmrl.pretraining.block`: the same config
fields, the same generated puzzles (batches a function of ``(seed, step)``), the same character tokenizer and d1's
full format: prompt ``[BOS] puzzle =``, completion = the 16 solution cells then EOS. The model is transformers' own
``DiffusionGemmaForBlockDiffusion`` (:func:`~dlmrl.models.diffusion_gemma.build_tiny_diffusion_gemma`) with
``canvas_length`` 16, so a completion is two canvases as the uniform kind writes it (a budget of
``gen_length + 1`` = 17 tokens: ``ceil(17 / 16)`` canvases): canvas 0 holds the 16 cells, canvas 1 the EOS, filled
with EOS to the canvas length (NeMo AutoModel's response-window EOS fill, ``DLLMCollator(response_window=True)``).

**The recipe** follows NeMo AutoModel's DiffusionGemma SFT (``nemo_automodel/recipes/dllm/train_ft.py``,
``DiffusionGemmaSFTRecipe._forward_backward_step``, with ``BlockDiffusionStrategy`` of
``nemo_automodel/recipes/dllm/strategy.py``):

1. **Corruption** (``corrupt_uniform_random``, ``nemo_automodel/components/datasets/dllm/corruption.py``): one level
   ``t ~ U(ε, 1)`` per example (``ε`` = 1e-3), each canvas position replaced with probability ``t`` by
   ``randint(0, V)`` over the whole vocabulary (which may redraw the clean token); no mask token.
2. **One canvas per example**: each example's loss is on one of its canvases, drawn uniformly
   (``DiffusionGemmaSFTRecipe._build_response_window``'s ``sel_block``). The encoder runs causally over the *clean*
   full sequence (prompt, cells, EOS canvas); the chosen canvas attends to the clean prompt and the clean canvases
   before it only (NeMo's block-causal mask, strict ``>``), at its own positions.
3. **Self-conditioning** with probability 0.5 per example (``self_conditioning_p``,
   ``DiffusionGemmaSFTRecipe._decide_self_conditioning``): a first decoder pass without self-conditioning, no
   grad, always run; its (softcapped) logits, detached, are the second pass's ``self_conditioning_logits``, and the
   per-example coin is the ``self_conditioning_mask`` (a row whose coin is False gets a zero signal). Only the
   second pass has a gradient (NeMo's ``DiffusionGemma`` model forward, ``components/models/diffusion_gemma``).
4. **Loss** = the flat cross-entropy over every position of the chosen canvas, corrupted or not, no ``1/t``
   weight, divided by the number of supervised canvas tokens (``BlockDiffusionCrossEntropyLoss``,
   ``nemo_automodel/components/loss/dllm_loss.py``, normalization ``"supervised"``), **plus** the encoder's
   causal-LM loss (next-token cross-entropy over the whole valid clean sequence, prompt and completion, divided by
   its number of token pairs; ``encoder_ar_loss``, ``encoder_loss_weight`` 1.0).

**dlmrl interpretation** where NeMo's recipe is silent or does not apply:

- The passes are transformers' class run as ``generate`` runs it (:mod:`dlmrl.models.diffusion_gemma`: the encoder
  fills a ``DynamicCache``, the decoder reads it); the block-causal mask is the 2D decoder attention mask with the
  columns a row may not see set False (the clean chosen canvas and those after it), not NeMo's 4D builder.
- The self-conditioning input is the first pass's logits at temperature 1 (NeMo's training feeds raw logits; the
  sampler feeds the temperature-scaled ones, ``ℓ/τ``: a train/inference gap NeMo's recipe has too).
- The tiny model's ``sliding_window`` covers the whole sequence (:data:`SLIDING_WINDOW`), so that the one encoder
  pass over the full sequence leaves the cache the sampler's prompt-then-canvas passes would.
- Sizes: ``hidden_size``, ``num_layers``, ``num_heads`` (``head_dim = hidden_size / num_heads``, one key/value
  head) and ``intermediate_size`` (the dense MLP) from the config; :data:`NUM_EXPERTS` experts (top
  :data:`TOP_K_EXPERTS`) of ``intermediate_size / 4``.

Held-out evaluation decodes the shipped test split through the uniform sampler
(:func:`~dlmrl.kinds.uniform.evaluate_uniform`: the checkpoint's generation config, the argmax final canvas, seeded).

Run it with ``dlmrl pretrain --config configs/pretrain_tiny_sudoku_uniform.yaml`` (``kind: uniform``) or
``scripts/build_tiny_uniform_default.sh``.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from dlmrl.config import PretrainConfig
from dlmrl.data.tasks import SudokuTask
from dlmrl.models.diffusion_gemma import (
    build_tiny_diffusion_gemma,
    canvas_attention_masks,
    canvas_logits,
    encode,
    new_cache,
    self_conditioning_input,
    tiny_generation_config,
    unwrap_diffusion_gemma,
)
from dlmrl.models.tokenizer import build_char_tokenizer
from dlmrl.models.uniform_policy import UniformNoisePolicy, uniform_policy_from_model
from dlmrl.pretraining.loop import pretrain_output_dir, save_pretrain_run, sft_loop

__all__ = ["CANVAS_LENGTH", "EVAL_STEPS", "build_sudoku_uniform_policy", "chosen_canvas_logits", "encode_clean",
           "pretrain_uniform", "sudoku_canvases", "uniform_sft_loss"]

#: the canvas (block) length of the shipped model: the 16 cells in one canvas, EOS in the next
CANVAS_LENGTH = 16
#: experts per layer and experts per token (every DiffusionGemma layer has a dense MLP and an expert MLP)
NUM_EXPERTS, TOP_K_EXPERTS = 4, 2
#: the sliding layers' window: longer than a prompt plus two canvases plus a canvas (dlmrl interpretation)
SLIDING_WINDOW = 128
#: the shipped generation config: at most 16 denoising steps per canvas (one cell per step at least), and
#: transformers' defaults otherwise (``DiffusionGemmaGenerationConfig``: entropy bound 0.1, t 0.8 -> 0.4, stability 1,
#: confidence 0.005)
EVAL_STEPS = 16
#: NeMo AutoModel's defaults: ``dllm.eps``, ``dllm.self_conditioning_p``, ``dllm.encoder_loss_weight``
EPS, SELF_CONDITIONING_P, ENCODER_LOSS_WEIGHT = 1e-3, 0.5, 1.0


def build_sudoku_uniform_policy(cfg: PretrainConfig) -> UniformNoisePolicy:
    """A freshly initialised tiny DiffusionGemma of ``cfg``'s size (seeded by ``cfg.seed``) over the character
    tokenizer (``V = len(tokenizer) + 3``: the class's three image ids at the end), its config's special ids the
    tokenizer's, its generation config :data:`EVAL_STEPS` steps and transformers' defaults. Float32, train mode."""
    tokenizer = build_char_tokenizer()
    eos, pad, bos = tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id
    gen = tiny_generation_config(max_new_tokens=2 * CANVAS_LENGTH, max_denoising_steps=EVAL_STEPS, entropy_bound=0.1,
                                 eos_token_id=eos, pad_token_id=pad, bos_token_id=bos)
    model = build_tiny_diffusion_gemma(
        seed=cfg.seed, vocab_size=len(tokenizer) + 3, canvas_length=CANVAS_LENGTH, hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers, num_heads=cfg.num_heads, head_dim=cfg.hidden_size // cfg.num_heads,
        num_experts=NUM_EXPERTS, top_k_experts=TOP_K_EXPERTS, intermediate_size=cfg.intermediate_size,
        moe_intermediate_size=max(1, cfg.intermediate_size // 4), sliding_window=SLIDING_WINDOW,
        generation_config=gen)
    for config in (model.config, model.config.text_config):  # (the tokenizer's ids, not the builder's 0/1/2)
        config.eos_token_id, config.pad_token_id, config.bos_token_id = eos, pad, bos
    model.train()
    return uniform_policy_from_model(model, tokenizer)


def sudoku_canvases(tokenizer, task: SudokuTask, examples) -> torch.Tensor:
    """``(B, 2·L)`` long: the 16 solution cells (canvas 0), then EOS filling canvas 1."""
    cells = [tokenizer.convert_tokens_to_ids(list(task.sft_answer(e))) for e in examples]
    if any(len(c) != CANVAS_LENGTH for c in cells):
        raise ValueError(f"the Sudoku answer must be {CANVAS_LENGTH} cells")
    eos = [tokenizer.eos_token_id] * CANVAS_LENGTH
    return torch.tensor([c + eos for c in cells])


def encode_clean(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, clean: torch.Tensor):
    """The encoder pass over the clean prompt and completion, causal, with grad: ``(ar_logits, cache)``.

    Args:
        prompt_ids / prompt_mask: ``(B, P)`` long / bool, left-padded (positions shared by every row from 0, pad
            included, as ``generate`` gives them).
        clean: ``(B, K·L)`` long, the completion's canvases.
    Returns:
        ``ar_logits`` ``(B, P + K·L, V)`` float32, the encoder's next-token logits (``lm_head`` and the softcap the
        model applies to canvas logits); ``cache`` the ``DynamicCache`` of all ``P + K·L`` positions.
    """
    inner = unwrap_diffusion_gemma(model)
    full_mask = torch.cat([prompt_mask.bool(), torch.ones_like(clean, dtype=torch.bool)], dim=1)
    cache = new_cache(model)
    n = full_mask.shape[1]
    enc = encode(model, torch.cat([prompt_ids, clean], dim=1), full_mask, cache,
                 torch.arange(n, dtype=torch.int32, device=prompt_ids.device).unsqueeze(0))
    ar_logits = inner.lm_head(enc.last_hidden_state).float()
    cap = inner.final_logit_softcapping
    if cap is not None:  # (as DiffusionGemmaForBlockDiffusion.forward softcaps the canvas logits)
        ar_logits = torch.tanh(ar_logits / cap) * cap
    return ar_logits, cache


def chosen_canvas_logits(model, cache, prompt_mask: torch.Tensor, canvases: int, chosen: torch.Tensor,
                         canvas: torch.Tensor, self_conditioning_logits: torch.Tensor | None = None,
                         self_conditioning_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The decoder over each row's noisy canvas, at canvas index ``chosen[b]``, reading the full clean cache of
    :func:`encode_clean` with the block-causal mask: the clean prompt and the clean canvases before ``chosen[b]``
    visible, the rest hidden; positions ``P + chosen[b]·L + (0..L-1)``. Equal to the sampler's pass on a cache of
    the prompt and the ``chosen[b]`` canvases before it (``tests/pretraining/test_pretrain_uniform.py``).

    Args:
        cache: :func:`encode_clean`'s cache (``P + canvases·L`` positions).
        prompt_mask: ``(B, P)`` bool. chosen: ``(B,)`` long in ``[0, canvases)``. canvas: ``(B, L)`` long.
        self_conditioning_logits / self_conditioning_mask: as :func:`~dlmrl.models.diffusion_gemma.canvas_logits`.
    Returns:
        ``(B, L, V)`` float32 logits.
    """
    B, L = canvas.shape
    dev = canvas.device
    completion_cols = torch.arange(canvases * L, device=dev)[None, :]
    visible = torch.cat([prompt_mask.bool(), completion_cols < chosen[:, None] * L,
                         torch.ones((B, L), dtype=torch.bool, device=dev)], dim=1)  # (B, P + K·L + L)
    masks = canvas_attention_masks(model, canvas, cache, visible)
    positions = (prompt_mask.shape[1] + chosen[:, None] * L + torch.arange(L, device=dev)[None, :]).to(torch.int32)
    return canvas_logits(model, canvas, cache, masks, positions, self_conditioning_logits, self_conditioning_mask)


def uniform_sft_loss(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, clean: torch.Tensor,
                     generator: torch.Generator | None = None, eps: float = EPS,
                     self_conditioning_p: float = SELF_CONDITIONING_P,
                     encoder_loss_weight: float = ENCODER_LOSS_WEIGHT) -> tuple[torch.Tensor, dict]:
    """NeMo AutoModel's DiffusionGemma SFT loss on one batch (module docstring): one chosen canvas per example,
    uniform corruption, self-conditioning with probability ``self_conditioning_p``, flat cross-entropy plus the
    encoder's causal-LM loss.

    Args:
        model: a ``DiffusionGemmaForBlockDiffusion`` (or a wrapper of one) with ``canvas_length`` ``L``.
        prompt_ids / prompt_mask: ``(B, P)`` long / bool, left-padded.
        clean: ``(B, K·L)`` long, the completion as ``K`` whole canvases (the tail filled with EOS).
        generator: source of the canvas choice, ``t``, the corruption and the self-conditioning coins.
    Returns:
        ``(loss, parts)``: the scalar loss (nats per token, diffusion + ``encoder_loss_weight`` x AR) and the
        detached parts ``{"diffusion", "encoder_ar"}`` as floats.
    Raises:
        ValueError: ``clean``'s length is not a multiple of ``L``.
    Reference: NeMo AutoModel ``nemo_automodel/recipes/dllm/train_ft.py`` (``DiffusionGemmaSFTRecipe``),
        ``recipes/dllm/strategy.py`` (``BlockDiffusionStrategy``), ``components/datasets/dllm/corruption.py``
        (``corrupt_uniform_random``), ``components/loss/dllm_loss.py`` (``BlockDiffusionCrossEntropyLoss``,
        ``encoder_ar_loss``).
    """
    inner = unwrap_diffusion_gemma(model)
    L, V = int(inner.config.canvas_length), int(inner.config.text_config.vocab_size)
    B = prompt_ids.shape[0]
    if clean.shape[1] % L:
        raise ValueError(f"the completion ({clean.shape[1]} tokens) must be whole canvases of {L}")
    K, dev = clean.shape[1] // L, prompt_ids.device
    rand = lambda *shape: torch.rand(*shape, generator=generator).to(dev)  # (CPU draws: same on every device)

    ar_logits, cache = encode_clean(model, prompt_ids, prompt_mask, clean)
    full_ids = torch.cat([prompt_ids, clean], dim=1)
    full_mask = torch.cat([prompt_mask.bool(), torch.ones_like(clean, dtype=torch.bool)], dim=1)  # (B, P + K·L)
    pairs = full_mask[:, :-1] & full_mask[:, 1:]  # (B, P + K·L - 1)
    ar_ce = F.cross_entropy(ar_logits[:, :-1].transpose(1, 2), full_ids[:, 1:], reduction="none")
    ar_loss = (ar_ce * pairs).sum() / pairs.sum().clamp(min=1)

    # one canvas per example, drawn uniformly; corrupted at t ~ U(eps, 1) by uniform tokens
    chosen = (rand(B) * K).long().clamp(max=K - 1)  # (B,)
    cols = torch.arange(L, device=dev)
    target = clean.gather(1, chosen[:, None] * L + cols[None, :])  # (B, L)
    t = (1 - eps) * rand(B, 1) + eps
    corrupt = rand(B, L) < t
    noise = torch.randint(0, V, (B, L), generator=generator).to(dev)
    canvas = torch.where(corrupt, noise, target)
    run = lambda sc=None, sc_mask=None: chosen_canvas_logits(model, cache, prompt_mask, K, chosen, canvas, sc, sc_mask)

    with torch.no_grad():  # the first pass: no self-conditioning, always run (NeMo)
        first = run()
    coin = rand(B) < self_conditioning_p
    logits = run(self_conditioning_input(model, first.detach()), coin)
    diffusion = F.cross_entropy(logits.transpose(1, 2), target, reduction="mean")  # (every canvas position)
    loss = diffusion + encoder_loss_weight * ar_loss
    return loss, {"diffusion": float(diffusion.detach()), "encoder_ar": float(ar_loss.detach())}


def pretrain_uniform(cfg: PretrainConfig, progress: bool = True) -> dict:
    """Build the tiny DiffusionGemma from scratch, SFT it on generated Sudoku solutions, evaluate, save.

    Writes ``<output_dir>/`` atomically (config.json with ``dlmrl_kind: uniform``, generation_config.json,
    model.safetensors, tokenizer files, pretrain_config.yaml, pretrain_summary.json), replacing only an earlier
    pretrain checkpoint. Returns the summary.

    Raises:
        ConfigError: if ``output_dir`` exists, is not empty and is not a pretrain checkpoint.
    """
    from dlmrl.kinds.uniform import evaluate_uniform

    out = pretrain_output_dir(cfg)
    start = time.time()
    policy = build_sudoku_uniform_policy(cfg)
    model, tokenizer = policy.model, policy.tokenizer
    task = SudokuTask(tokenizer, tokenizer.mask_token_id, answer_mode="full",
                      min_blanks=cfg.min_blanks, max_blanks=cfg.max_blanks)
    gen = torch.Generator().manual_seed(cfg.seed)
    parts: list[dict] = []

    def batch_loss(examples):
        batch = task.encode(examples)
        loss, p = uniform_sft_loss(model, batch.prompt_ids, batch.prompt_mask, sudoku_canvases(tokenizer, task,
                                                                                             examples), gen)
        parts.append(p)
        return loss

    losses, train_s = sft_loop(model, task, cfg, batch_loss, "pretrain-uniform", progress)
    model.eval()
    eval_start = time.time()
    eval_task = SudokuTask(tokenizer, tokenizer.mask_token_id, answer_mode="full")
    metrics = evaluate_uniform(policy, eval_task, num_puzzles=cfg.eval_puzzles, steps=EVAL_STEPS, seed=cfg.seed)
    tail = parts[-20:]
    summary = {"kind": "uniform", "steps": cfg.steps, "train_seconds": round(train_s, 1),
               "eval_seconds": round(time.time() - eval_start, 1), "seconds_total": round(time.time() - start, 1),
               "final_loss": sum(losses[-20:]) / len(losses[-20:]),
               "final_diffusion_loss": sum(p["diffusion"] for p in tail) / len(tail),
               "final_encoder_ar_loss": sum(p["encoder_ar"] for p in tail) / len(tail),
               "canvas_length": CANVAS_LENGTH, "eval_greedy": metrics,
               "num_parameters": sum(p.numel() for p in model.parameters()),
               "torch_num_threads": torch.get_num_threads()}
    save_pretrain_run(out, model, tokenizer, cfg, summary)
    return summary
