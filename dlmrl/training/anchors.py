"""DaGRPO's off-policy anchors: a group with no reward above the threshold gets the example's reference solution
as one extra row."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from dlmrl.training.rollout import Rollout


def first_rows(ids: list) -> list[int]:
    """The index of the first row of each id, in order of first appearance (``[5, 5, 2, 5, 2] -> [0, 2]``)."""
    first: dict = {}
    for i, x in enumerate(ids):
        first.setdefault(x, i)
    return list(first.values())


def add_anchors(ro: Rollout, task, anchor_threshold: float, kind, eos_token_id: int | None, pad_id: int,
                shape: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                reveal_steps: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[Rollout, int]:
    """DaGRPO's off-policy anchors: each group with no task reward above ``anchor_threshold`` gets the
    example's reference solution as one extra row (``anchor`` True, same group id, same prompt).

    The anchor completion is the reference text tokenized as the policy writes it: ``ar``: its tokens then
    EOS, padded with ``pad_id`` to the rollout's width (mask up to and including EOS); ``diffusion``: the
    solution laid on the canvas from its first position (a shorter text followed by EOS, as the sampler
    fills a canvas after the answer), taken at the row's completion positions and the rollout's canvas kept
    elsewhere (Sudoku infill: the 16 cells, givens unchanged), mask = the row's completion mask. Its reward is the task's reward of that
    completion (``shape(rewards, lengths)`` gives its ``train_rewards``). Groups whose example has no
    reference (``task.reference_solution`` ``None``) get none; a reference longer than the completion
    (AR: with EOS) is left out with a warning.

    Args:
        ro: the rollout with ``rewards`` and ``train_rewards``. anchor_threshold: the cut (DaGRPO: 0).
        kind: the policy kind (:class:`~dlmrl.kinds.base.PolicyKind`): ``autoregressive`` ones write the reference
            then EOS; the others lay it on the canvas.
        eos_token_id: appended to AR anchors, fills a diffusion canvas after a short reference (``None``:
            nothing appended; ``pad_id`` fills). pad_id: AR padding.
        shape: ``(rewards (n,), lengths (n,)) -> (n,)`` training rewards of the ``n`` anchors.
        reveal_steps: ``completion_mask (n, L) -> (n, L)`` the anchors' trajectory when ``ro`` carries one
            (the trainer: :func:`dlmrl.models.sampler.left_to_right_reveal_steps` with the sampler's schedule).
    Returns:
        The rollout with the anchor rows appended (``group_ids``, ``trajectory_ids`` and ``anchor`` set)
        and the number of anchors added.
    Warns:
        UserWarning: references too long for the completion (left out).

    Reference: DaGRPO arXiv 2512.06337 (off-policy data augmentation), **(dlmrl interpretation)**.
    """
    from dlmrl.objectives.pairwise import groups_needing_anchor

    groups = ro.group_ids
    need = groups_needing_anchor(ro.rewards, groups, anchor_threshold)  # (B,)
    needed = need.tolist()  # (the same on every row of a group)
    firsts = [i for i in first_rows(groups.tolist()) if needed[i]]
    L = ro.completion.shape[1]
    rows, comps, masks, too_long = [], [], [], 0
    fill = eos_token_id if eos_token_id is not None else pad_id
    for i in firsts:
        text = task.reference_solution(ro.examples[i])
        if text is None:
            continue
        ids = task.tokenizer(text, add_special_tokens=False)["input_ids"]
        if kind.autoregressive:
            ids = ids + ([eos_token_id] if eos_token_id is not None else [])
            if len(ids) > L:
                too_long += 1
                continue
            comp = torch.full((L,), pad_id, dtype=ro.completion.dtype)
            comp[: len(ids)] = torch.tensor(ids)
            mask = torch.arange(L) < len(ids)
        else:
            if len(ids) > L:
                too_long += 1
                continue
            mask = ro.completion_mask[i].cpu()
            canvas = torch.tensor(ids + [fill] * (L - len(ids)), dtype=ro.completion.dtype)  # (L,)
            comp = torch.where(mask, canvas, ro.completion[i].cpu())
        rows.append(i)
        comps.append(comp)
        masks.append(mask)
    if too_long:
        warnings.warn(f"DaGRPO anchors: {too_long} reference solution(s) longer than the {L}-token completion "
                      "left out", UserWarning, stacklevel=2)
    if not rows:
        return ro, 0
    dev = ro.completion.device
    index = torch.tensor(rows, device=dev)
    comp, mask = torch.stack(comps).to(dev), torch.stack(masks).to(dev)  # (n, L)
    examples = [ro.examples[i] for i in rows]
    rewards = torch.tensor(task.rewards(examples, task.decode(comp)), dtype=torch.float32)
    train = shape(rewards, mask.sum(-1).cpu()).float()
    trajs = ro.trajectories()
    n = len(rows)
    steps = None
    if ro.reveal_step is not None:
        if reveal_steps is None:
            raise ValueError("add_anchors: the rollout carries reveal steps; pass reveal_steps for the anchors")
        steps = torch.cat([ro.reveal_step, reveal_steps(mask).to(ro.reveal_step)])
    # (no sampler drew the anchors: no recorded log-probs, no sampling passes)
    logps = None if ro.token_logprobs is None else torch.cat([ro.token_logprobs, ro.token_logprobs.new_zeros(n, L)])
    row_nfe = None if ro.row_nfe is None else torch.cat([ro.row_nfe, ro.row_nfe.new_zeros(n)])
    out = Rollout(
        ro.examples + examples, torch.cat([ro.prompt_ids, ro.prompt_ids[index]]),
        torch.cat([ro.prompt_mask, ro.prompt_mask[index]]), torch.cat([ro.completion, comp]),
        torch.cat([ro.completion_mask, mask]), ro.nfe, torch.cat([groups, groups[index]]),
        torch.cat([trajs, int(trajs.max()) + 1 + torch.arange(n, device=trajs.device)]),
        torch.cat([ro.anchors(), torch.ones(n, dtype=torch.bool, device=dev)]),
        torch.cat([ro.rewards, rewards.to(ro.rewards)]), torch.cat([ro.train_rewards, train.to(ro.train_rewards)]),
        ro.sampling_passes(), steps, logps, row_nfe)
    return out, n
