"""DAPO's dynamic sampling (arXiv 2503.14476 §3.2): groups whose rewards are all equal carry no signal and are
dropped; new prompts, none drawn before in the step, are sampled for at most ``dynamic_sampling_max_rounds``
extra rounds until the batch holds ``prompts_per_step`` informative groups."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dlmrl.training.rollout import Rollout

#: seed stride of DAPO's extra rounds: round r of a step draws ``task.train_batch(n, seed + r·stride, step)``
ROUND_SEED_STRIDE = 1_000_003


def example_key(example) -> str:
    """A key that tells examples apart (their ``repr``; dataclass examples print every field)."""
    return repr(example)


def fresh_prompts(task, n: int, seed: int, step: int, round_index: int, seen: set[str]) -> list:
    """Up to ``n`` training examples for extra round ``round_index`` (>= 1) of ``step``, none drawn before.

    The batch is ``task.train_batch(n, seed + round_index · ROUND_SEED_STRIDE, step)`` (a stream no main
    batch of the run uses, so the draw is a deterministic function of (seed, step, round)); examples whose
    key is in ``seen`` are left out, and the kept ones are added to ``seen`` (so a round may bring fewer
    than ``n``, possibly none).
    """
    out = []
    for e in task.train_batch(n, seed + round_index * ROUND_SEED_STRIDE, step):
        key = example_key(e)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


@dataclass
class SamplingStats:
    """What sampling one step's batch cost and found.

    Attributes:
        rounds: rollout rounds (1 + DAPO's extra rounds).
        completions: sequences sampled over every round (episodes: every turn's response).
        groups_dropped: groups left out because their rewards were all equal (DAPO).
        nfe: forward passes per sequence spent sampling, summed over the rounds (each round's mean over its rows
            with threshold decoding, so possibly fractional).
        passes: sequence forward passes spent sampling (rows × NFE of every sampling call, summed; what
            the sampling cost in forward passes over one sequence, unlike ``completions · nfe``).
        rewards: ``(N,)`` float32 task rewards of every sampled completion of every round (episodes:
            one final reward per trajectory), for logging.
        reward_parts: ``(N, F)`` float32 each reward function's values on those completions (NaN: ``None``),
            when the rollouts carry them (:attr:`Rollout.reward_parts`), for logging; else ``None``.
    """

    rounds: int
    completions: int
    groups_dropped: int
    nfe: int | float
    passes: int
    rewards: torch.Tensor
    reward_parts: torch.Tensor | None = None


def fill_informative_groups(first: Rollout, sample_more: Callable[[int], Rollout | None], num_groups: int,
                            num_generations: int, max_extra_rounds: int, pad_id: int) -> tuple[Rollout, SamplingStats]:
    """DAPO's dynamic sampling: keep only groups whose rewards differ, sampling new prompts until there are
    ``num_groups`` of them or ``max_extra_rounds`` extra rounds are spent.

    Each round's groups are kept in order while fewer than ``num_groups`` are kept (informative groups past
    that are surplus and left out, as verl's DAPO recipe truncates); a short batch after the last round is
    returned as it is (the caller logs it). The filter reads ``train_rewards`` (what the advantages see:
    a group of equal rewards has zero advantage; :func:`dlmrl.objectives.shaping.dynamic_sampling_keep`).

    Args:
        first: round 0, ``prompts · G`` rows in consecutive groups of G with ``rewards`` and
            ``train_rewards`` set.
        sample_more: ``round -> Rollout`` like ``first`` for new prompts (rounds 1, 2, ...), or ``None``
            when no new prompt could be drawn (the round still counts).
        num_groups: informative groups wanted (``prompts_per_step``). num_generations: G.
        max_extra_rounds: most extra rounds (0 = drop only).
        pad_id: prompt padding id when rounds' prompts differ in length.
    Returns:
        The kept rows (at most ``num_groups · G``, consecutive groups of G, ``nfe`` summed over the
        rounds) and the :class:`SamplingStats`.

    Reference: DAPO arXiv 2503.14476 §3.2 (dynamic sampling; verl's ``max_num_gen_batches`` bound).
    """
    from dlmrl.objectives.shaping import dynamic_sampling_keep

    G = num_generations
    parts, rewards, reward_parts = [], [], []
    kept = dropped = completions = nfe = passes = 0
    ro, rounds = first, 1
    while True:
        if ro is not None and len(ro):
            completions, nfe, passes = completions + len(ro), nfe + ro.nfe, passes + ro.sampling_passes()
            rewards.append(ro.rewards)
            reward_parts.append(ro.reward_parts)
            keep = dynamic_sampling_keep(ro.train_rewards, G)  # (prompts,)
            dropped += int((~keep).sum())
            take = torch.nonzero(keep).squeeze(-1)[: num_groups - kept]
            if len(take):
                parts.append(ro.rows((take[:, None] * G + torch.arange(G)).flatten()))
                kept += len(take)
        if kept >= num_groups or rounds > max_extra_rounds:
            break
        ro, rounds = sample_more(rounds), rounds + 1
    out = Rollout.cat(parts, pad_id) if parts else first.rows(torch.zeros(0, dtype=torch.long))
    out.nfe, out.passes = nfe, passes
    stats = SamplingStats(rounds, completions, dropped, nfe, passes, torch.cat(rewards) if rewards else torch.zeros(0),
                          torch.cat(reward_parts) if reward_parts and all(p is not None for p in reward_parts)
                          else None)
    return out, stats
