"""A rollout batch (:class:`Rollout`, the structure the trainer reads) and sampling one per policy kind.

- ``diffusion`` (:func:`rollout_diffusion`): the masked-diffusion sampler (:func:`dlmrl.models.sampler.generate`),
  with the order it revealed each position and the log-prob of each token it drew;
- ``ar`` (:func:`rollout_ar`): ``AutoregressivePolicy.generate``.

Both give ``(B, L)`` completions over the canvas; scoring them is :mod:`dlmrl.training.scorers`. A process samples its
rows in calls of at most ``sampling.rollout_batch_size`` rows (:func:`sampling_calls`), each row with the random
numbers it has in the whole batch, so the split changes no completion.
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
            the batch: DAPO's extra rounds, the turns of an episode); with threshold decoding or an early stop at
            EOS (several sampling calls stop at different blocks), where rows take different numbers of passes, the
            mean over the rows (an int when whole, else rounded to 3 places).
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
        kind_record: per-row tensors (first dimension ``B``) a policy kind records for its own scorer, by name (the
            uniform-noise kind: each step's input canvas and draws, :mod:`dlmrl.training.uniform_trajectory`);
            selected and concatenated with the rows; ``None`` for the other kinds.
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
    kind_record: dict | None = None

    def __len__(self) -> int:
        return len(self.completion)

    #: the per-row tensor fields (``None`` allowed), which :meth:`rows` and :meth:`to` map
    _TENSORS = ("prompt_ids", "prompt_mask", "completion", "completion_mask", "group_ids", "trajectory_ids",
                "anchor", "rewards", "train_rewards", "reveal_step", "token_logprobs", "row_nfe", "reward_parts",
                "observation_mask", "turns", "tool_errors", "exact")

    def _map(self, fn, **changes) -> Rollout:
        """A copy with ``fn`` applied to every per-row tensor field and the ``changes`` made."""
        mapped = {n: None if getattr(self, n) is None else fn(getattr(self, n)) for n in self._TENSORS}
        if self.kind_record is not None:
            mapped["kind_record"] = {k: fn(v) for k, v in self.kind_record.items()}
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

        def records():
            have = [p.kind_record is not None for p in parts]
            if any(have) and not all(have):
                raise ValueError("Rollout.cat: kind_record is set on some parts only")
            return {k: torch.cat([p.kind_record[k] for p in parts]) for k in parts[0].kind_record} if all(have) \
                else None

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
            kind_record=records(),
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


def sampling_calls(lo: int, hi: int, rows_per_call: int) -> list[tuple[int, int]]:
    """The row ranges ``[a, b)`` that sample rows ``[lo, hi)`` in calls of at most ``rows_per_call`` rows (0 = one
    call), in order; ``[]`` for no rows."""
    size = rows_per_call or max(1, hi - lo)
    return [(a, min(a + size, hi)) for a in range(lo, hi, size)]


def stops_at_eos(cfg, policy) -> bool:
    """Whether a diffusion rollout stops rows at EOS: ``sampling.stop_at_eos``, or when it is null, the sampler's
    default (the block sampler stops, as SDAR's ``block_diffusion_generate`` does; the full-diffusion sampler decodes
    the whole canvas, as LLaDA's ``generate`` does) when the policy has an EOS.

    Raises:
        ConfigError: ``sampling.stop_at_eos: true`` for a policy without an EOS id.
    """
    setting = cfg.sampling.stop_at_eos
    eos = getattr(policy, "eos_token_id", None)
    if setting is None:
        return hasattr(policy, "sample_blocks") and eos is not None
    if setting and eos is None:
        from dlmrl.errors import ConfigError

        raise ConfigError("config key 'sampling.stop_at_eos': the policy's tokenizer has no EOS token to stop at; "
                          "set it null or false")
    return bool(setting)


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

    ``sampling.rollout_batch_size`` ``n > 0``: the rows are sampled in calls of at most ``n`` rows, each from the
    generator's state at the start and with its rows' numbers in the whole batch (the sampler's ``rows``), so the
    completions and records are those of one call (to the model's floating-point batch effects) and the generator
    ends where one call leaves it.

    Early stop (:func:`stops_at_eos`; the block sampler by default): a row ends at the block holding its first EOS
    (:class:`~dlmrl.models.sampler.EosStop`); its later blocks hold EOS and are left out of ``completion_mask`` (no
    step wrote them: nothing scores, trains on or counts them). Each call stops its passes once all its rows have
    ended.

    The rollout carries the sampler's record: ``reveal_step``, ``token_logprobs`` and ``row_nfe``; ``nfe`` is the
    mean of ``row_nfe`` (with the plain schedule and no early stop, every row's count) and ``passes`` their sum.

    Raises:
        ConfigError: ``sampling.stop_at_eos: true`` for a policy without an EOS.
    """
    s = cfg.sampling
    batch = task.encode(examples, device=policy.device).repeat(cfg.train.num_generations)  # the whole batch
    keep = _prompt_rows(len(examples), cfg.train.num_generations, prompts)
    calls = sampling_calls(keep.start, keep.stop, s.rollout_batch_size)
    if not calls:  # (an empty share: one row, dropped, so that the generator advances as elsewhere)
        calls = [(0, 1)]
    elif prompts is None and len(calls) == 1:
        calls = [None]  # (the whole batch in one call)
    stop = stops_at_eos(cfg, policy)
    state = _generator_state(generator, len(calls))
    outs = []
    for rows in calls:
        if state is not None:  # (every call starts where the whole batch's would: its rows' numbers are the same)
            generator.set_state(state)
        outs.append(generate(policy, batch.prompt_ids, batch.prompt_mask, gen_length=task.gen_length,
                             block_length=s.block_length, steps=s.steps, temperature=s.temperature,
                             remasking=s.remasking, cfg_scale=s.cfg_scale, canvas=batch.canvas, generator=generator,
                             rows=rows, threshold=s.threshold, threshold_factor=s.threshold_factor, cache=s.cache,
                             eos_token_id=policy.eos_token_id if stop else None, stop_at_eos=stop))
    n = keep.stop - keep.start  # (an empty share drops the one row it ran)

    def rows_of(name: str) -> torch.Tensor:
        return torch.cat([getattr(o, name) for o in outs])[:n]

    canvas, row_nfe = rows_of("canvas"), rows_of("row_nfe")
    mask = batch.completion_mask[keep]
    if stop:  # (a row's blocks after its EOS block: no step wrote them, nothing reads them)
        mask = mask & (torch.arange(canvas.shape[1], device=mask.device) < rows_of("decoded_length")[:, None])
    nfe = mean_nfe(row_nfe) if n else (0 if s.adaptive else outs[0].nfe)
    return Rollout(batch.examples[keep], batch.prompt_ids[keep], batch.prompt_mask[keep], canvas, mask, nfe,
                   consecutive_groups(n, cfg.train.num_generations, canvas.device), passes=int(row_nfe.sum()),
                   reveal_step=rows_of("reveal_step"), token_logprobs=rows_of("token_logprobs"), row_nfe=row_nfe)


def _generator_state(generator: torch.Generator | None, calls: int) -> torch.Tensor | None:
    """The state every one of ``calls`` sampling calls starts from (``None`` for a single call).

    Raises:
        ValueError: several calls without a generator (the global RNG's draws could not be repeated).
    """
    if calls <= 1:
        return None
    if generator is None:
        raise ValueError("sampling in several calls (sampling.rollout_batch_size) needs a generator")
    return generator.get_state()


def rollout_ar(policy, task, cfg, examples: list, generator: torch.Generator, max_new_tokens: int | None = None,
               temperature_fn=None, prompts: tuple[int, int] | None = None) -> Rollout:
    """G completions per prompt, left to right: ``gen_length + 1`` tokens (the grid, then EOS) unless
    ``max_new_tokens`` says otherwise. The completion mask covers the tokens up to and including EOS;
    NFE is the longest completion.

    ``prompts = (lo, hi)``: sample only the completions of prompts ``[lo, hi)`` (one process's share), each
    with the random numbers it has in the whole batch (``noise_rows`` of ``policy.generate``); an empty share
    draws the sampling seed only, so that ``generator`` advances as on the other processes.

    ``sampling.rollout_batch_size`` ``n > 0``: the rows are sampled in calls of at most ``n`` rows
    (:func:`generate_ar_rows`), each ending when its own rows have (``passes`` counts them), the completions as
    in one call.
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
    noise_rows = None if prompts is None else (keep.start, len(batch.examples))
    comp, mask, passes = generate_ar_rows(policy, batch.prompt_ids[keep], batch.prompt_mask[keep], length,
                                          cfg.sampling.rollout_batch_size, temperature=cfg.sampling.temperature,
                                          generator=generator, temperature_fn=temperature_fn, noise_rows=noise_rows)
    return Rollout(batch.examples[keep], batch.prompt_ids[keep], batch.prompt_mask[keep], comp, mask,
                   int(mask.sum(-1).max()), consecutive_groups(len(comp), cfg.train.num_generations, comp.device),
                   passes=passes)


def generate_ar_rows(policy, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, length: int, rows_per_call: int,
                     *, temperature: float, generator: torch.Generator | int | None, temperature_fn=None,
                     noise_rows: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``policy.generate`` of ``B`` rows in calls of at most ``rows_per_call`` rows (0 = one call).

    Several calls share one seed drawn from ``generator`` (:func:`~dlmrl.models.ar.draw_seed`, as one call draws it)
    and give each its rows' place in the batch (``noise_rows`` of ``policy.generate``: rows ``[start + a, start +
    b)`` of ``total``), so every row draws the numbers it draws in one call and the completions are the same (to the
    model's floating-point batch effects); each call ends when its own rows have ended (transformers' ``generate``
    stops at EOS).

    Args:
        prompt_ids, prompt_mask: ``(B, P)`` long / bool, left-padded. length: ``max_new_tokens``.
        noise_rows: ``(start, total)``: these ``B`` rows are rows ``[start, start + B)`` of ``total`` (a process's
            share); ``None``: the batch.
    Returns:
        ``(completion (B, length) long, completion_mask (B, length) bool, passes)``: ``passes`` the sequence forward
        passes the calls ran (each call's rows times its longest completion).
    """
    from dlmrl.models.ar import draw_seed

    B = prompt_ids.shape[0]
    kw = {"temperature": temperature, "temperature_fn": temperature_fn}
    calls = sampling_calls(0, B, rows_per_call)
    if len(calls) <= 1:
        comp, mask = policy.generate(prompt_ids, prompt_mask, length, generator=generator,
                                     **kw, **({} if noise_rows is None else {"noise_rows": noise_rows}))
        return comp, mask, B * int(mask.sum(-1).max()) if B else 0
    seed = draw_seed(generator)
    start, total = noise_rows if noise_rows is not None else (0, B)
    parts = [policy.generate(prompt_ids[a:b], prompt_mask[a:b], length, generator=seed,
                             noise_rows=(start + a, total), **kw) for a, b in calls]
    passes = sum(len(m) * int(m.sum(-1).max()) for _, m in parts)
    return torch.cat([c for c, _ in parts]), torch.cat([m for _, m in parts]), passes


# -- DaGRPO off-policy anchors -----------------------------------------------------------------


