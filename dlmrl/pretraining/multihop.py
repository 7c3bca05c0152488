"""Stage-1 SFT of a tiny model on the scripted agent's tool-use traces (``dlmrl pretrain task=multihop``).

MTR (arXiv 2510.06825) fine-tunes on complete think-act-observe traces before its GRPO stage; here the traces are
the rule-based agent's (:mod:`dlmrl.envs.tools.agent`) on the training questions of the ``multihop`` task
(:mod:`dlmrl.data.multihop_task`, ``task_options`` are its settings), so no test entity is ever seen. The SFT
pairs are a mixture of ``sft_forms`` drawn in turn (``trace``: the question and the whole trace, which is also
what the ReAct episodes' prompts continue; ``memory`` / ``react``: one pair per turn of an episode in that context
mode), each completion followed by EOS. Batches are a function of ``(seed, step)``.

- ``kind: ar``: a causal Llama (:func:`~dlmrl.models.ar.build_tiny_causal_model`, 1024 positions), next-token
  loss on the completion tokens (:func:`~dlmrl.pretraining.ar.ar_sft_loss`); evaluated at the end on the
  held-out questions by greedy episodes in both context modes
  (:func:`~dlmrl.evaluation.heldout.evaluate_task_episodes`): EM and tool-call validity.
- ``kind: diffusion``: the bidirectional tiny model, masked-diffusion SFT (LLaDA arXiv 2502.09992) on a canvas of
  the completion then EOS up to the longest completion of the batch (LLaDA pads answers with EOS and trains on
  them); evaluated by one single-sequence decode per held-out question (``eval_mode: sequence``: the model's own
  observations, re-simulated by the reward) **(dlmrl interpretation)**.

The tokenizer is :func:`~dlmrl.data.multihop_task.multihop_tokenizer` (the traces' pieces over a character
fallback; the Sudoku alphabet's ids kept). Stopping
early (few ``steps``) leaves a base imperfect enough for RL.
"""

from __future__ import annotations

import dataclasses
import random
import time

import torch

from dlmrl.config import ConfigError, PretrainConfig
from dlmrl.config.overrides import part_options
from dlmrl.data.encoding import encode_prompts
from dlmrl.data.multihop_task import MultiHopOptions, MultiHopTask, multihop_tokenizer
from dlmrl.envs.tools.agent import FORMS, sft_pairs
from dlmrl.evaluation.heldout import evaluate, evaluate_task_episodes
from dlmrl.kinds import kind_of
from dlmrl.models.ar import AutoregressivePolicy, build_tiny_causal_model
from dlmrl.pretraining.ar import ar_sft_loss
from dlmrl.pretraining.loop import (
    masked_diffusion_sft_loss,
    pretrain_output_dir,
    save_pretrain_run,
    sft_loop,
)

__all__ = ["MAX_POSITIONS", "SFTPairs", "completion_targets", "multihop_options", "pretrain_multihop", "sft_forms"]

MAX_POSITIONS = 1024  # a ReAct prompt plus a whole trace (under 300 tokens) fits with room


def multihop_options(cfg: PretrainConfig) -> MultiHopOptions:
    """The task settings of ``cfg.task_options`` (``ConfigError`` naming ``task_options.<field>``)."""
    return MultiHopOptions(**part_options(MultiHopOptions, cfg.task_options, "task_options"))


def sft_forms(cfg: PretrainConfig) -> tuple[str, ...]:
    """The forms ``cfg.sft_forms`` names (``ConfigError`` naming ``sft_forms`` for an unknown one or none)."""
    forms = tuple(f.strip() for f in cfg.sft_forms.split(",") if f.strip())
    bad = [f for f in forms if f not in FORMS]
    if not forms or bad:
        raise ConfigError(f"config key 'sft_forms': {cfg.sft_forms!r}; give a comma list of {', '.join(FORMS)}")
    return forms


class SFTPairs:
    """The SFT pairs of each form, batched as :func:`~dlmrl.pretraining.loop.sft_loop` reads a task.

    Args:
        pairs: form -> ``(prompt, completion)`` texts.
    """

    def __init__(self, pairs: dict[str, list[tuple[str, str]]]):
        self.pairs = {f: p for f, p in pairs.items() if p}
        if not self.pairs:
            raise ValueError("no SFT pairs (the multihop task has no training questions)")
        self.forms = tuple(self.pairs)

    def train_batch(self, n: int, seed: int, step: int) -> list[tuple[str, str]]:
        """``n`` pairs of ``step``: example ``k`` from form ``k mod |forms|``, uniform within it (``(seed, step)``)."""
        rng = random.Random(f"{seed}-sft-{step}")
        return [rng.choice(self.pairs[self.forms[k % len(self.forms)]]) for k in range(n)]


