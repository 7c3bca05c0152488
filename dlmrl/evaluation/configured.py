"""Held-out evaluation with a config's settings: the ``eval`` section (or its ``eval.preset``), the task's own
evaluation mode (episodes, ranking) or the policy kind's decoding (:meth:`dlmrl.kinds.base.PolicyKind.evaluate`),
and the record of what produced the figures (:func:`dlmrl.evaluation.record.eval_record`)."""

from __future__ import annotations

from dlmrl.evaluation.heldout import (
    check_held_out_size,
    evaluate_ranking,
    evaluate_task_episodes,
)
from dlmrl.kinds import kind_of

__all__ = ["evaluate_with_config"]


def evaluate_with_config(cfg, policy, task, gen_length: int | None = None, trained_steps: int | None = None) -> dict:
    """Held-out evaluation with config ``cfg``'s settings (:func:`~dlmrl.evaluation.presets.eval_settings`: its
    ``eval.preset``'s, else the ``eval`` section's) at ``gen_length`` (default ``sampling.gen_length``; a text task
    is decoded at that length), with the result's ``record`` (:func:`~dlmrl.evaluation.record.eval_record`).
    AR policies decode left to right (steps and block length unused). ``trained_steps``: inside a training run,
    the steps the policy has been trained so far (the record's ``model.trained_steps``, so that a figure before
    training and one after it do not share a hash)."""
    from dlmrl.evaluation.presets import eval_settings
    from dlmrl.evaluation.record import eval_record

    settings = eval_settings(cfg, gen_length)
    if gen_length is not None:
        task.gen_length = gen_length
    s, kind = settings, kind_of(cfg.model.kind)
    check_held_out_size(task, s.num_puzzles)  # (a ConfigError naming the key, not the task's bare ValueError)
    if getattr(task, "evaluates_episodes", False):  # (a task whose answers need its environment: multihop)
        result = evaluate_task_episodes(policy, task, num_puzzles=s.num_puzzles, batch_size=s.batch_size)
    elif getattr(task, "evaluates_ranking", False):  # (recommend: a beam search over the catalogue; AR only)
        result = evaluate_ranking(policy, task, num_puzzles=s.num_puzzles, batch_size=s.batch_size)
    else:  # (the kind's own decoding: the diffusion sampler, block_generate, left-to-right generate)
        result = kind.evaluate(policy, task, s)
    recorded = settings.as_dict()
    recorded["gen_length"] = getattr(task, "gen_length", recorded["gen_length"])  # (the canvas decoded)
    return {**result, "record": eval_record(cfg, policy, recorded, trained_steps, kind)}
