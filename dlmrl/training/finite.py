"""The non-finite guard: a training step whose rewards, loss, gradient norm or weights are not finite stops the run
before its checkpoint is written, naming what went non-finite, so the checkpoints on disk stay the last finite ones
(``--resume`` continues from the newest).

Without it a NaN spreads silently: a NaN loss makes NaN gradients, the optimizer writes NaN weights, every later
rollout decodes garbage with reward 0 and nothing to learn from, and the run ends with exit 0.

What counts (our rule): the step's rewards when *every* one is missing or non-finite (every reward function
returned ``None`` or a non-finite value for every completion, or the task's own rewards are all non-finite: a
reward function that fails on some rows is handled by the reward functions themselves), a non-finite loss or
gradient norm of any of its optimizer updates, or a non-finite entry in any trainable or frozen parameter after them.
"""

from __future__ import annotations

import math

import torch


def json_ready(obj):
    """``obj`` with every non-finite float (NaN, ``inf``, ``-inf``, also as a 0-d tensor or numpy scalar) replaced
    by ``None``, in nested dicts, lists and tuples: JSON has no such numbers (Python's ``json`` writes ``NaN`` and
    ``Infinity``, which other readers refuse), so every JSON file a run writes holds ``null`` there instead."""
    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


class NonFiniteError(RuntimeError):
    """A training step went non-finite; the message names the step and what (the run stops before its checkpoint)."""


def reward_problem(rewards: torch.Tensor, reward_parts: torch.Tensor | None) -> str | None:
    """``"every reward ..."`` when no completion of the step got a finite reward, else ``None``.

    Args:
        rewards: ``(N,)`` float the step's combined rewards of every sampled completion.
        reward_parts: ``(N, F)`` float each reward function's values (NaN: ``None`` or non-finite), or ``None``
            when the task has no reward functions.
    """
    if not len(rewards):
        return None
    if reward_parts is not None and reward_parts.numel() and bool(torch.isnan(reward_parts).all()):
        return (f"every reward is missing: all {len(rewards)} completions got None or a non-finite value from every "
                "reward function")
    if not bool(torch.isfinite(rewards).any()):
        return f"every reward is non-finite ({len(rewards)} completions, e.g. {rewards[0].item()})"
    return None


def update_problem(logs: list[dict]) -> str | None:
    """The first optimizer update whose ``loss`` or ``grad_norm`` is non-finite (``"the loss of update j is nan"``),
    else ``None``. ``logs``: one metrics dict per update (a ``grad_norm`` only when gradients are clipped)."""
    for j, m in enumerate(logs, start=1):
        for key in ("loss", "grad_norm"):
            value = m.get(key)
            if isinstance(value, (int, float)) and not math.isfinite(value):
                what = "loss" if key == "loss" else "gradient norm"
                return f"the {what} of optimizer update {j} of {len(logs)} is {value}"
    return None


@torch.no_grad()
def weight_problem(model: torch.nn.Module) -> str | None:
    """``"parameter <name> has N non-finite entries"`` for the first parameter holding a NaN or an infinity, else
    ``None``. One pass over the parameters this process holds (a shard of them under sharding)."""
    for name, p in model.named_parameters():
        t = p.detach()
        # (a sharded parameter: its local shard, with no collective, so a process may stop at its first finding)
        finite = torch.isfinite(t.to_local() if hasattr(t, "to_local") else t)
        if not bool(finite.all()):
            return f"parameter {name} has {int((~finite).sum())} non-finite entries of {p.numel()}"
    return None


def step_problem(rewards: torch.Tensor, reward_parts: torch.Tensor | None, logs: list[dict],
                 model: torch.nn.Module) -> str | None:
    """What went non-finite in a training step (:func:`reward_problem`, :func:`update_problem`,
    :func:`weight_problem`, in that order), else ``None``."""
    return reward_problem(rewards, reward_parts) or update_problem(logs) or weight_problem(model)
