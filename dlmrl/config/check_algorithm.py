"""The config check of ``train``'s algorithm: the preset on this policy kind, its parts' options, its rollout parts
(dynamic sampling, anchors, episodes, tools inside the rollout) and how a rollout batch becomes optimizer steps."""

from __future__ import annotations

from dlmrl.config.overrides import part_options
from dlmrl.config.resolve import build_preset
from dlmrl.config.schema import Config
from dlmrl.kinds import check_key as _check
from dlmrl.kinds import kind_of


def check_algorithm(cfg: Config):
    """The preset exists, its overrides are valid, it runs on ``model.kind`` and the trainer supports it; returns
    the preset (:func:`~dlmrl.config.resolve.build_preset`)."""
    from dlmrl.objectives.advantages import SCALE_REWARDS

    tr, kind = cfg.train, kind_of(cfg.model.kind)
    _check(tr.scale_rewards is None or tr.advantage is None, "train.scale_rewards",
           "set scale_rewards or advantage, not both")
    _check(tr.scale_rewards is None or tr.scale_rewards in SCALE_REWARDS, "train.scale_rewards",
           f"must be none, group or batch, got {tr.scale_rewards!r}")
    _check(tr.epsilon is None or 0 < tr.epsilon < 1, "train.epsilon", "must be in (0, 1)")
    _check(tr.epsilon_high is None or tr.epsilon_high > 0, "train.epsilon_high", "must be > 0")
    _check(tr.beta is None or tr.beta >= 0, "train.beta", "must be >= 0")
    from dlmrl.objectives.objective import PART_REGISTRIES as registries
    for part, own in tr.part_options.items():
        _check(part in registries, f"train.part_options.{part}",
               f"part_options may only name {', '.join(registries)} (a mapping of that part's settings each)")
        _check(isinstance(own, dict), f"train.part_options.{part}",
               f"expects a mapping of the {part}'s settings by field name, got {own!r}")
    preset = build_preset(cfg)
    for part, own in tr.part_options.items():  # (types: the part's own fields', checked before any model loads)
        part_options(registries[part].get(getattr(preset.objective, part)), own, f"train.part_options.{part}")
    eps, eps_high = preset.objective.epsilon, preset.objective.epsilon_high
    _check(eps_high is None or eps_high >= eps, "train.epsilon_high",
           f"the upper clip {eps_high} is below the lower one (epsilon {eps}); clip-higher needs epsilon_high >= "
           "epsilon")
    _check(kind.runs_preset(preset), "train.algorithm",
           f"{tr.algorithm!r} runs on {' and '.join(preset.policies)} policies only, but model.kind is {kind.name!r}")
    problem = kind.preset_problem(preset)
    _check(problem is None, "train.algorithm", problem or "")
    _check(preset.adaptive_temperature_tau is None or kind.autoregressive, "train.algorithm",
           f"{tr.algorithm!r} samples with HAPO's adaptive temperature, which needs model.kind 'ar'")
    _check(isinstance(tr.max_completions, int) and tr.max_completions >= 0, "train.max_completions",
           "must be an integer >= 0 (0 = no rollout budget)")
    _check(not tr.sync_ref_model or "logp_ref" in preset.objective.required_inputs, "train.sync_ref_model",
           f"{tr.algorithm!r} as configured has no KL toward a reference model (train.beta is "
           f"{preset.objective.beta}, the KL toward {preset.objective.kl_reference!r}): there is no reference to "
           "follow the policy; set train.beta > 0 (and train.kl_reference: reference) or leave sync_ref_model off")
    check_rollout_parts(cfg, preset)
    kind.check_algorithm(cfg, preset)  # (what the kind lacks beyond its policies entry)
    return preset


def check_rollout_parts(cfg: Config, preset) -> None:
    """Dynamic sampling, anchors, episodes and tools inside the rollout: combinations the trainer runs, the
    environment, the advantage."""
    from dlmrl.envs import ENVS, default_env

    tr, algo, kind = cfg.train, cfg.train.algorithm, kind_of(cfg.model.kind)
    if preset.multi_turn:
        _check(kind.autoregressive, "train.algorithm", f"{algo!r} plays multi-turn episodes: model.kind 'ar' only")
        _check(not preset.dynamic_sampling and preset.anchor_threshold is None, "train.algorithm",
               f"{algo!r}: multi-turn episodes cannot be combined with dynamic sampling or anchors")
        env = tr.env or default_env(cfg.task.name)
        _check(env is not None, "train.env", f"task {cfg.task.name!r} has no default environment; set train.env "
                                             f"(known: {', '.join(ENVS.names())})")
        check_env(cfg, env)
    elif tr.env is not None:  # tools inside the rollout: one growing sequence per trajectory (training/tool_loop.py)
        env = tr.env
        check_env(cfg, env)
        if kind.scores_with_estimators:
            from dlmrl.config.resolve import estimator_name

            kind.check_tools_in_rollout(cfg, estimator_name(cfg))
        _check(preset.anchor_threshold is None, "train.env",
               f"{algo!r} adds off-policy anchor rows, which have no tool observations; tools inside the rollout "
               "cannot be combined with anchors")
        context = (cfg.task.options or {}).get("context", "react") if env == "multihop" else None
        _check(env != "multihop_memory" and context in (None, "react"), "train.env",
               f"tools inside the rollout append each observation to the sequence, so the context must be the "
               f"growing transcript: use multihop_react (or multihop with task.options.context: react), not "
               f"{'multihop_memory' if env == 'multihop_memory' else 'context ' + repr(context)}")
        _check(env.startswith("multihop"), "train.env",
               f"environment {env!r} rewrites its prompt every turn; tools inside the rollout need one that appends "
               "its observations (multihop_react)")
        turn = int((cfg.task.options or {}).get("turn_length", 64)) if cfg.task.name == "multihop" else 1
        budget = kind.generation_budget(cfg.sampling.gen_length, preset)  # (the run's max_length)
        extra = kind.budget_parts(preset)
        _check(budget >= turn, "sampling.gen_length",
               f"{budget} tokens (sampling.gen_length {cfg.sampling.gen_length}{extra}) is the whole trajectory's "
               f"budget with the tools inside the rollout (actions and observations); it cannot hold one turn of "
               f"task.options.turn_length {turn} tokens")