def completion_targets(tokenizer, completions: list[str],
                       width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Completion tokens then EOS: ``(B, W)`` long (``W`` the longest, or ``width``; EOS-padded) and ``(B, W)``
    bool, True on the completion and its first EOS."""
    eos = tokenizer.eos_token_id
    rows = [tokenizer(c, add_special_tokens=False)["input_ids"] + [eos] for c in completions]
    w = width or max(len(r) for r in rows)
    ids = torch.full((len(rows), w), eos, dtype=torch.long)
    mask = torch.zeros((len(rows), w), dtype=torch.bool)
    for i, r in enumerate(rows):
        r = r[:w]
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    return ids, mask


def pretrain_multihop(cfg: PretrainConfig, progress: bool = True) -> dict:
    """Build a tiny model of ``cfg.kind`` from scratch, SFT it on scripted traces, evaluate, save (module docstring).

    Writes ``<output_dir>/`` as :func:`~dlmrl.pretraining.loop.pretrain` does. Returns the summary.

    Raises:
        ConfigError: a bad ``task_options`` entry or ``sft_forms``; ``output_dir`` not a pretrain checkpoint.
    """
    out = pretrain_output_dir(cfg)
    options, forms = multihop_options(cfg), sft_forms(cfg)
    torch.manual_seed(cfg.seed)
    tokenizer = multihop_tokenizer()
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    ar = kind_of(cfg.kind).autoregressive  # (a causal model, next-token SFT; else bidirectional, masked)
    if ar:
        model = build_tiny_causal_model(len(tokenizer), cfg.hidden_size, cfg.num_layers, cfg.num_heads,
                                        cfg.intermediate_size, MAX_POSITIONS, cfg.seed, tokenizer.bos_token_id, eos, pad)
        policy = AutoregressivePolicy(model, tokenizer, eos_token_id=eos, pad_token_id=pad)
    else:
        from dlmrl.models.families import FAMILIES
        from dlmrl.models.policy import MaskedDiffusionPolicy
        from dlmrl.models.tiny import build_tiny_model

        model = build_tiny_model(len(tokenizer), cfg.hidden_size, cfg.num_layers, cfg.num_heads,
                                 cfg.intermediate_size, MAX_POSITIONS, cfg.seed)
        policy = MaskedDiffusionPolicy(model, tokenizer, tokenizer.mask_token_id, "tiny", FAMILIES.get("tiny").logits,
                                       eos, pad)
    try:
        task = MultiHopTask(tokenizer, None if ar else tokenizer.mask_token_id, options=options)
    except ValueError as e:
        raise ConfigError(str(e).replace("task.options.", "task_options.")) from None
    pairs = SFTPairs({f: sft_pairs(task.train_examples, task.simulator, f, max(options.max_turns, 4)) for f in forms})
    gen = torch.Generator().manual_seed(cfg.seed)

    def batch_loss(batch: list[tuple[str, str]]):
        prompt_ids, prompt_mask = encode_prompts(tokenizer, [p for p, _ in batch])  # (B, P)
        targets, mask = completion_targets(tokenizer, [c for _, c in batch])  # (B, W)
        if ar:
            return ar_sft_loss(policy, prompt_ids, prompt_mask, targets, mask)
        return masked_diffusion_sft_loss(policy, prompt_ids, prompt_mask, targets, torch.ones_like(mask), gen)

    start = time.time()
    losses, train_s = sft_loop(model, pairs, cfg, batch_loss, f"pretrain-multihop-{cfg.kind}", progress)
    model.eval()
    n_eval = cfg.eval_puzzles if cfg.eval_puzzles < len(task.test_examples) else 0
    if ar:
        held_out = {mode: _strip(evaluate_task_episodes(policy, task.in_context(mode), n_eval))
                    for mode in ("react", "memory")}
    else:
        seq = MultiHopTask(tokenizer, tokenizer.mask_token_id, options=dataclasses.replace(options, eval_mode="sequence"))
        longest = completion_targets(tokenizer, [c for _, c in pairs.pairs[forms[0]]])[0].shape[1]
        seq.gen_length = width = 32 * -(-longest // 32)
        # (semi-autoregressive blocks of 32, two tokens revealed per step)
        held_out = {"sequence": _strip(evaluate(policy, seq, num_puzzles=n_eval, steps=width // 2, block_length=32))}
    tail = losses[-20:]
    summary = {"kind": cfg.kind, "task": "multihop", "steps": cfg.steps, "train_seconds": round(train_s, 1),
               "seconds_total": round(time.time() - start, 1), "final_loss": sum(tail) / len(tail),
               "sft_forms": list(forms), "sft_pairs": {f: len(p) for f, p in pairs.pairs.items()},
               "train_questions": len(task.train_examples), "test_questions": len(task.test_examples),
               "eval_held_out": held_out, "num_parameters": sum(p.numel() for p in model.parameters()),
               "torch_num_threads": torch.get_num_threads()}
    save_pretrain_run(out, model, tokenizer, cfg, summary)
    return summary


def _strip(metrics: dict) -> dict:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}
