"""Block-diffusion SFT of the tiny block model on Sudoku solutions (the base of ``model.kind: block``).

The block counterpart of :mod:`dlmrl.pretraining.loop` and :mod:`dlmrl.pretraining.ar`: the same config
fields, the same generated puzzles (batches a function of ``(seed, step)``), a Llama of the same size, the same
character tokenizer, and d1's full format as the AR baseline writes it: prompt ``[BOS] puzzle =``, completion = the
16 solution cells (no EOS: the canvas has a fixed length).

The loss is the block ELBO of BD3-LM, one composite pass per batch: every block ``b`` of every row gets its own time
``t_b ~ U(ε, 1)`` and each of its positions is masked with probability ``t_b``; the noisy copy is scored next to
the clean completion (:func:`~dlmrl.estimators.block_composite.composite_logits`) and the loss is
``Σ_b (1/t_b) Σ_{i∈b masked} CE_i`` per completion token. The block size of each batch is drawn from
``block_sizes`` (default 1, 2, 4, 8, 16), so one set of weights serves every block size (**dlmrl
interpretation**: SDAR and TraDo train one block size per model; a mixture makes the block-size sweep compare block
sizes on identical weights). Held-out evaluation decodes greedily at each block size with 16 steps (one token per
step).

Run it with ``dlmrl pretrain --config configs/pretrain_tiny_sudoku_block.yaml`` (``kind: block``) or
``scripts/build_tiny_block_default.sh``.

Reference: BD3-LM arXiv 2503.09573 (block ELBO, vectorised training); SDAR arXiv 2510.06303.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlmrl.config import PretrainConfig
from dlmrl.config.schema import parse_block_sizes
from dlmrl.data.tasks import SudokuTask
from dlmrl.estimators.block_composite import composite_logits
from dlmrl.evaluation.heldout import evaluate
from dlmrl.models.block_attention import block_bounds
from dlmrl.models.block_policy import BlockDiffusionPolicy, block_policy_from
from dlmrl.models.families import FAMILIES
from dlmrl.pretraining.loop import fresh_tiny_policy, pretrain_output_dir, save_pretrain_run, sft_loop

#: the block size recorded in the shipped model's config.json (``model.block_size: null`` reads it)
DEFAULT_BLOCK_SIZE = 4


def block_sft_loss(policy: BlockDiffusionPolicy, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                   answer_ids: torch.Tensor, generator: torch.Generator | None = None,
                   eps: float = 1e-3) -> torch.Tensor:
    """The block ELBO's masked cross-entropy, every block noised at its own time, one composite pass.

    Args:
        policy: the block-diffusion policy (its ``block_size`` sets the blocks).
        prompt_ids / prompt_mask: ``(B, P)`` long / bool, left-padded, never masked.
        answer_ids: ``(B, L)`` long, the clean completions (every position in the loss).
        generator: source of the times and masks.
    Returns:
        scalar, nats per completion token (an upper bound on ``−log p(y) / L`` in expectation).
    Reference: BD3-LM arXiv 2503.09573 Eq. (5)-(6) (block ELBO with the linear schedule, ``1/t`` weight).
    """
    b, length = answer_ids.shape
    t = torch.empty(b, length)
    for lo, hi in block_bounds(length, policy.block_size):  # (one time per row and block)
        t[:, lo:hi] = (1 - eps) * torch.rand(b, 1, generator=generator) + eps
    masked = torch.rand(b, length, generator=generator) < t  # (B, L)
    noisy = torch.where(masked, torch.full_like(answer_ids, policy.mask_token_id), answer_ids)
    logits = composite_logits(policy.model_fn, prompt_ids, prompt_mask, noisy, answer_ids, policy.block_size)
    ce = F.cross_entropy(logits.transpose(1, 2), answer_ids, reduction="none")  # (B, L)
    return (ce * masked / t).sum() / (b * length)


def pretrain_block(cfg: PretrainConfig, progress: bool = True) -> dict:
    """Build the tiny block model from scratch, SFT it on generated Sudoku solutions, evaluate each block size, save.

    Writes ``<output_dir>/`` atomically (config.json with ``block_size`` and ``block_sizes``, model.safetensors,
    tokenizer files, pretrain_config.yaml, pretrain_summary.json), replacing only an earlier pretrain checkpoint.

    Raises:
        ConfigError: if ``output_dir`` exists, is not empty and is not a pretrain checkpoint.
        ValueError: bad ``block_sizes``.
    """
    sizes = parse_block_sizes(cfg.block_sizes)
    out = pretrain_output_dir(cfg)
    base = fresh_tiny_policy(cfg)
    model, tokenizer = base.model, base.tokenizer

    def policy_of(block_size: int) -> BlockDiffusionPolicy:
        return block_policy_from(base, block_size, FAMILIES.get("tiny").block_forward)

    task = SudokuTask(tokenizer, tokenizer.mask_token_id, answer_mode="full",
                      min_blanks=cfg.min_blanks, max_blanks=cfg.max_blanks)
    gen = torch.Generator().manual_seed(cfg.seed)

    def batch_loss(examples):
        batch = task.encode(examples)
        targets = torch.tensor([tokenizer.convert_tokens_to_ids(list(task.sft_answer(e))) for e in examples])
        block_size = sizes[int(torch.randint(len(sizes), (1,), generator=gen))]
        return block_sft_loss(policy_of(block_size), batch.prompt_ids, batch.prompt_mask, targets, gen)

    losses, train_s = sft_loop(model, task, cfg, batch_loss, "pretrain-block", progress)
    eval_task = SudokuTask(tokenizer, tokenizer.mask_token_id, answer_mode="full")
    metrics = {str(b): evaluate(policy_of(b), eval_task, num_puzzles=cfg.eval_puzzles, steps=task.gen_length)
               for b in sizes if b <= task.gen_length}
    model.config.block_size = DEFAULT_BLOCK_SIZE if DEFAULT_BLOCK_SIZE in sizes else sizes[0]
    model.config.block_sizes = sizes
    tail = losses[-20:]
    summary = {"kind": "block", "steps": cfg.steps, "train_seconds": round(train_s, 1),
               "final_loss": sum(tail) / len(tail), "block_sizes": sizes, "eval_greedy_by_block_size": metrics,
               "num_parameters": sum(p.numel() for p in model.parameters()),
               "torch_num_threads": torch.get_num_threads()}
    save_pretrain_run(out, model, tokenizer, cfg, summary)
    return summary


__all__ = ["block_sft_loss", "parse_block_sizes", "pretrain_block"]
