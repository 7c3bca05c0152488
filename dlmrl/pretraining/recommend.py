"""SFT of a tiny causal model on the recommendation task (``dlmrl pretrain task=recommend``).

GREAM (arXiv 2510.20815) fine-tunes its base on the recommendation data in both inference modes before SRPO; here
the SFT pairs are the training users of the ``recommend`` task (:mod:`dlmrl.data.recommend_task`,
``task_options`` are its settings): prompt the user's history, completion the reference answer then EOS, in the
modes ``sft_forms`` names (``direct``: the next item's semantic ID; ``reasoning``: the reasoning chain, then
it), drawn in turn. Batches are a function of ``(seed, step)``; no held-out user is seen.

The model is a causal Llama (:func:`~dlmrl.models.ar.build_tiny_causal_model`, :data:`MAX_POSITIONS` positions)
over :func:`~dlmrl.data.recommend_task.recommend_tokenizer`, trained by next-token loss on the completion tokens
(:func:`~dlmrl.pretraining.ar.ar_sft_loss`), then evaluated on the held-out users in each mode
(:func:`~dlmrl.evaluation.heldout.evaluate_ranking`: greedy exact match, Recall@K and NDCG@K from the constrained
beam search). Stopping early leaves a base imperfect enough for RL.
"""

from __future__ import annotations

import time

import torch

from dlmrl.config import ConfigError, PretrainConfig
from dlmrl.config.overrides import part_options
from dlmrl.data.encoding import encode_prompts
from dlmrl.data.recommend_task import (
    MODES,
    RecommendOptions,
    RecommendTask,
    check_recommend_options,
    recommend_tokenizer,
)
from dlmrl.errors import OptionError
from dlmrl.evaluation.heldout import evaluate_ranking
from dlmrl.kinds import KINDS, kind_of
from dlmrl.models.ar import AutoregressivePolicy, build_tiny_causal_model
from dlmrl.pretraining.ar import ar_sft_loss
from dlmrl.pretraining.loop import pretrain_output_dir, save_pretrain_run, sft_loop
from dlmrl.pretraining.multihop import SFTPairs, completion_targets

__all__ = ["MAX_POSITIONS", "pretrain_recommend", "recommend_modes", "recommend_options"]

MAX_POSITIONS = 256  # a history of 6 items is about 35 prompt tokens, a reasoning completion about 20


def recommend_options(cfg: PretrainConfig) -> RecommendOptions:
    """The task settings of ``cfg.task_options`` (``ConfigError`` naming ``task_options.<field>``)."""
    options = RecommendOptions(**part_options(RecommendOptions, cfg.task_options, "task_options"))
    try:
        check_recommend_options(options)
        return options
    except OptionError as e:
        raise ConfigError(f"config key 'task_options.{e.field}': {e}") from None


def recommend_modes(cfg: PretrainConfig) -> tuple[str, ...]:
    """The modes ``cfg.sft_forms`` names (``ConfigError`` naming ``sft_forms`` for an unknown one or none)."""
    forms = tuple(f.strip() for f in cfg.sft_forms.split(",") if f.strip())
    if not forms or any(f not in MODES for f in forms):
        raise ConfigError(f"config key 'sft_forms': {cfg.sft_forms!r}; the recommend pretraining takes a comma list "
                          f"of {', '.join(MODES)}")
    return forms


def pretrain_recommend(cfg: PretrainConfig, progress: bool = True) -> dict:
    """Build a tiny causal model from scratch, SFT it on the recommendation pairs, evaluate, save (module docstring).

    Writes ``<output_dir>/`` as :func:`~dlmrl.pretraining.loop.pretrain` does. Returns the summary.

    Raises:
        ConfigError: ``kind`` not ``ar``; a bad ``task_options`` entry or ``sft_forms``; ``output_dir`` not a
            pretrain checkpoint.
    """
    if cfg.kind not in KINDS or not kind_of(cfg.kind).autoregressive:
        raise ConfigError(f"config key 'kind': the recommend pretraining builds a causal model (kind: ar), got "
                          f"{cfg.kind!r}")
    options, modes = recommend_options(cfg), recommend_modes(cfg)
    out = pretrain_output_dir(cfg)
    torch.manual_seed(cfg.seed)
    tokenizer = recommend_tokenizer()
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    model = build_tiny_causal_model(len(tokenizer), cfg.hidden_size, cfg.num_layers, cfg.num_heads,
                                    cfg.intermediate_size, MAX_POSITIONS, cfg.seed, tokenizer.bos_token_id, eos, pad)
    policy = AutoregressivePolicy(model, tokenizer, eos_token_id=eos, pad_token_id=pad)
    tasks = {m: RecommendTask(tokenizer, None, options, mode=m) for m in modes}
    pairs = SFTPairs({m: [(t.prompt_text(e), t.completion_text(e)) for e in t.train_examples]
                      for m, t in tasks.items()})

    def batch_loss(batch: list[tuple[str, str]]):
        prompt_ids, prompt_mask = encode_prompts(tokenizer, [p for p, _ in batch])  # (B, P)
        targets, mask = completion_targets(tokenizer, [c for _, c in batch])  # (B, W)
        return ar_sft_loss(policy, prompt_ids, prompt_mask, targets, mask)

    start = time.time()
    losses, train_s = sft_loop(model, pairs, cfg, batch_loss, "pretrain-recommend-ar", progress)
    model.eval()
    n_eval = min(cfg.eval_puzzles, options.n_test)
    held_out = {m: {k: round(v, 4) if isinstance(v, float) else v
                    for k, v in evaluate_ranking(policy, t, n_eval).items()} for m, t in tasks.items()}
    tail = losses[-20:]
    summary = {"kind": "ar", "task": "recommend", "steps": cfg.steps, "train_seconds": round(train_s, 1),
               "seconds_total": round(time.time() - start, 1), "final_loss": sum(tail) / len(tail),
               "sft_forms": list(modes), "train_users": options.n_train, "test_users": options.n_test,
               "items": len(next(iter(tasks.values())).sids), "eval_held_out": held_out,
               "num_parameters": sum(p.numel() for p in model.parameters()),
               "torch_num_threads": torch.get_num_threads()}
    save_pretrain_run(out, model, tokenizer, cfg, summary)
    return summary
