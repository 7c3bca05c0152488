"""Checking a config's values against their ranges and the registries before any model loads: :func:`validate`
(the model, sampling and run keys here; the policy kind's own keys in its module, :mod:`dlmrl.kinds`; the algorithm
in :mod:`~dlmrl.config.check_algorithm`, the estimator section in :mod:`~dlmrl.config.check_estimator`, the task's
data in :mod:`~dlmrl.config.check_data`), :func:`validate_pretrain` and the default job's config."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dlmrl.config.check_algorithm import (
    check_algorithm,
    check_steps_per_generation,
)
from dlmrl.config.check_data import check_data_files, check_reward_funcs
from dlmrl.config.check_estimator import (
    check_logits_chunk,
    check_own_estimator,
    check_rollout_is_cap,
    check_self_conditioning,
    is_number,
    refuse_estimator_keys,
    warn_estimator_fields,
)
from dlmrl.config.overrides import apply_overrides, load_yaml
from dlmrl.config.resolve import (
    RunSpec,
    adopt_checkpoint_kind,
    build_estimator,
    checkpoint_kind_conflict,
    estimator_choice,
    estimator_sampling,
    flat_settings,
    preset_or_none,
    use_the_algorithms_estimator,
)
from dlmrl.config.schema import (
    COLLAPSE_DIRECTIONS,
    SCHEDULERS,
    Config,
    ModelConfig,
    PretrainConfig,
    default_config_path,
)
from dlmrl.config.task_options import check_task_keys, task_class, task_key, task_options
from dlmrl.errors import ConfigError, OptionError
from dlmrl.kinds import check_key, kind_names, kind_of
from dlmrl.kinds.families import check_cache_family  # noqa: F401 (re-exported: dlmrl.config.check_cache_family)


def _warn(msg: str) -> None:
    """A ``UserWarning`` from the config check (attributed to the caller of :func:`validate`)."""
    import warnings

    warnings.warn(msg, UserWarning, stacklevel=3)


_check = check_key  # (the one refusal form: "config key '<key>': <msg>")


#: trackers ``train.report_to`` accepts (accelerate's ``log_with`` names) and the package each needs
TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}
#: ``train.sharding``'s values (:mod:`dlmrl.training.sharding`)
SHARDING_MODES = ("none", "fsdp2")


def tracker_available(name: str) -> bool:
    """Whether the package of tracker ``name`` (:data:`TRACKERS`) is installed (accelerate's own check)."""
    from accelerate import utils

    return bool(getattr(utils, f"is_{name}_available")())


def check_eval_protocol(cfg: Config, for_training: bool = True) -> None:
    """``eval.preset`` and ``eval.protocol``: known names, a protocol the task has, and (a preset) a generation
    length its blocks and steps fit.

    Raises:
        ConfigError: naming ``eval.preset`` or ``eval.protocol``.
    """
    from dlmrl.evaluation.presets import PRESETS
    from dlmrl.evaluation.protocol import PROTOCOLS, protocol_problem

    ev, t = cfg.eval, cfg.task
    _check(ev.preset == "none" or ev.preset in PRESETS, "eval.preset",
           f"unknown preset {ev.preset!r}; use none, {', '.join(PRESETS)}")
    _check(ev.protocol is None or ev.protocol in PROTOCOLS, "eval.protocol",
           f"unknown protocol {ev.protocol!r}; use {', '.join(PROTOCOLS)} (or null: the preset's)")
    preset = PRESETS.get(ev.preset)
    protocol = ev.protocol or (preset.protocol if preset else "strict")
    problem = protocol_problem(protocol, t.name, t.answer_mode)
    _check(problem is None, "eval.protocol" if ev.protocol else "eval.preset",
           f"{problem}{f' (the protocol of preset {ev.preset!r}; set eval.protocol: strict)' if not ev.protocol else ''}")
    kind = kind_of(cfg.model.kind)
    if preset is not None and kind.denoises:
        # `dlmrl eval` decodes the preset's lengths; a training run's held-out evaluations decode sampling.gen_length
        during_training = for_training and (ev.before or ev.after or ev.eval_steps)
        for length in (cfg.sampling.gen_length,) if during_training else preset.gen_lengths:
            problem = kind.eval_preset_problem(preset, length)
            _check(problem is None, "eval.preset", f"preset {ev.preset!r}: {problem}"
                   + (" (a training run evaluates at sampling.gen_length)" if during_training else ""))


def validate(cfg: Config, for_training: bool = True, data: bool = True) -> RunSpec:
    """Check every value of a train/eval config against its allowed range and the registries, resolving the
    config once on the way (its preset and its estimator are built to be checked).

    Args:
        for_training: also check the algorithm preset (evaluation trains nothing: any algorithm will do).
        data: also check the task's data (local files loaded, held-out size) and resolve ``train.reward_funcs``
            (importing the modules their import strings name); ``False`` when the caller built the task itself
            (the Python API, :class:`dlmrl.api.Trainer`, which checks its datasets and reward functions).
    A config that does not choose ``model.kind`` takes the kind its checkpoint was saved as
    (:func:`~dlmrl.config.resolve.adopt_checkpoint_kind`; ``cfg.model.kind`` is set); one that chooses another kind
    is refused.

    Returns:
        The :class:`~dlmrl.config.resolve.RunSpec` that ``--dry-run`` prints and the trainer runs.
    Raises:
        ConfigError: naming the first bad key.
    """
    from dlmrl.data import TASKS
    from dlmrl.estimators import ESTIMATORS, PlanEstimator

    m, t, s, tr, ev = cfg.model, cfg.task, cfg.sampling, cfg.train, cfg.eval
    _check(m.kind in kind_names(), "model.kind", f"unknown policy kind {m.kind!r}; use {', '.join(kind_names())}")
    adopt_checkpoint_kind(cfg)  # (a saved model's recorded kind, unless the config chose one)
    kind = kind_of(m.kind)
    # (first: a preset on the wrong policy kind is the likeliest mistake to report)
    preset = check_algorithm(cfg) if for_training else preset_or_none(cfg)
    from dlmrl.models.families import FAMILIES

    _check(m.family == "auto" or m.family in FAMILIES, "model.family",
           f"unknown family {m.family!r}; known: auto, {', '.join(FAMILIES.names())}")
    conflict = checkpoint_kind_conflict(cfg)  # (a chosen kind the checkpoint contradicts)
    _check(conflict is None, "model.kind", conflict or "")
    kind.check_model(cfg)  # (the kind's own keys: the family, model.block_size, how the task's canvas fits it)
    sudoku_grid = t.name == "sudoku" and t.answer_mode != "text"  # (the tiny model's 16-cell canvas)
    _check(m.dtype in ("float32", "bfloat16", "float16", "float64"), "model.dtype", f"unknown dtype {m.dtype!r}")
    _check_lora(m)
    check_self_conditioning(cfg, kind)
    if kind.estimator_names:  # (a kind that resolves estimator.name itself)
        check_own_estimator(cfg, kind)
    elif not kind.scores_with_estimators:  # (no estimator runs: its keys would be ignored)
        refuse_estimator_keys(cfg)
    _check(t.name in TASKS, "task.name", f"unknown task {t.name!r}; known: {TASKS.names()}")
    check_task_keys(t)
    evaluates = not for_training or ev.before or ev.after or ev.eval_steps > 0
    try:
        task_class(t).check_policy(task_options(t), kind, evaluates)
    except OptionError as e:  # (e.g. a task that evaluates by episodes, which needs an AR policy)
        raise ConfigError(f"config key {task_key(t, e.field)!r}: {e}") from None
    if hasattr(task_class(t), "check_policy_world"):  # (a shipped base asked to serve another world: a warning)
        task_class(t).check_policy_world(task_options(t), m.name_or_path)
    try:
        task_class(t).check_gen_length(task_options(t), s.gen_length)
    except OptionError as e:  # (e.g. the recommend task's reasoning mode in a canvas too short for its chain)
        key = "sampling.gen_length" if e.field == "gen_length" else task_key(t, e.field)
        raise ConfigError(f"config key {key!r}: {e}") from None
    _check(t.answer_mode in ("infill", "full", "text"), "task.answer_mode", "must be 'infill', 'full' or 'text'")
    _check(1 <= t.min_blanks <= t.max_blanks <= 12, "task.min_blanks", "need 1 <= min_blanks <= max_blanks <= 12")
    if data:
        for key, path in (("task.train_file", t.train_file), ("task.test_file", t.test_file)):
            _check(path is None or Path(path).exists(), key, f"file {path} does not exist")
        funcs = check_reward_funcs(cfg)  # (first: the dataset task's data check reports the rows they cannot score)
        test_size = check_data_files(t, funcs)
        if test_size == 0:  # (the dataset task names no held-out data)
            _check(not (ev.before or ev.after or ev.eval_steps), "eval.before",
                   f"task {t.name!r} has no held-out data; set task.test_file, task.test_dataset or task.test_split, "
                   "or turn held-out evaluation off (eval.before: false, eval.after: false, eval.eval_steps: 0)")
        elif evaluates:  # (with held-out evaluation off, eval.num_puzzles is never read)
            _check(ev.num_puzzles <= test_size, "eval.num_puzzles",
                   f"{ev.num_puzzles} puzzles asked, the held-out split has {test_size}")
    _check(not sudoku_grid or s.gen_length == 16, "sampling.gen_length",
           f"the sudoku task's canvas is 16 cells with answer_mode {t.answer_mode!r}; set 16 (answer_mode text "
           "takes any length)")
    _check(s.gen_length >= 1 and s.block_length >= 1, "sampling.gen_length", "lengths must be >= 1")
    # (the blocks the sampler's steps split over; None: no step schedule, e.g. an AR policy samples left to right)
    blocks, where = kind.denoising_blocks(cfg) or (None, "")
    # threshold decoding runs each block until it is decoded: the rollouts' step count is unused (only DaGRPO's
    # anchors, revealed on the plain schedule, read it)
    steps_unused = s.adaptive and getattr(preset, "anchor_threshold", None) is None
    for key, steps in (("sampling.steps", s.steps), ("eval.steps", ev.steps)):
        if key == "eval.steps" and ev.preset != "none" or blocks is None:  # (eval presets: check_eval_protocol)
            continue
        _check(isinstance(steps, int) and not isinstance(steps, bool), key, f"must be an integer, got {steps!r}")
        if key == "sampling.steps" and steps_unused:
            _check(steps >= 1, key, f"must be >= 1, got {steps}")
            continue
        _check(steps >= blocks and steps % blocks == 0, key,
               f"{steps} steps do not split evenly over {blocks} blocks ({where}); use a multiple of {blocks}")
        kind.check_step_count(key, steps, blocks, where, cfg)
    _check(s.temperature >= 0, "sampling.temperature", f"must be a number >= 0, got {s.temperature!r}")  # (NaN too)
    _check(ev.temperature >= 0, "eval.temperature", f"must be a number >= 0, got {ev.temperature!r}")
    check_eval_protocol(cfg, for_training)
    from dlmrl.models.sampler import REMASKING

    _check(s.remasking in REMASKING, "sampling.remasking", f"must be one of {', '.join(REMASKING)}")
    _check(s.cfg_scale >= 0, "sampling.cfg_scale", "must be >= 0")
    _check_threshold(cfg)
    _check_cache(cfg)
    _check_rollout_calls(cfg, preset)
    kind.check_sampling(cfg)  # (threshold decoding, the cache, the early stop, a checkpoint's own code)
    name, e, chosen_by = estimator_choice(cfg, preset)
    try:
        cls = ESTIMATORS.get(name)
    except KeyError as err:
        raise ConfigError(f"config key 'estimator.name': {err.args[0]}") from None
    _check(isinstance(cls, type) and issubclass(cls, PlanEstimator) and dataclasses.is_dataclass(cls), "estimator.name",
           f"{name!r} is registered as {cls!r}, which is not an estimator class (a dataclass subclassing "
           "dlmrl.estimators.PlanEstimator)")
    _check(cls.trainable, "estimator.name", f"{name!r} is not a training estimator (its class sets trainable = False: "
                                            f"NFE {cls.nfe_formula or 'of its own'}; it is for analysis, dlmrl "
                                            "estimators); train with 'sdmc'")
    _check(not (name == "double_mc" and e.masking == "reference" and "masking" not in e.options), "estimator.masking",
           "double_mc with 'reference' masking has infinite expectation (weight 1/t near t = 0); "
           "use exact_count or bernoulli")
    estimator = build_estimator(e, name, estimator_sampling(cfg))  # (a value the class rejects: ConfigError naming the key that set it)
    if kind.scores_with_estimators:
        kind.check_estimator(cfg, name, estimator, e, flat_settings(e))  # (guidance, SPG's blocks on this kind)
        warn_estimator_fields(cfg, name, estimator, e)
    _check(e.merge <= 1 << 20, "estimator.merge", f"must be at most 2^20 (any merge >= the steps scores one canvas), "
           f"got {e.merge}")
    _check(isinstance(e.micro_batch, int) and not isinstance(e.micro_batch, bool) and e.micro_batch >= 0,
           "estimator.micro_batch", f"must be an integer >= 0 (0 = all canvases at once), got {e.micro_batch!r}")
    check_logits_chunk(e)
    _check(tr.learning_rate > 0, "train.learning_rate", "must be > 0")
    # (AdamW's step is lr x m / sqrt(v): above 1 a language model's weights leave any useful range at once, and
    # near float32's largest value torch's update itself overflows with a bare RuntimeError)
    _check(tr.learning_rate <= 1, "train.learning_rate", f"must be <= 1 (AdamW; language models train at 1e-7 to "
                                                         f"1e-3), got {tr.learning_rate}")
    _check(tr.lr_scheduler_type in SCHEDULERS, "train.lr_scheduler_type", f"must be one of {', '.join(SCHEDULERS)}")
    _check(tr.max_steps >= 0, "train.max_steps", "must be >= 0")
    _check(tr.prompts_per_step >= 1, "train.prompts_per_step", "must be >= 1")
    _check(tr.num_generations >= 2, "train.num_generations", "group size G must be >= 2 (advantages need a group)")
    _check(tr.num_iterations >= 1, "train.num_iterations", "must be >= 1")
    check_steps_per_generation(cfg, preset if for_training else None)
    _check(tr.max_grad_norm >= 0, "train.max_grad_norm", "must be >= 0")
    check_rollout_is_cap(cfg, estimator)
    _check(tr.save_steps >= 1, "train.save_steps", "must be >= 1")
    _check(isinstance(tr.sync_ref_model, bool), "train.sync_ref_model", "must be true or false")
    _check(isinstance(tr.ref_model_mixup_alpha, (int, float)) and not isinstance(tr.ref_model_mixup_alpha, bool)
           and 0 < tr.ref_model_mixup_alpha <= 1, "train.ref_model_mixup_alpha",
           f"must be a number in (0, 1], got {tr.ref_model_mixup_alpha!r}")
    _check(isinstance(tr.ref_model_sync_steps, int) and not isinstance(tr.ref_model_sync_steps, bool)
           and tr.ref_model_sync_steps >= 1, "train.ref_model_sync_steps",
           f"must be an integer >= 1, got {tr.ref_model_sync_steps!r}")
    _check(not tr.sync_ref_model or tr.sharding == "none", "train.sync_ref_model",
           f"not supported with train.sharding {tr.sharding!r} yet (the reference would have to be mixed shard by "
           "shard); use train.sharding: none")
    _check(isinstance(tr.collapse_window, int) and not isinstance(tr.collapse_window, bool)
           and tr.collapse_window >= 0, "train.collapse_window", "must be an integer >= 0 (0 = no collapse monitor)")
    _check(isinstance(tr.collapse_ratio, (int, float)) and not isinstance(tr.collapse_ratio, bool)
           and tr.collapse_ratio > 1, "train.collapse_ratio",
           f"must be a number > 1 (a value above this many times its running baseline fires, or with "
           f"train.collapse_direction fall/both a sample_nll below baseline / ratio), got {tr.collapse_ratio!r}")
    _check(tr.collapse_direction in COLLAPSE_DIRECTIONS, "train.collapse_direction",
           f"must be one of {', '.join(COLLAPSE_DIRECTIONS)}, got {tr.collapse_direction!r}")
    _check(isinstance(tr.stop_on_collapse, bool), "train.stop_on_collapse", "must be true or false")
    _check(not tr.stop_on_collapse or tr.collapse_window > 0, "train.stop_on_collapse",
           "needs the collapse monitor (train.collapse_window > 0)")
    _check(tr.logging_steps >= 1, "train.logging_steps", "must be >= 1")
    _check(tr.report_to in ("none", *TRACKERS), "train.report_to",
           f"unknown tracker {tr.report_to!r}; use none, {', '.join(TRACKERS)}")
    _check(tr.report_to == "none" or tracker_available(tr.report_to), "train.report_to",
           f"{tr.report_to!r} needs the {TRACKERS.get(tr.report_to)} package, which is not installed: pip install "
           f"{TRACKERS.get(tr.report_to)} (or use none; metrics.jsonl is always written)")
    _check(tr.sharding in SHARDING_MODES, "train.sharding",
           f"unknown sharding {tr.sharding!r}; use {' or '.join(SHARDING_MODES)}")
    _check(ev.eval_steps >= 0, "eval.eval_steps", "must be >= 0")
    _check(ev.num_puzzles >= 0, "eval.num_puzzles", "must be >= 0 (0 = the whole held-out split)")
    _check(ev.batch_size >= 1, "eval.batch_size", "must be >= 1")
    _check_memory(cfg, preset, estimator, for_training)
    return RunSpec(preset, name, e, estimator, chosen_by)


def _check_threshold(cfg: Config) -> None:
    """``sampling.threshold`` / ``threshold_factor``: ranges, exclusive, low-confidence remasking, diffusion only."""
    s = cfg.sampling
    _check(s.threshold is None or (is_number(s.threshold) and 0 < s.threshold <= 1), "sampling.threshold",
           f"must be in (0, 1] (a probability the drawn token's confidence must reach) or null, got {s.threshold!r}")
    _check(s.threshold_factor is None or (is_number(s.threshold_factor) and s.threshold_factor > 0),
           "sampling.threshold_factor", f"must be > 0 or null, got {s.threshold_factor!r}")
    _check(s.threshold is None or s.threshold_factor is None, "sampling.threshold_factor",
           "set sampling.threshold or sampling.threshold_factor, not both")
    if s.adaptive:
        key = "sampling.threshold" if s.threshold is not None else "sampling.threshold_factor"
        _check(s.remasking == "low_confidence", key,
               f"compares the model's confidence in its drawn token: needs sampling.remasking low_confidence "
               f"(got {s.remasking!r})")


def _check_rollout_calls(cfg: Config, preset) -> None:
    """``sampling.rollout_batch_size`` (an integer >= 0) and ``sampling.stop_at_eos`` (null or a bool; AR rollouts
    always end at EOS); neither applies to tools inside the rollout, whose loop samples every trajectory at once and
    ends turns itself."""
    s = cfg.sampling
    n = s.rollout_batch_size
    _check(isinstance(n, int) and not isinstance(n, bool) and n >= 0, "sampling.rollout_batch_size",
           f"must be an integer >= 0 (rows per sampling call on each process; 0 = all at once), got {n!r}")
    _check(s.stop_at_eos is None or isinstance(s.stop_at_eos, bool), "sampling.stop_at_eos",
           f"must be true, false or null (the kind's default), got {s.stop_at_eos!r}")
    if cfg.train.env is not None and preset is not None and not preset.multi_turn:
        why = "tools inside the rollout (train.env with a single-turn preset) "
        _check(n == 0, "sampling.rollout_batch_size", why + "sample every trajectory in one call; set 0")
        _check(s.stop_at_eos is None, "sampling.stop_at_eos", why + "end each turn themselves; set it null")


def _check_cache(cfg: Config) -> None:
    """``sampling.cache``: a known mode (whether the kind and the family have one: the kind's
    :meth:`~dlmrl.kinds.base.PolicyKind.check_sampling`)."""
    from dlmrl.models.block_cache import CACHE_MODES

    s = cfg.sampling
    _check(s.cache in CACHE_MODES, "sampling.cache", f"must be one of {', '.join(CACHE_MODES)}, got {s.cache!r}")


def _check_lora(m: ModelConfig) -> None:
    """The LoRA fields' ranges (checked whether or not ``use_peft`` is on)."""
    from dlmrl.models.lora import parse_target_modules

    _check(m.lora_r >= 1, "model.lora_r", f"must be >= 1, got {m.lora_r}")
    _check(m.lora_alpha > 0, "model.lora_alpha", f"must be > 0, got {m.lora_alpha}")
    _check(0 <= m.lora_dropout < 1, "model.lora_dropout", f"must be in [0, 1), got {m.lora_dropout}")
    try:
        parse_target_modules(m.lora_target_modules)
    except ValueError as e:
        _check(False, "model.lora_target_modules", str(e))


def _check_memory(cfg: Config, preset, estimator, for_training: bool) -> None:
    """``model.architecture`` and ``train.memory_budget``
    (:func:`dlmrl.training.memory_config.check_memory_config`): malformed values are refused naming the key; a
    training config whose memory plan's peak per process exceeds the budget is warned about."""
    from dlmrl.training.memory_config import check_memory_config

    kind = kind_of(cfg.model.kind)
    nfe = kind.scoring_nfe(estimator, kind.scored_length(cfg))
    check_memory_config(cfg, nfe, objective=preset.objective if preset is not None else None,
                        for_training=for_training)


#: the tiny models ``dlmrl pretrain`` builds: ``task`` -> the kinds (``kind``) it builds for it (the built-in kinds'
#: shipped models, :mod:`dlmrl.pretraining`), and what a refusal of another kind says
PRETRAININGS = {"sudoku": ("diffusion", "block", "ar", "uniform"), "multihop": ("diffusion", "ar"), "recommend": ("ar",)}
PRETRAINING_REFUSALS = {"recommend": "the recommend pretraining builds a causal model (kind: ar)",
                        "multihop": "the block pretraining SFTs on sudoku (task: sudoku)"}


def validate_pretrain(cfg: PretrainConfig) -> None:
    """Check a pretrain config. Raises ``ConfigError`` naming the key."""
    kinds = list(dict.fromkeys(k for built in PRETRAININGS.values() for k in built))
    _check(cfg.kind in kinds, "kind", f"unknown model kind {cfg.kind!r}; use {', '.join(kinds)}")
    for key in ("steps", "batch_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "eval_puzzles"):
        _check(getattr(cfg, key) >= 1, key, "must be >= 1")
    _check(cfg.hidden_size % cfg.num_heads == 0, "num_heads", "must divide hidden_size")
    _check(cfg.learning_rate > 0, "learning_rate", "must be > 0")
    _check(1 <= cfg.min_blanks <= cfg.max_blanks <= 12, "min_blanks", "need 1 <= min_blanks <= max_blanks <= 12")
    _check(cfg.task in ("sudoku", "multihop", "recommend"), "task",
           f"unknown pretraining task {cfg.task!r}; use sudoku, multihop or recommend")
    _check(cfg.task in ("multihop", "recommend") or not cfg.task_options, "task_options",
           "only the multihop and recommend pretrainings read them")
    _check(cfg.kind in PRETRAININGS[cfg.task], "kind", PRETRAINING_REFUSALS.get(cfg.task, ""))
    from dlmrl.config.schema import parse_block_sizes

    try:  # (read by the block pretraining only; a malformed value is refused whatever the kind)
        parse_block_sizes(cfg.block_sizes)
    except ValueError as e:
        raise ConfigError(f"config key 'block_sizes': {e}") from None


def default_job_config(overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """The validated config that ``dlmrl train key=value ...`` (no ``--config``) runs: the default recipe, the
    overrides, and :func:`use_the_algorithms_estimator`. ``Config()`` alone differs from it in the estimator
    (the dataclass leaves ``estimator.name`` null: the algorithm's own).

    Raises:
        ConfigError: a bad override or value (naming the key).
    """
    cfg = Config()
    load_yaml(cfg, default_config_path())
    apply_overrides(cfg, list(overrides))
    use_the_algorithms_estimator(cfg, list(overrides))  # (first: estimator.options are the algorithm's estimator's)
    validate(cfg)
    return cfg
