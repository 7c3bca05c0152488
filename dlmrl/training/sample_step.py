"""Step 1 of a training step: the step's prompts, G completions (or episodes) per prompt and their rewards, with
DAPO's dynamic sampling and soft overlong punishment where the preset asks for them.

Every random draw of step ``s`` comes from :func:`step_generator` ``(seed, s)``, so a resumed run samples what an
uninterrupted one would.
"""

from __future__ import annotations

import torch

from dlmrl.config import Config
from dlmrl.envs import make_env
from dlmrl.kinds import kind_of
from dlmrl.objectives.shaping import soft_overlong_punishment
from dlmrl.rewards.functions import ScoresEachReward
from dlmrl.training.distributed import Processes, gather_rollout
from dlmrl.training.dynamic_sampling import SamplingStats, example_key, fill_informative_groups, fresh_prompts
from dlmrl.training.episodes import rollout_episodes, trajectory_reward_parts, trajectory_rewards
from dlmrl.training.rollout import Rollout
from dlmrl.training.sharding import gathered


def step_generator(seed: int, step: int) -> torch.Generator:
    """The generator all randomness of one step comes from."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def shaped_rewards(preset, rewards: torch.Tensor, lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """Task rewards plus DAPO's soft overlong punishment when the preset asks for it
    (``L_cache = round(fraction · L_max)``, at least 1)."""
    if preset.overlong_cache_fraction is None:
        return rewards
    cache = max(1, round(preset.overlong_cache_fraction * max_length))
    return rewards + soft_overlong_punishment(lengths, max_length, cache)


def sample_groups(policy, task, cfg: Config, preset, examples: list, generator: torch.Generator, max_length: int,
                  temperature_fn=None, env: str | None = None, processes: Processes | None = None,
                  pad_id: int = 0) -> Rollout:
    """Step 1 for one batch of prompts: G completions per prompt (``env`` with a multi-turn preset: G episodes per
    prompt, one row per turn, :func:`dlmrl.training.episodes.rollout_episodes`; ``env`` with any other preset: G
    trajectories with the tools run inside each sequence, :meth:`~dlmrl.kinds.base.PolicyKind.sample_tool_loop`;
    otherwise the kind's :meth:`~dlmrl.kinds.base.PolicyKind.sample`) with ``rewards`` (task) and ``train_rewards``
    (plus DAPO's soft overlong punishment when the preset has it; episodes: the trajectory's final reward).

    With several ``processes`` each samples (and rewards) its share of the prompts, every row with the random
    numbers it has in the whole batch, and the shares are gathered: every process returns the whole batch
    (:mod:`dlmrl.training.distributed`)."""
    G, kind = cfg.train.num_generations, kind_of(cfg.model.kind)
    share = processes.share(len(examples)) if processes is not None and processes.count > 1 else None
    if env is not None and not preset.multi_turn:  # tools inside the rollout: one sequence per trajectory
        if share is not None:
            raise NotImplementedError("tools inside the rollout (train.env with a single-turn preset) run on one "
                                      "process for now; launch without data parallelism")
        envs = lambda: make_env(env, task, cfg.train.max_turns)
        ro = kind.sample_tool_loop(policy, envs, examples, generator, max_length, cfg, task, temperature_fn)
        ro.train_rewards = shaped_rewards(preset, ro.rewards, ro.completion_mask.sum(-1).cpu(), max_length)
        return ro
    if env is not None:
        ro = rollout_episodes(policy, task, lambda: make_env(env, task, cfg.train.max_turns),
                              examples if share is None else examples[share[0] : share[1]], G, generator,
                              max_length, cfg.sampling.temperature, temperature_fn,
                              processes if share is not None else None, cfg.sampling.rollout_batch_size)
        return ro if share is None else gather_rollout(ro, processes, pad_id)
    ro = kind.sample(policy, task, cfg, examples, generator, max_length, temperature_fn, prompts=share)
    texts = task.decode(ro.completion)
    if isinstance(task, ScoresEachReward):  # (a sum of reward functions: each one's values are logged too)
        ro.reward_parts = task.reward_table(ro.examples, texts)  # (B, F), NaN where a function returned None
        ro.rewards = task.reward_functions.combine(ro.reward_parts)  # (B,) TRL's weighted nansum
    else:
        ro.rewards = torch.tensor(task.rewards(ro.examples, texts), dtype=torch.float32)  # (B,)
    if preset.advantage == "srpo_passk" and hasattr(task, "exact_matches"):  # (SRPO's bonus: from these texts)
        ro.exact = torch.tensor(task.exact_matches(ro.examples, texts), dtype=torch.bool)  # (B,)
    ro.train_rewards = shaped_rewards(preset, ro.rewards, ro.completion_mask.sum(-1).cpu(), max_length)
    return ro if share is None else gather_rollout(ro, processes, pad_id)


def sample_step(policy, task, cfg: Config, preset, step: int, generator: torch.Generator, max_length: int,
                temperature_fn=None, env: str | None = None, pad_id: int = 0,
                processes: Processes | None = None) -> tuple[Rollout, SamplingStats]:
    """Step 1 of the loop: the step's prompts (``task.train_batch(prompts_per_step, seed, step)``) sampled with
    :func:`sample_groups`; with the preset's dynamic sampling (DAPO), groups of equal rewards are dropped and
    new prompts (:func:`~dlmrl.training.dynamic_sampling.fresh_prompts`, none drawn before in the step) sampled, at
    most ``dynamic_sampling_max_rounds`` extra rounds (:func:`~dlmrl.training.dynamic_sampling.fill_informative_groups`).
    With several ``processes`` every round is sampled in shares and gathered, so every process sees the whole
    batch, takes the same decisions and runs the same number of rounds.

    Returns:
        The batch to train on and what sampling it cost (:class:`~dlmrl.training.dynamic_sampling.SamplingStats`).
    """
    tr = cfg.train
    examples = task.train_batch(tr.prompts_per_step, tr.seed, step)

    def sample(batch: list) -> Rollout | None:
        if not batch:
            return None
        with gathered(policy.model):  # (FSDP2: processes sample different numbers of passes; a no-op unsharded)
            return sample_groups(policy, task, cfg, preset, batch, generator, max_length, temperature_fn, env,
                                 processes, pad_id)

    ro = sample(examples)
    if not preset.dynamic_sampling:
        return ro, SamplingStats(1, len(ro), 0, ro.nfe, ro.sampling_passes(),
                                 trajectory_rewards(ro) if env else ro.rewards,
                                 trajectory_reward_parts(ro) if env else ro.reward_parts)
    seen = {example_key(e) for e in examples}
    return fill_informative_groups(
        ro, lambda r: sample(fresh_prompts(task, tr.prompts_per_step, tr.seed, step, r, seen)),
        tr.prompts_per_step, tr.num_generations, preset.dynamic_sampling_max_rounds, pad_id)


