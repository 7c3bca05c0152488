"""Masked-diffusion SFT of the tiny default on Sudoku solutions (``dlmrl pretrain``).

Objective (LLaDA arXiv 2502.09992, SFT eq.): the prompt is never masked; each answer token is masked
independently with probability ``t ~ U(ε, 1)``; loss = Σ_masked CE / t, divided by the number of
answer tokens. Stopping early (few steps) leaves a base model with room for RL.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import get_scheduler

from dlmrl.config import ConfigError, PretrainConfig, save_yaml
from dlmrl.data.tasks import SudokuTask
from dlmrl.evaluation.heldout import evaluate
from dlmrl.models.families import FAMILIES
from dlmrl.models.policy import MaskedDiffusionPolicy, canvas_logits
from dlmrl.models.tiny import build_tiny_model
from dlmrl.models.tokenizer import build_char_tokenizer
from dlmrl.training.checkpoint import atomic_dir


def masked_diffusion_sft_loss(policy, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                              answer_ids: torch.Tensor, answer_mask: torch.Tensor,
                              generator: torch.Generator | None = None, eps: float = 1e-3) -> torch.Tensor:
    """The 1/t-weighted masked cross-entropy of masked-diffusion SFT.

    Args:
        prompt_ids / prompt_mask: ``(B, P)`` long / bool, left-padded, never masked.
        answer_ids: ``(B, L)`` long target tokens; ``answer_mask`` ``(B, L)`` bool, which may be masked.
        generator: source of ``t`` and of the masks.
    Returns:
        scalar loss in nats per answer token (an upper bound on −log p per token, in expectation).
    Reference: LLaDA arXiv 2502.09992, Eq. (5) (SFT objective).
    """
    b, length = answer_ids.shape
    t = (1 - eps) * torch.rand(b, 1, generator=generator) + eps  # (B, 1)
    masked = (torch.rand(b, length, generator=generator) < t) & answer_mask  # (B, L)
    canvas = torch.where(masked, torch.full_like(answer_ids, policy.mask_token_id), answer_ids)
    logits = canvas_logits(policy, prompt_ids, prompt_mask, canvas)  # (B, L, V)
    ce = F.cross_entropy(logits.transpose(1, 2), answer_ids, reduction="none")  # (B, L)
    return (ce * masked / t).sum() / answer_mask.sum().clamp(min=1)


def pretrain_output_dir(cfg: PretrainConfig) -> Path:
    """``cfg.output_dir`` resolved; refuses a non-empty folder that is not a pretrain checkpoint.

    Raises:
        ConfigError: if the folder exists, is not empty and holds no ``pretrain_summary.json``.
    """
    out = Path(cfg.output_dir).resolve()
    if out.exists() and any(out.iterdir()) and not (out / "pretrain_summary.json").exists():
        # the checkpoint replaces the folder as a whole: never do that to a folder we did not write
        raise ConfigError(f"output_dir {out} exists and is not a dlmrl pretrain checkpoint; choose a new folder")
    return out


def sft_loop(model, task, cfg: PretrainConfig, batch_loss, desc: str, progress: bool) -> tuple[list[float], float]:
    """The supervised loop shared by both kinds: AdamW (weight decay 0.01), cosine schedule with warm-up,
    gradient clipping at 1.0, ``cfg.steps`` batches of ``task.train_batch(cfg.batch_size, cfg.seed, step)``.

    ``batch_loss(examples) -> loss`` is the kind's SFT loss. Returns ``(losses, train_seconds)``.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=0.01)
    sched = get_scheduler("cosine", opt, num_warmup_steps=cfg.warmup_steps, num_training_steps=cfg.steps)
    start = time.time()
    model.train()
    losses = []
    for step in tqdm(range(cfg.steps), desc=desc, disable=not progress):
        loss = batch_loss(task.train_batch(cfg.batch_size, cfg.seed, step))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses, time.time() - start


def save_pretrain_run(out: Path, model, tokenizer, cfg: PretrainConfig, summary: dict) -> None:
    """Write the model, tokenizer, config and summary to ``out`` atomically (replacing it as a whole); the model's
    ``config.json`` records its policy kind (``dlmrl_kind``, ``cfg.kind``) for the loaders."""
    from dlmrl.models.checkpoint_keys import KIND_KEY

    setattr(model.config, KIND_KEY, cfg.kind)
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        save_yaml(cfg, tmp / "pretrain_config.yaml")
        (tmp / "pretrain_summary.json").write_text(json.dumps(summary, indent=2))


def fresh_tiny_policy(cfg: PretrainConfig) -> MaskedDiffusionPolicy:
    """A freshly initialised tiny denoiser of ``cfg``'s size (seeded by ``cfg.seed``) over the character tokenizer,
    as a ``tiny``-family policy."""
    torch.manual_seed(cfg.seed)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(len(tokenizer), cfg.hidden_size, cfg.num_layers, cfg.num_heads,
                             cfg.intermediate_size, seed=cfg.seed)
    return MaskedDiffusionPolicy(model, tokenizer, tokenizer.mask_token_id, "tiny", FAMILIES.get("tiny").logits,
                                 tokenizer.eos_token_id, tokenizer.pad_token_id)


def pretrain(cfg: PretrainConfig, progress: bool = True) -> dict:
    """Build the tiny default from scratch, SFT it on generated Sudoku solutions, evaluate, save.

    Writes ``<output_dir>/`` (config.json, model.safetensors, tokenizer files, pretrain_summary.json)
    atomically, replacing an earlier pretrain checkpoint there. Returns the summary.

    Raises:
        ConfigError: if ``output_dir`` exists, is not empty and is not a pretrain checkpoint.
    """
    out = pretrain_output_dir(cfg)
    policy = fresh_tiny_policy(cfg)
    model, tokenizer = policy.model, policy.tokenizer
    task = SudokuTask(tokenizer, tokenizer.mask_token_id, answer_mode="full",
                      min_blanks=cfg.min_blanks, max_blanks=cfg.max_blanks)
    gen = torch.Generator().manual_seed(cfg.seed)
    answer_ids = lambda exs: torch.tensor(
        [tokenizer.convert_tokens_to_ids(list(task.sft_answer(e))) for e in exs])

    def batch_loss(examples):
        batch = task.encode(examples)
        targets = answer_ids(examples)
        return masked_diffusion_sft_loss(policy, batch.prompt_ids, batch.prompt_mask, targets,
                                         torch.ones_like(targets, dtype=torch.bool), gen)

    losses, train_s = sft_loop(model, task, cfg, batch_loss, "pretrain", progress)
    eval_task = SudokuTask(tokenizer, tokenizer.mask_token_id, answer_mode="infill")
    metrics = evaluate(policy, eval_task, num_puzzles=cfg.eval_puzzles)
    summary = {"steps": cfg.steps, "train_seconds": round(train_s, 1), "final_loss": sum(losses[-20:]) / len(losses[-20:]),
               "eval_infill": metrics,
               "num_parameters": sum(p.numel() for p in model.parameters())}
    save_pretrain_run(out, model, tokenizer, cfg, summary)
    return summary
