"""Multi-turn episode rollouts (Flow-GRPO): G episodes per prompt, one training row per turn.

Every turn's (context, response) pair becomes one row of a :class:`~dlmrl.training.rollout.Rollout`:
the prompt is the turn's observation, the completion the policy's response, and the reward the
trajectory's *final* reward; ``trajectory_ids`` tie a trajectory's turns together and ``group_ids`` its
question's G trajectories, which is what the ``flow_grpo`` advantage reads. An environment that scores its trajectory in parts
(``env.reward_parts``, e.g. the tool-use environments' MTR components) has them on every row of the
trajectory too (``Rollout.reward_parts``), and :func:`trajectory_reward_parts` gives one row per trajectory
for logging. :func:`evaluate_episodes` plays one greedy episode per held-out example.
Reference: Flow-GRPO / AgentFlow arXiv 2510.05592.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from dlmrl.data.encoding import encode_prompts
from dlmrl.training.anchors import first_rows
from dlmrl.training.rollout import Rollout, generate_ar_rows


def encode_observations(tokenizer, texts: Sequence[str], device: str | torch.device = "cpu"):
    """Observation texts → left-padded prompt ids ``(N, P)`` long and mask ``(N, P)`` bool: the encoding
    :meth:`dlmrl.data.tasks.SudokuTask.encode` gives ``"<puzzle>="`` (:func:`dlmrl.data.encoding.encode_prompts`:
    the tokenizer's BOS when it has one, padding with its pad id, else EOS, else 0, on the left)."""
    return encode_prompts(tokenizer, texts, device)


def rollout_episodes(policy, task, make_env: Callable[[], object], examples: Sequence, num_generations: int,
                     generator: torch.Generator, max_new_tokens: int, temperature: float = 1.0,
                     temperature_fn=None, processes=None, rows_per_call: int = 0) -> Rollout:
    """Play ``num_generations`` episodes per example, all active episodes' turns sampled in one batch.

    Episode ``e = prompt · G + g`` starts with ``env.reset(example)``; each turn the policy samples a
    response to the current observation (``policy.generate``, ``max_new_tokens``, ``temperature``, the
    step's ``generator``), ``task.decode`` turns it into text and ``env.step(text)`` gives the next
    observation, whether the episode ended, and the turn's reward. An episode's final reward is its last
    turn's reward.

    Args:
        policy: an AR policy (``generate``, ``tokenizer``, ``device``). task: decodes responses
            (``task.decode``). make_env: a fresh environment per episode (e.g. ``lambda: make_env(name,
            task, max_turns)``). examples: the prompts' examples. num_generations: G.
        generator: the step's generator. max_new_tokens: response budget per turn.
        processes: a :class:`dlmrl.training.distributed.Processes` when the episodes are one process's
            share of a data-parallel batch (each process holds consecutive episodes): every process then
            plays every turn of the whole batch (drawing the turn's seed even when none of its episodes is
            still running), samples its active episodes with the random numbers they have among all active
            episodes, and counts ``nfe`` over the whole batch (``passes``: the passes its own sampling calls
            ran). ``None``: one process.
        rows_per_call: a turn's episodes are sampled in calls of at most this many (``sampling.rollout_batch_size``;
            0 = one call), each with the numbers it has in the turn's batch
            (:func:`~dlmrl.training.rollout.generate_ar_rows`).
    Returns:
        A :class:`Rollout` of one row per turn, rows of a trajectory consecutive (episode order, then turn
        order): ``prompt_ids`` the turn's observation, ``completion`` the response (mask up to and
        including EOS), ``rewards`` = ``train_rewards`` = the trajectory's final reward ``(B,)`` float32,
        ``trajectory_ids`` = e, ``group_ids`` = e // G, ``nfe`` = the sum over turns of the longest
        response (forward passes per episode), ``passes`` = the sum over turns and sampling calls of the call's
        episodes × its longest response; ``reward_parts`` ``(B, F)`` float32, the trajectory's
        ``env.reward_parts`` on each of its rows, when every environment gives them (else ``None``).
    Raises:
        RuntimeError: an environment that has not ended its episode after its ``max_turns``.
    """
    G = num_generations
    envs, owners = [], []
    obs: list[str] = []
    for i, ex in enumerate(examples):
        for _ in range(G):
            env = make_env()
            envs.append(env)
            owners.append(i)
            obs.append(env.reset(ex))
    E = len(envs)
    turns: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(E)]
    prompts: list[list[str]] = [[] for _ in range(E)]
    final = [0.0] * E
    active, nfe, passes, turn = list(range(E)), 0, 0, 0
    counts = [E] if processes is None else processes.gather(E)  # active episodes per process
    max_turns = max((env.max_turns for env in envs), default=0)
    while sum(counts):
        if active and turn >= max_turns:
            raise RuntimeError(f"episodes still running after {turn} turns: an environment must end its "
                               "episodes within its max_turns")
        longest, still, own_passes = 0, [], 0
        if processes is None:
            sample = {"generator": generator}
        else:  # (the turn's seed is drawn on every process; rows: this share's place among all active episodes)
            from dlmrl.models.ar import draw_seed

            sample = {"generator": draw_seed(generator),
                      "noise_rows": (sum(counts[: processes.index]), sum(counts))}
        if active:
            ids, mask = encode_observations(policy.tokenizer, [obs[e] for e in active], policy.device)
            comp, cmask, own_passes = generate_ar_rows(policy, ids, mask, max_new_tokens, rows_per_call,
                                                       temperature=temperature, temperature_fn=temperature_fn,
                                                       **sample)
            longest = int(cmask.sum(-1).max())
            texts = task.decode(comp)
            for k, e in enumerate(active):
                prompts[e].append(obs[e])
                turns[e].append((comp[k], cmask[k]))
                obs[e], done, reward = envs[e].step(texts[k])
                final[e] = float(reward)
                if not done:
                    still.append(e)
        turn_stats = [(len(active), longest, len(still))] if processes is None else processes.gather(
            (len(active), longest, len(still)))
        longest = max(n for _, n, _ in turn_stats)
        nfe += longest
        passes += own_passes  # (the passes this share's calls ran: each ends when its own rows have)
        active, turn, counts = still, turn + 1, [s for _, _, s in turn_stats]
    if not E:  # (an empty share of a data-parallel batch)
        empty = torch.zeros((0, max_new_tokens), dtype=torch.long, device=policy.device)
        no_rows = torch.zeros(0)
        return Rollout([], empty[:, :1], empty[:, :1].bool(), empty, empty.bool(), nfe,
                       group_ids=no_rows.long(), trajectory_ids=no_rows.long(), rewards=no_rows,
                       train_rewards=no_rows.clone(), passes=passes)
    texts_all = [p for e in range(E) for p in prompts[e]]
    ids, mask = encode_observations(policy.tokenizer, texts_all, policy.device)
    traj = torch.tensor([e for e in range(E) for _ in turns[e]], dtype=torch.long)  # (B,)
    rewards = torch.tensor([final[e] for e in traj.tolist()], dtype=torch.float32)  # (B,)
    parts = [getattr(env, "reward_parts", None) for env in envs]
    reward_parts = (torch.tensor([list(parts[e]) for e in traj.tolist()], dtype=torch.float32)  # (B, F)
                    if all(p is not None for p in parts) else None)
    return Rollout([examples[owners[e]] for e in traj.tolist()], ids, mask,
                   torch.stack([c for e in range(E) for c, _ in turns[e]]),
                   torch.stack([m for e in range(E) for _, m in turns[e]]), nfe,
                   group_ids=traj // G, trajectory_ids=traj, rewards=rewards, train_rewards=rewards.clone(),
                   passes=passes, reward_parts=reward_parts)


