"""A rollout batch (:class:`Rollout`, the structure the trainer reads) and sampling one per policy kind.

- ``diffusion`` (:func:`rollout_diffusion`): the masked-diffusion sampler (:func:`dlmrl.models.sampler.generate`),
  with the order it revealed each position and the log-prob of each token it drew;
- ``ar`` (:func:`rollout_ar`): ``AutoregressivePolicy.generate``.

Both give ``(B, L)`` completions over the canvas; scoring them is :mod:`dlmrl.training.scorers`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dlmrl.models.sampler import generate


@dataclass
class Rollout:
    """A rollout batch of ``B`` rows, each in a prompt group (sampled: ``prompts · G`` rows, groups of G consecutive
    rows).

    Attributes:
        examples: the task examples, one per row.
        prompt_ids, prompt_mask: ``(B, P)`` long / bool, left-padded.
        completion, completion_mask: ``(B, L)`` long / bool, the scored completion tokens.
        nfe: forward passes per sequence spent sampling (summed over every sampling call that made
            the batch: DAPO's extra rounds, the turns of an episode); with threshold decoding, where rows take
            different numbers of passes, the mean over the call's rows (an int when whole, else rounded to 3
            places).
        group_ids: ``(B,)`` long prompt-group id of each row, always set by whoever builds the rollout (the
            samplers: ``arange(B) // G``; DaGRPO's anchors join their group; episodes: the question's). Rows of
            one group share an id; nothing reads more than which rows share one and the order of the ids.
        trajectory_ids: ``(B,)`` long trajectory id of each row (Flow-GRPO: the turns of one episode
            share it); ``None`` = every row its own trajectory.
        anchor: ``(B,)`` bool, off-policy anchor rows (DaGRPO); ``None`` = none.
        rewards: ``(B,)`` float32 task rewards (episodes: the trajectory's final reward on each turn).
        train_rewards: ``(B,)`` float32 rewards the advantages see (task reward plus shaping).
        passes: sequence forward passes spent sampling (each sampling call's rows × its NFE, summed);
            ``None`` = ``B · nfe`` (one call that sampled every row). See :meth:`sampling_passes`.
        reveal_step: ``(B, L)`` long, the diffusion sampler's trajectory: the step that revealed each completion
            token (:attr:`dlmrl.models.sampler.SampleOutput.reveal_step`; -1 where it wrote nothing). DaGRPO's
            anchor rows, which no sampler wrote, get the left-to-right order in the sampler's schedule
            (:func:`dlmrl.models.sampler.left_to_right_reveal_steps`). ``None`` for AR rollouts.
        token_logprobs: ``(B, L)`` float32, the log-prob each completion token was drawn with
            (:attr:`dlmrl.models.sampler.SampleOutput.token_logprobs`: the sampler's distribution at the sampling
            temperature, mask token excluded; 0 where it wrote nothing and on anchor rows). ``None`` for AR
            rollouts.
        row_nfe: ``(B,)`` long forward passes each row took part in while sampling
            (:attr:`~dlmrl.models.sampler.SampleOutput.row_nfe`; 0 on anchor rows). ``None`` for AR rollouts.
        reward_parts: ``(B, F)`` float32, each reward function's value (NaN where it returned ``None``) when the
            task's reward is a sum of reward functions (:class:`~dlmrl.rewards.functions.ScoresEachReward`);
            ``None`` otherwise (and on rollouts with anchor rows).
        observation_mask: ``(B, L)`` bool, the completion tokens an environment wrote (tools run inside the rollout,
            :mod:`dlmrl.training.tool_loop`): context, never actions; ``completion_mask`` then covers only the
            policy's own tokens. ``None`` when the environment wrote nothing in the completions.
        turns: ``(B,)`` long policy turns of each trajectory (tools inside the rollout); ``None`` otherwise.
        tool_errors: ``(B,)`` long turns whose observation was an error (a call that did not parse, an unknown tool,
            invalid arguments, no action); ``None`` otherwise.
        exact: ``(B,)`` bool, whether each completion matches its example exactly (``task.exact_matches`` of the
            texts decoded for the rewards), set by the sampler when the preset's advantage reads it (SRPO's pass@k
            bonus); ``None`` otherwise.
    """

    examples: list
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion: torch.Tensor
    completion_mask: torch.Tensor
    nfe: int
    group_ids: torch.Tensor
    trajectory_ids: torch.Tensor | None = None
    anchor: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    train_rewards: torch.Tensor | None = None
    passes: int | None = None
    reveal_step: torch.Tensor | None = None
    token_logprobs: torch.Tensor | None = None
    row_nfe: torch.Tensor | None = None
    reward_parts: torch.Tensor | None = None
    observation_mask: torch.Tensor | None = None
    turns: torch.Tensor | None = None
    tool_errors: torch.Tensor | None = None
    exact: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.completion)

    #: the per-row tensor fields (``None`` allowed), which :meth:`rows` and :meth:`to` map
    _TENSORS = ("prompt_ids", "prompt_mask", "completion", "completion_mask", "group_ids", "trajectory_ids",
                "anchor", "rewards", "train_rewards", "reveal_step", "token_logprobs", "row_nfe", "reward_parts",
                "observation_mask", "turns", "tool_errors", "exact")

    def _map(self, fn, **changes) -> Rollout:
        """A copy with ``fn`` applied to every per-row tensor field and the ``changes`` made."""
        mapped = {n: None if getattr(self, n) is None else fn(getattr(self, n)) for n in self._TENSORS}
        return dataclasses.replace(self, **mapped, **changes)

    def rows(self, index: torch.Tensor) -> Rollout:
        """The rows ``index`` (an ``(n,)`` long tensor), every per-row field included (``passes``, a count
        over the sampled batch, is not carried over)."""
        return self._map(lambda t: t[index], examples=[self.examples[i] for i in index.tolist()], passes=None)

    def to(self, device: torch.device | str) -> Rollout:
        """The same rows with every tensor on ``device``."""
        return self._map(lambda t: t.to(device))

    def sampling_passes(self) -> int:
        """Sequence forward passes spent sampling: ``passes``, else ``B · nfe``."""
        return self.passes if self.passes is not None else len(self) * self.nfe

    def trajectories(self) -> torch.Tensor:
        """``(B,)`` long trajectory ids: ``trajectory_ids``, else ``arange(B)`` (one row, one trajectory)."""
        if self.trajectory_ids is not None:
            return self.trajectory_ids
        return torch.arange(len(self), device=self.completion.device)

    def anchors(self) -> torch.Tensor:
        """``(B,)`` bool anchor flags (all False when ``anchor`` is ``None``)."""
        if self.anchor is not None:
            return self.anchor
        return torch.zeros(len(self), dtype=torch.bool, device=self.completion.device)

    @staticmethod
    def cat(parts: Sequence[Rollout], pad_id: int) -> Rollout:
        """The rows of ``parts`` one after another.

        Prompts are left-padded (``pad_id``, mask False) to the longest; completions must have the same
        width. Group and trajectory ids are renumbered so rows of different parts never share one (each part's
        group ids first made 0, 1, ... in their order, so kept rows of a sampled batch number as a fresh one); NFE
        and sampling passes add up; ``anchor`` / ``rewards`` / ``train_rewards`` / ``reveal_step`` /
        ``token_logprobs`` / ``row_nfe`` / ``reward_parts`` / ``observation_mask`` / ``turns`` / ``tool_errors`` / ``exact`` must be
        set on every part or on none (``anchor``: a
        missing one means no anchors).

        Raises:
            ValueError: on no parts, different completion widths, or rewards set on some parts only.
        """
        if not parts:
            raise ValueError("Rollout.cat needs at least one part")
        if len({p.completion.shape[1] for p in parts}) > 1:
            raise ValueError(f"completion widths differ: {[p.completion.shape[1] for p in parts]}")
        width = max(p.prompt_ids.shape[1] for p in parts)

        def left_pad(t, value):
            return torch.cat([t.new_full((len(t), width - t.shape[1]), value), t], dim=1)

        def ids(get):
            out, offset = [], 0
            for p in parts:
                i = get(p)
                out.append(i + offset)
                offset += int(i.max()) + 1 if len(i) else 0
            return torch.cat(out)

        def optional(name):
            have = [getattr(p, name) is not None for p in parts]
            if any(have) and not all(have):
                raise ValueError(f"Rollout.cat: {name} is set on some parts only")
            return torch.cat([getattr(p, name) for p in parts]) if all(have) else None

        return Rollout(
            [e for p in parts for e in p.examples],
            torch.cat([left_pad(p.prompt_ids, pad_id) for p in parts]),
            torch.cat([left_pad(p.prompt_mask, False) for p in parts]),
            torch.cat([p.completion for p in parts]), torch.cat([p.completion_mask for p in parts]),
            sum(p.nfe for p in parts),
            ids(lambda p: torch.unique(p.group_ids, return_inverse=True)[1]),  # (each part's groups 0, 1, ...)
            ids(lambda p: p.trajectories()) if any(p.trajectory_ids is not None for p in parts) else None,
            torch.cat([p.anchors() for p in parts]) if any(p.anchor is not None for p in parts) else None,
            optional("rewards"), optional("train_rewards"), sum(p.sampling_passes() for p in parts),
            optional("reveal_step"), optional("token_logprobs"), optional("row_nfe"),
            reward_parts=optional("reward_parts"), observation_mask=optional("observation_mask"),
            turns=optional("turns"), tool_errors=optional("tool_errors"), exact=optional("exact"),
        )


def mean_nfe(row_nfe: torch.Tensor) -> int | float:
    """The mean of ``(B,)`` per-row forward passes: an int when whole (always without threshold decoding, where
    every row takes part in every pass), else rounded to 3 places; 0 for no rows."""
    if not len(row_nfe):
        return 0
    mean = float(row_nfe.double().mean())
    return int(mean) if mean == int(mean) else round(mean, 3)


def consecutive_groups(num_rows: int, num_generations: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``(num_rows,)`` long group ids of rows in consecutive groups of G: ``arange(num_rows) // G``."""
    return torch.arange(num_rows, device=device) // num_generations


def _prompt_rows(num_prompts: int, G: int, prompts: tuple[int, int] | None) -> slice:
    """The completion rows of prompts ``[lo, hi)`` (all of them when ``prompts`` is None)."""
    lo, hi = (0, num_prompts) if prompts is None else prompts
    if not 0 <= lo <= hi <= num_prompts:
        raise ValueError(f"prompts ({lo}, {hi}) must lie in the batch's {num_prompts} prompts")
    return slice(lo * G, hi * G)


def rollout_diffusion(policy, task, cfg, examples: list, generator: torch.Generator,
                      prompts: tuple[int, int] | None = None) -> Rollout:
    """G completions per prompt from the masked-diffusion sampler (``sampling`` section); the completion
    mask is the task's (e.g. the blank cells in infill mode).

    ``prompts = (lo, hi)``: sample only the completions of prompts ``[lo, hi)`` (one process's share), each
    with the random numbers it has in the whole batch (the sampler's ``rows``); an empty share still runs the
    sampler on one row, which it drops, so that ``generator`` advances as on the other processes.

    The rollout carries the sampler's record: ``reveal_step``, ``token_logprobs`` and ``row_nfe``; with threshold
    decoding (``sampling.threshold`` / ``threshold_factor``) ``nfe`` is the mean of ``row_nfe`` and ``passes``
    their sum.
    """
    s = cfg.sampling
    batch = task.encode(examples, device=policy.device).repeat(cfg.train.num_generations)  # the whole batch
    keep = _prompt_rows(len(examples), cfg.train.num_generations, prompts)
    rows = None if prompts is None else (keep.start, keep.stop) if keep.stop > keep.start else (0, 1)
    out = generate(policy, batch.prompt_ids, batch.prompt_mask, gen_length=task.gen_length,
                   block_length=s.block_length, steps=s.steps, temperature=s.temperature, remasking=s.remasking,
                   cfg_scale=s.cfg_scale, canvas=batch.canvas, generator=generator, rows=rows,
                   threshold=s.threshold, threshold_factor=s.threshold_factor, cache=s.cache)
    n = len(out.canvas) if keep.stop > keep.start else 0  # (an empty share drops the one row it ran)
    return Rollout(batch.examples[keep], batch.prompt_ids[keep], batch.prompt_mask[keep], out.canvas[:n],
                   batch.completion_mask[keep], mean_nfe(out.row_nfe[:n]) if s.adaptive else out.nfe,
                   consecutive_groups(n, cfg.train.num_generations, out.canvas.device),
                   passes=int(out.row_nfe[:n].sum()), reveal_step=out.reveal_step[:n],
                   token_logprobs=out.token_logprobs[:n], row_nfe=out.row_nfe[:n])


def rollout_ar(policy, task, cfg, examples: list, generator: torch.Generator, max_new_tokens: int | None = None,
               temperature_fn=None, prompts: tuple[int, int] | None = None) -> Rollout:
    """G completions per prompt, left to right: ``gen_length + 1`` tokens (the grid, then EOS) unless
    ``max_new_tokens`` says otherwise. The completion mask covers the tokens up to and including EOS;
    NFE is the longest completion.

    ``prompts = (lo, hi)``: sample only the completions of prompts ``[lo, hi)`` (one process's share), each
    with the random numbers it has in the whole batch (``noise_rows`` of ``policy.generate``); an empty share
    draws the sampling seed only, so that ``generator`` advances as on the other processes.
    """
    from dlmrl.models.ar import draw_seed

    length = max_new_tokens or task.gen_length + 1
    batch = task.encode(examples, device=policy.device).repeat(cfg.train.num_generations)  # the whole batch
    keep = _prompt_rows(len(examples), cfg.train.num_generations, prompts)
    if keep.stop == keep.start:
        draw_seed(generator)
        empty = batch.prompt_ids.new_zeros((0, length))
        return Rollout([], batch.prompt_ids[keep], batch.prompt_mask[keep], empty, empty.bool(), 0,
                       consecutive_groups(0, cfg.train.num_generations, empty.device))
    extra = {} if prompts is None else {"noise_rows": (keep.start, len(batch.examples))}
    comp, mask = policy.generate(batch.prompt_ids[keep], batch.prompt_mask[keep], length,
                                 temperature=cfg.sampling.temperature, generator=generator,
                                 temperature_fn=temperature_fn, **extra)
    return Rollout(batch.examples[keep], batch.prompt_ids[keep], batch.prompt_mask[keep], comp, mask,
                   int(mask.sum(-1).max()), consecutive_groups(len(comp), cfg.train.num_generations, comp.device))


# -- DaGRPO off-policy anchors -----------------------------------------------------------------