def check_env(cfg: Config, env: str) -> None:
    """``env`` a registered environment that serves the task, and ``train.max_turns`` a turn limit (episodes and
    tools inside the rollout alike)."""
    from dlmrl.envs import ENVS

    _check(env in ENVS, "train.env", f"unknown environment {env!r}; known: {', '.join(ENVS.names())}")
    tasks = getattr(ENVS.get(env), "tasks", ())
    _check(cfg.task.name in tasks, "train.env", f"environment {env!r} serves tasks {tasks}, not {cfg.task.name!r}")
    _check(isinstance(cfg.train.max_turns, int) and cfg.train.max_turns >= 1, "train.max_turns",
           "must be an integer >= 1")


def check_steps_per_generation(cfg: Config, preset) -> None:
    """``train.steps_per_generation``: an integer >= 1 that divides ``train.prompts_per_step`` (mini-batches of
    equally many whole groups), and above 1 only for a loss that needs no statistics over the whole batch. With
    the ``preset`` (training), warn about configured keys that cannot act because every update sees ratio 1
    (:func:`warn_inert_ratio`)."""
    tr = cfg.train
    count = tr.steps_per_generation
    _check(isinstance(count, int) and not isinstance(count, bool) and count >= 1, "train.steps_per_generation",
           f"must be an integer >= 1 (optimizer steps per rollout batch), got {count!r}")
    divisors = [d for d in range(1, tr.prompts_per_step + 1) if tr.prompts_per_step % d == 0]
    _check(tr.prompts_per_step % count == 0, "train.steps_per_generation",
           f"{count} mini-batches of whole groups do not split a rollout batch of train.prompts_per_step "
           f"{tr.prompts_per_step} groups evenly; use a divisor of it ({', '.join(map(str, divisors[:8]))}"
           f"{', ...' if len(divisors) > 8 else ''})")
    if preset is None:
        return
    objective = preset.objective
    _check(count == 1 or not objective.needs_whole_batch, "train.steps_per_generation",
           f"{tr.algorithm!r} ranks or normalises token entropies over the whole batch inside its loss "
           f"({objective.whole_batch_reason()}), which a mini-batch holding part of the batch cannot do; use 1")
    warn_inert_ratio(cfg, preset)


def warn_inert_ratio(cfg: Config, preset) -> None:
    """Warn about configured keys that can have no effect because every update sees ratio 1: with
    ``train.num_iterations`` 1 and ``train.steps_per_generation`` 1 a rollout batch's only optimizer step starts
    at the policy that sampled it, whose scores are its old scores. Then nothing is clipped (``train.epsilon``,
    ``epsilon_high``, ``clip_rule``, ``dual_clip``, ``delta``), and a ``k2`` / ``k3`` KL toward the rollout policy
    (``kl_reference: old``, TraceRL's) is 0 with gradient 0 (``train.beta``, ``kl_reference``). Keys left null
    (the preset's values) are not warned about; ``k1``'s gradient is not 0 (its expectation is)."""
    import warnings

    tr, o = cfg.train, preset.objective
    if tr.num_iterations > 1 or tr.steps_per_generation > 1:
        return
    inert, why = [], []
    kl_keys = [k for k in ("beta", "kl_reference") if getattr(tr, k) is not None]
    if kl_keys and o.beta > 0 and o.kl_reference == "old" and o.kl_kind in ("k2", "k3"):
        inert += [f"train.{k}" for k in kl_keys]
        why.append(f"the {o.kl_kind} KL toward the rollout policy (beta {o.beta:g}, kl_reference old) is 0 with "
                   "gradient 0")
    clip_keys = [k for k in ("epsilon", "epsilon_high", "clip_rule", "dual_clip", "delta")
                 if getattr(tr, k) not in (None, 0)]  # (dual_clip / delta 0: off)
    if clip_keys and o.ratio_level != "none":
        inert += [f"train.{k}" for k in clip_keys]
        why.append("nothing is clipped")
    if inert:
        warnings.warn(f"config keys {', '.join(inert)} have no effect: with train.num_iterations 1 and "
                      "train.steps_per_generation 1 each rollout batch's only optimizer step starts at the policy "
                      f"that sampled it, so its importance ratio is 1 at every token: {' and '.join(why)}. Set "
                      "train.steps_per_generation > 1 (several optimizer steps per rollout batch, as TRL's "
                      "steps_per_generation and TraceRL's code take) or train.num_iterations > 1, or remove them",
                      UserWarning, stacklevel=4)
