"""Next-token SFT of the tiny autoregressive default on Sudoku solutions (the AR baseline's base model).

The AR counterpart of :mod:`dlmrl.pretraining.loop`: the same config fields, the same generated
puzzles (training grids, ``min_blanks..max_blanks`` blanks, batches a function of ``(seed, step)``),
a causal Llama of the same size class and the same character tokenizer. The target is d1's full
format: prompt ``[BOS] puzzle =``, completion = the 16 solution cells left to right, then EOS; the
loss is the mean negative log-likelihood of those 17 tokens. Held-out evaluation decodes the shipped
test split greedily and scores cell accuracy over the blanks (:func:`evaluate_ar`).

Run it with ``python -m dlmrl.pretraining.ar --config configs/pretrain_tiny_sudoku_ar.yaml
--output-dir DIR [key=value ...]`` (or ``scripts/build_tiny_ar_default.sh``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

from dlmrl.config import (
    ConfigError,
    PretrainConfig,
    apply_overrides,
    doc,
    load_yaml,
    locate_error,
    validate_pretrain,
)
from dlmrl.data.tasks import SudokuTask
from dlmrl.evaluation.heldout import evaluate_ar  # (re-exported: it lived here first)
from dlmrl.kinds import KINDS, kind_of
from dlmrl.models.ar import AutoregressivePolicy, build_tiny_causal_model
from dlmrl.models.tokenizer import build_char_tokenizer
from dlmrl.pretraining.loop import pretrain_output_dir, save_pretrain_run, sft_loop


@dataclasses.dataclass
class ARPretrainConfig(PretrainConfig):
    """``PretrainConfig`` with ``kind: ar`` by default (``dlmrl pretrain kind=ar`` uses ``PretrainConfig`` itself).

    ``eval_puzzles`` are decoded greedily, left to right (16 cells + EOS).
    """

    kind: str = doc("ar", "Model kind to pretrain: 'ar' (causal LM, next-token SFT) is the only kind here.")


def ar_sft_loss(policy: AutoregressivePolicy, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                target_ids: torch.Tensor, target_mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood per target token (teacher forcing).

    Args:
        prompt_ids / prompt_mask: ``(B, P)`` long / bool, left-padded.
        target_ids: ``(B, L)`` long; ``target_mask`` ``(B, L)`` bool, the tokens in the loss.
    Returns:
        scalar, nats per target token.
    """
    logp, _ = policy.token_logprobs(prompt_ids, prompt_mask, target_ids, target_mask)  # (B, L)
    return -logp.sum() / target_mask.sum().clamp(min=1)


def sft_targets(task: SudokuTask, examples, eos_token_id: int) -> torch.Tensor:
    """``(B, 17)`` long: each example's 16 solution cells then EOS."""
    tok = task.tokenizer
    return torch.tensor([tok.convert_tokens_to_ids(list(task.sft_answer(e))) + [eos_token_id] for e in examples])


def pretrain_ar(cfg: PretrainConfig, progress: bool = True) -> dict:
    """Build the tiny causal default from scratch, SFT it on generated Sudoku solutions, evaluate, save.

    ``cfg`` is a :class:`ARPretrainConfig` (or any ``PretrainConfig``: its fields mean the same here).
    Writes ``<output_dir>/`` (config.json, generation_config.json, model.safetensors, tokenizer files,
    pretrain_config.yaml, pretrain_summary.json) atomically, replacing only an earlier pretrain
    checkpoint there. Returns the summary.

    Raises:
        ConfigError: if ``output_dir`` exists, is not empty and is not a pretrain checkpoint.
    """
    out = pretrain_output_dir(cfg)
    torch.manual_seed(cfg.seed)
    tokenizer = build_char_tokenizer()
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    model = build_tiny_causal_model(len(tokenizer), cfg.hidden_size, cfg.num_layers, cfg.num_heads,
                                    cfg.intermediate_size, seed=cfg.seed, bos_token_id=tokenizer.bos_token_id,
                                    eos_token_id=eos, pad_token_id=pad)
    policy = AutoregressivePolicy(model, tokenizer, eos_token_id=eos, pad_token_id=pad)
    task = SudokuTask(tokenizer, tokenizer.mask_token_id, answer_mode="full",
                      min_blanks=cfg.min_blanks, max_blanks=cfg.max_blanks)

    def batch_loss(examples):
        batch = task.encode(examples)
        targets = sft_targets(task, examples, eos)  # (B, 17)
        return ar_sft_loss(policy, batch.prompt_ids, batch.prompt_mask, targets,
                           torch.ones_like(targets, dtype=torch.bool))

    losses, train_s = sft_loop(model, task, cfg, batch_loss, "pretrain-ar", progress)
    metrics = evaluate_ar(policy, task, num_puzzles=cfg.eval_puzzles)
    tail = losses[-20:]
    summary = {"kind": "ar", "steps": cfg.steps, "train_seconds": round(train_s, 1),
               "final_loss": sum(tail) / len(tail), "eval_greedy": metrics,
               "num_parameters": sum(p.numel() for p in model.parameters()),
               "torch_num_threads": torch.get_num_threads()}
    save_pretrain_run(out, model, tokenizer, cfg, summary)
    return summary


def load_ar_pretrain_config(config: str | None = None, overrides: list[str] | tuple[str, ...] = (),
                            output_dir: str | None = None) -> ARPretrainConfig:
    """An :class:`ARPretrainConfig` from an optional YAML file, ``key=value`` overrides and an output folder.

    Raises:
        ConfigError: an unknown key, a bad value, or ``kind`` other than ``ar`` (naming the file and line).
    """
    cfg = ARPretrainConfig()
    try:
        if config:
            load_yaml(cfg, config)
        apply_overrides(cfg, list(overrides))
        if output_dir:
            cfg.output_dir = output_dir
        validate_pretrain(cfg)
        if cfg.kind not in KINDS or not kind_of(cfg.kind).autoregressive:
            raise ConfigError(f"config key 'kind' must be 'ar' for the AR pretraining, got {cfg.kind!r}")
    except ConfigError as e:
        raise locate_error(e, config) from None
    return cfg


def main(argv: list[str] | None = None) -> int:
    """``python -m dlmrl.pretraining.ar [--config FILE] [--output-dir DIR] [key=value ...]``."""
    parser = argparse.ArgumentParser(prog="python -m dlmrl.pretraining.ar", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="YAML config (e.g. configs/pretrain_tiny_sudoku_ar.yaml)")
    parser.add_argument("--output-dir", help="where the checkpoint is written (overrides output_dir)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_args(argv)
    try:
        cfg = load_ar_pretrain_config(args.config, args.overrides, args.output_dir)
        print(json.dumps(pretrain_ar(cfg, progress=not args.no_progress), indent=2))
    except ConfigError as e:
        print(f"pretrain_ar: config error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