def trajectory_rewards(ro: Rollout) -> torch.Tensor:
    """``(n_traj,)`` one reward per trajectory (its first row's), in order of first appearance."""
    return ro.rewards[first_rows(ro.trajectories().tolist())]


def trajectory_reward_parts(ro: Rollout) -> torch.Tensor | None:
    """``(n_traj, F)`` the reward parts of each trajectory (its first row's), or ``None`` when the rollout has none."""
    if ro.reward_parts is None:
        return None
    return ro.reward_parts[first_rows(ro.trajectories().tolist())]


@torch.no_grad()
def evaluate_episodes(policy, task, make_env: Callable[[], object], examples: Sequence, max_new_tokens: int,
                      batch_size: int = 256) -> list:
    """Play one greedy episode per example (temperature 0), ``batch_size`` episodes at a time.

    Args:
        policy: an AR policy. task: decodes the responses. make_env: a fresh environment per episode.
        examples: the held-out examples. max_new_tokens: each turn's budget.
    Returns:
        The ended environments, one per example in order (read ``env.score`` / ``env.trace``).
    """
    was_training = policy.model.training
    policy.model.eval()
    played: list = []
    for start in range(0, len(examples), max(batch_size, 1)):
        def fresh():
            env = make_env()
            played.append(env)
            return env

        rollout_episodes(policy, task, fresh, examples[start:start + batch_size], 1, torch.Generator().manual_seed(0),
                         max_new_tokens, temperature=0.0)
    if was_training:
        policy.model.train()
    return played
