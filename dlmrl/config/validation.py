"""Checking a config's values against their ranges and the registries before any model loads."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from dlmrl.config.overrides import apply_overrides, load_yaml, part_options
from dlmrl.config.resolve import (
    RunSpec,
    _default_recipe,
    adopt_checkpoint_kind,
    build_estimator,
    build_preset,
    checkpoint_kind_conflict,
    estimator_choice,
    estimator_sampling,
    flat_settings,
    preset_or_none,
    use_the_algorithms_estimator,
)
from dlmrl.config.schema import (
    DIFFUSION_KINDS,
    POLICY_KINDS,
    SCHEDULERS,
    Config,
    EstimatorConfig,
    ModelConfig,
    PretrainConfig,
    SamplingConfig,
    TaskConfig,
    base_kind,
    default_config_path,
)
from dlmrl.config.task_options import check_task, check_task_keys, task_class, task_key, task_options
from dlmrl.errors import ConfigError, OptionError


def _warn(msg: str) -> None:
    """A ``UserWarning`` from the config check (attributed to the caller of :func:`validate`)."""
    import warnings

    warnings.warn(msg, UserWarning, stacklevel=3)


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"config key {key!r}: {msg}")


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
    from dlmrl.evaluation.presets import PRESETS, preset_length_problem
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
    if preset is not None and cfg.model.kind in DIFFUSION_KINDS:
        # `dlmrl eval` decodes the preset's lengths; a training run's held-out evaluations decode sampling.gen_length
        during_training = for_training and (ev.before or ev.after or ev.eval_steps)
        for length in (cfg.sampling.gen_length,) if during_training else preset.gen_lengths:
            problem = preset_length_problem(preset, length)
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
    from dlmrl.estimators import ESTIMATORS, PlanEstimator, Trajectory

    m, t, s, tr, ev = cfg.model, cfg.task, cfg.sampling, cfg.train, cfg.eval
    _check(m.kind in POLICY_KINDS, "model.kind", f"unknown policy kind {m.kind!r}; use {', '.join(POLICY_KINDS)}")
    adopt_checkpoint_kind(cfg)  # (a saved model's recorded kind, unless the config chose one)
    # (first: a preset on the wrong policy kind is the likeliest mistake to report)
    preset = _check_algorithm(cfg) if for_training else preset_or_none(cfg)
    from dlmrl.models.families import FAMILIES

    _check(m.family == "auto" or m.family in FAMILIES, "model.family",
           f"unknown family {m.family!r}; known: auto, {', '.join(FAMILIES.names())}")
    if m.kind != "ar" and m.family != "auto":
        _check_family_matches(m.name_or_path, m.family)
    conflict = checkpoint_kind_conflict(cfg)  # (a chosen kind the checkpoint contradicts)
    _check(conflict is None, "model.kind", conflict or "")
    _check_block_size(cfg)
    sudoku_grid = t.name == "sudoku" and t.answer_mode != "text"  # (the tiny model's 16-cell canvas)
    _check(m.kind != "ar" or not sudoku_grid or t.answer_mode == "full", "task.answer_mode",
           "model.kind 'ar' generates the whole grid left to right: use answer_mode full (or text)")
    _check(m.dtype in ("float32", "bfloat16", "float16", "float64"), "model.dtype", f"unknown dtype {m.dtype!r}")
    _check_lora(m)
    if m.kind == "ar":
        _refuse_ar_estimator_keys(cfg)
    _check(t.name in TASKS, "task.name", f"unknown task {t.name!r}; known: {TASKS.names()}")
    check_task_keys(t)
    evaluates = not for_training or ev.before or ev.after or ev.eval_steps > 0
    try:
        task_class(t).check_policy(task_options(t), m.kind, evaluates)
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
        funcs = _check_reward_funcs(cfg)  # (first: the dataset task's data check reports the rows they cannot score)
        test_size = _check_data_files(t, funcs)
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
    if m.kind == "ar":  # (an AR policy samples left to right: blocks and steps do not apply)
        blocks, where = None, ""
    elif m.kind == "block":  # (the sampler decodes in the model's blocks; the last may be shorter)
        blocks = -(-s.gen_length // m.block_size)
        where = f"⌈sampling.gen_length {s.gen_length} / model.block_size {m.block_size}⌉"
    else:
        _check(s.gen_length % s.block_length == 0, "sampling.block_length",
               f"gen_length {s.gen_length} is not divisible by block_length {s.block_length}")
        blocks = s.gen_length // s.block_length
        where = f"sampling.gen_length {s.gen_length} / sampling.block_length {s.block_length}"
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
        if m.kind == "block" and steps == blocks and m.block_size > 1:
            _warn(f"config key {key!r}: {steps} steps over {blocks} blocks ({where}) decode each block of "
                  f"{m.block_size} tokens in one step, all of them at once from one forward pass; use "
                  f"{blocks * m.block_size} for one token per step")
    _check(s.temperature >= 0, "sampling.temperature", f"must be a number >= 0, got {s.temperature!r}")  # (NaN too)
    _check(ev.temperature >= 0, "eval.temperature", f"must be a number >= 0, got {ev.temperature!r}")
    check_eval_protocol(cfg, for_training)
    from dlmrl.models.sampler import REMASKING

    _check(s.remasking in REMASKING, "sampling.remasking", f"must be one of {', '.join(REMASKING)}")
    _check(s.cfg_scale >= 0, "sampling.cfg_scale", "must be >= 0")
    _check_threshold(cfg)
    _check_cache(cfg)
    _check_rollout_calls(cfg, preset)
    _check_remote_code(cfg)  # (after the sampler's checks: a family's missing cache is the more specific error)
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
    _check(not (issubclass(cls, Trajectory) and m.kind in DIFFUSION_KINDS and s.cfg_scale > 0), "sampling.cfg_scale",
           "the trajectory estimator scores the sampler's own token distribution, but with classifier-free "
           "guidance the sampler draws from guided logits the scorer does not compute; set cfg_scale 0 or use an "
           "ELBO estimator")
    _check(not (name == "double_mc" and e.masking == "reference" and "masking" not in e.options), "estimator.masking",
           "double_mc with 'reference' masking has infinite expectation (weight 1/t near t = 0); "
           "use exact_count or bernoulli")
    estimator = build_estimator(e, name, estimator_sampling(cfg))  # (a value the class rejects: ConfigError naming the key that set it)
    _warn_estimator_fields(cfg, name, estimator, e)
    _check_spg_blocks(cfg, estimator, e)
    _check(e.merge <= 1 << 20, "estimator.merge", f"must be at most 2^20 (any merge >= the steps scores one canvas), "
           f"got {e.merge}")
    _check(isinstance(e.micro_batch, int) and not isinstance(e.micro_batch, bool) and e.micro_batch >= 0,
           "estimator.micro_batch", f"must be an integer >= 0 (0 = all canvases at once), got {e.micro_batch!r}")
    _check_logits_chunk(e)
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
    _check_steps_per_generation(cfg, preset if for_training else None)
    _check(tr.max_grad_norm >= 0, "train.max_grad_norm", "must be >= 0")
    _check_rollout_is_cap(cfg, estimator)
    _check(tr.save_steps >= 1, "train.save_steps", "must be >= 1")
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


def _check_steps_per_generation(cfg: Config, preset) -> None:
    """``train.steps_per_generation``: an integer >= 1 that divides ``train.prompts_per_step`` (mini-batches of
    equally many whole groups), and above 1 only for a loss that needs no statistics over the whole batch. With
    the ``preset`` (training), warn about configured keys that cannot act because every update sees ratio 1
    (:func:`_warn_inert_ratio`)."""
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
    _warn_inert_ratio(cfg, preset)


def _warn_inert_ratio(cfg: Config, preset) -> None:
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


def _check_block_size(cfg: Config) -> None:
    """``model.block_size``: the block kind's block (an integer >= 1, at most the completion; resolved from the
    checkpoint's config.json when null), no guidance, and ``sampling.block_length`` left alone or equal to it.
    Other kinds: unset."""
    m, s = cfg.model, cfg.sampling
    if m.kind != "block":
        _check(m.block_size is None, "model.block_size",
               f"is the block size of a block-diffusion policy; model.kind is {m.kind!r} (set model.kind block, or "
               "remove model.block_size; a full-diffusion sampler's semi-autoregressive block is sampling.block_length)")
        return
    if m.block_size is None:
        from dlmrl.models.loading import checkpoint_block_size

        try:
            m.block_size = checkpoint_block_size(m.name_or_path, m.family)
        except ValueError as e:  # (config.json records a bad block_size: named with its value)
            raise ConfigError(f"config key 'model.block_size': model.kind block needs a block size, and {e}") from None
        _check(m.block_size is not None, "model.block_size",
               f"model.kind block needs a block size, and the config.json of {m.name_or_path!r} (and its family) "
               "records none or "
               "could not be read (a hub checkpoint's needs the hub); set model.block_size")
        chosen = False
    else:
        chosen = True
    b = m.block_size
    _check(isinstance(b, int) and not isinstance(b, bool) and b >= 1, "model.block_size",
           f"must be an integer >= 1, got {b!r}")
    if chosen:
        _warn_untrained_block_size(m)
    _check(b <= s.gen_length, "model.block_size",
           f"{b} is longer than the completion (sampling.gen_length {s.gen_length}); one block is "
           f"model.block_size {s.gen_length}")
    default_length = SamplingConfig().block_length
    _check(s.block_length in (default_length, b), "sampling.block_length",
           f"does not apply to model.kind block, which decodes in the model's blocks (model.block_size {b}); remove "
           f"it (got {s.block_length})")
    _check(s.cfg_scale == 0, "sampling.cfg_scale", "classifier-free guidance is not implemented for model.kind block "
                                                   "(set it 0)")


def _warn_untrained_block_size(m: ModelConfig) -> None:
    """Warn when ``model.block_size`` is not a size the local checkpoint was trained with, as its ``config.json``
    records them (``block_sizes``, the sizes of dlmrl's block pretraining; else ``block_size``, SDAR's): the model
    then decodes blocks it never saw. Hub ids are not fetched here; an unreadable config is left to the load."""
    import warnings

    from dlmrl.models.loading import read_checkpoint_config, resolve_model_path

    path = Path(resolve_model_path(m.name_or_path))
    if not (path / "config.json").is_file():
        return
    try:
        config = read_checkpoint_config(str(path))
    except (OSError, ValueError):
        return
    is_size = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1
    sizes, recorded = config.get("block_sizes"), config.get("block_size")
    if isinstance(sizes, list) and sizes and all(map(is_size, sizes)):
        trained, what = sizes, f"block_sizes {sizes}"
    elif is_size(recorded):
        trained, what = [recorded], f"block_size {recorded}"
    else:
        return
    if m.block_size not in trained:
        warnings.warn(f"config key 'model.block_size': {m.block_size} is not a block size {m.name_or_path!r} was "
                      f"trained with (its config.json records {what}); it will decode blocks of a size it never saw "
                      f"(remove model.block_size to use {recorded if is_size(recorded) else trained[0]})",
                      UserWarning, stacklevel=4)


#: Families whose checkpoints always ship their own model code (``auto_map``): loading runs it.
CODE_SHIPPING_FAMILIES = ("llada", "dream", "sdar", "llada2")


def _local_families(name_or_path: str) -> list[str] | None:
    """The registered families whose ``detect`` accepts a local checkpoint's ``config.json`` (read as JSON, no code
    runs); ``None`` for a hub id or a folder without one."""
    from pathlib import Path

    from dlmrl.models.families import FAMILIES
    from dlmrl.models.loading import read_checkpoint_config, resolve_model_path

    path = Path(resolve_model_path(name_or_path))
    if not (path / "config.json").is_file():
        return None
    config = read_checkpoint_config(str(path))
    return [name for name in FAMILIES.names() if FAMILIES.get(name).detect(config)]


def _check_family_matches(name_or_path: str, family: str) -> None:
    """An explicit ``model.family`` must not contradict a local checkpoint's ``config.json`` (read as JSON, no code
    runs): a config that one other family recognises, and this one does not, would load with the wrong adapter and
    fail inside it (or, worse, run). Hub ids and configs no family or several recognise are left to the load."""
    found = _local_families(name_or_path)
    if found is None:
        return
    _check(len(found) != 1 or found[0] == family, "model.family",
           f"{family!r} does not match {name_or_path!r}, whose config.json is a {found[0] if found else ''!r} "
           f"checkpoint; use model.family auto (or {found[0] if found else ''!r})")


def _check_remote_code(cfg: Config) -> None:
    """``model.trust_remote_code`` must be on for a checkpoint that ships its own model code: a family whose
    checkpoints all do, or a local folder whose ``config.json`` says so (read as JSON, no code runs). A hub id of an
    undetected family is checked when it loads."""
    m = cfg.model
    if m.kind == "ar" or m.trust_remote_code:
        return
    why = None
    if m.family in CODE_SHIPPING_FAMILIES:
        why = f"model.family {m.family!r} checkpoints ship their own model code"
    else:
        from pathlib import Path

        from dlmrl.models.loading import needs_remote_code, read_checkpoint_config, resolve_model_path

        path = Path(resolve_model_path(m.name_or_path))
        if (path / "config.json").is_file() and needs_remote_code(read_checkpoint_config(str(path))):
            why = f"{m.name_or_path!r} ships its own model code (config.json auto_map)"
    _check(why is None, "model.trust_remote_code",
           f"{why}, and loading it runs that code: set model.trust_remote_code=true if you trust its source")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_threshold(cfg: Config) -> None:
    """``sampling.threshold`` / ``threshold_factor``: ranges, exclusive, low-confidence remasking, diffusion only."""
    s = cfg.sampling
    _check(s.threshold is None or (_is_number(s.threshold) and 0 < s.threshold <= 1), "sampling.threshold",
           f"must be in (0, 1] (a probability the drawn token's confidence must reach) or null, got {s.threshold!r}")
    _check(s.threshold_factor is None or (_is_number(s.threshold_factor) and s.threshold_factor > 0),
           "sampling.threshold_factor", f"must be > 0 or null, got {s.threshold_factor!r}")
    _check(s.threshold is None or s.threshold_factor is None, "sampling.threshold_factor",
           "set sampling.threshold or sampling.threshold_factor, not both")
    if s.adaptive:
        key = "sampling.threshold" if s.threshold is not None else "sampling.threshold_factor"
        _check(s.remasking == "low_confidence", key,
               f"compares the model's confidence in its drawn token: needs sampling.remasking low_confidence "
               f"(got {s.remasking!r})")
        _check(cfg.model.kind in DIFFUSION_KINDS, key,
               "is a diffusion-sampler setting; model.kind 'ar' decodes left to right (set it null)")


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
    _check(not (cfg.model.kind == "ar" and s.stop_at_eos is False), "sampling.stop_at_eos",
           "model.kind 'ar' always ends a completion at EOS (transformers' generate stops there); set it null")
    if cfg.train.env is not None and preset is not None and not preset.multi_turn:
        why = "tools inside the rollout (train.env with a single-turn preset) "
        _check(n == 0, "sampling.rollout_batch_size", why + "sample every trajectory in one call; set 0")
        _check(s.stop_at_eos is None, "sampling.stop_at_eos", why + "end each turn themselves; set it null")


def _check_cache(cfg: Config) -> None:
    """``sampling.cache``: a known mode, diffusion only, no guidance, and a family that has a cache when it is named or
    a local checkpoint's ``config.json`` shows it (``model.family: auto`` on a hub id is checked when the model
    loads)."""
    from dlmrl.models.block_cache import CACHE_MODES

    s = cfg.sampling
    _check(s.cache in CACHE_MODES, "sampling.cache", f"must be one of {', '.join(CACHE_MODES)}, got {s.cache!r}")
    if s.cache == "none":
        return
    _check(cfg.model.kind != "block", "sampling.cache",
           "is the approximate block cache of a bidirectional model; model.kind 'block' always decodes with its exact "
           "key/value cache of finished blocks (set it none)")
    _check(cfg.model.kind == "diffusion", "sampling.cache",
           "is the diffusion sampler's block cache; model.kind 'ar' decodes with transformers' own key/value cache "
           "(set it none)")
    _check(s.cfg_scale == 0, "sampling.cache", "is not implemented with classifier-free guidance (sampling.cfg_scale "
                                               "> 0); set one of them off")
    family = cfg.model.family
    if family in (None, "auto"):  # (a local checkpoint's family is known from its config.json without loading it)
        found = _local_families(cfg.model.name_or_path)
        family = found[0] if found and len(found) == 1 else None
    if family is not None:
        check_cache_family(family, s.cache)


def check_cache_family(family: str | None, mode: str, model: str | None = None) -> None:
    """Refuse ``sampling.cache = mode`` for a model family without a block cache (validation, when the family is
    named; the trainer, once ``family: auto`` has been detected at load).

    Raises:
        ConfigError: naming ``sampling.cache``, the model when given, the family and why.
    """
    from dlmrl.models.families import cached_logits_of

    try:
        cached_logits_of(family, mode)
    except ValueError as err:
        where = f" with model {model!r}" if model else ""
        raise ConfigError(f"config key 'sampling.cache'{where}: {err}") from None


def _check_spg_blocks(cfg: Config, estimator, e: EstimatorConfig) -> None:
    """SPG's block masks tile the canvas the sampler fills: their length must divide ``sampling.gen_length``
    (``e``: the section the estimator was built from, whose key set the length)."""
    from dlmrl.estimators import SPGEstimator

    if not isinstance(estimator, SPGEstimator) or cfg.model.kind != "diffusion":
        return
    key = SPGEstimator.config_key("block_length", flat_settings(e), e.options)
    block, length = estimator.block_length, cfg.sampling.gen_length
    _check(length % block == 0, key, f"the spg block masks' length {block} must divide sampling.gen_length {length}")


def _check_rollout_is_cap(cfg: Config, estimator) -> None:
    """``train.rollout_is_cap``: ``>= 1``, and only where the old-policy scores are the sampler's own distribution."""
    cap = cfg.train.rollout_is_cap
    if cap is None:
        return
    _check(_is_number(cap) and cap >= 1, "train.rollout_is_cap",
           f"must be >= 1 (a cap below 1 would scale down tokens the rollout drew exactly as the policy would) or "
           f"null, got {cap!r}")
    _check(cfg.model.kind in DIFFUSION_KINDS, "train.rollout_is_cap",
           "corrects diffusion rollouts; model.kind 'ar' rollouts record no log-probs (set it null)")
    from dlmrl.estimators import Trajectory

    settings = estimator.describe().settings
    exact = isinstance(estimator, Trajectory) and estimator.merge == 1 and estimator.order == "sampled"
    _check(exact, "train.rollout_is_cap",
           f"needs estimator.name trajectory with estimator.merge 1 and estimator.order sampled, the exact "
           f"likelihood of the sampler's own steps (got {estimator.name!r}, merge {settings.get('merge')}, order "
           f"{settings.get('order')!r}): other estimators' per-token scores are not log-probs of the distribution "
           "the rollout drew from")


#: ``estimator`` keys that tune how any kind scores (chunks of rows or canvases, of positions), AR included
SCORING_KEYS = ("micro_batch", "logits_chunk")


def _check_logits_chunk(e: EstimatorConfig) -> None:
    _check(isinstance(e.logits_chunk, int) and not isinstance(e.logits_chunk, bool) and e.logits_chunk >= 0,
           "estimator.logits_chunk", f"must be an integer >= 0 (scored positions per output-head call; 0 = full "
           f"logits), got {e.logits_chunk!r}")


def _refuse_ar_estimator_keys(cfg: Config) -> None:
    """An AR policy scores its completions by their exact token log-probs: no estimator runs, so an ``estimator.*``
    key other than :data:`SCORING_KEYS` (checked here: the AR scorer reads them) that the user set
    (:func:`~dlmrl.config.overrides.user_keys`: an override, their YAML file, the API's dict; at a default's value
    too), or that is set away from its default (or the default recipe's value), would be ignored silently; refused,
    naming it. The default recipe's own estimator section and a run's saved config are not the user's."""
    from dlmrl.config.overrides import user_keys

    e = cfg.estimator
    defaults = (EstimatorConfig(), _default_recipe().estimator)
    chosen = user_keys(cfg) or frozenset()
    _check(isinstance(e.micro_batch, int) and not isinstance(e.micro_batch, bool) and e.micro_batch >= 0,
           "estimator.micro_batch", f"must be an integer >= 0 (rows per forward call; 0 = all), got {e.micro_batch!r}")
    _check_logits_chunk(e)
    for f in dataclasses.fields(e):
        if f.name in SCORING_KEYS:  # (rows per forward call and positions per head call: AR scoring reads them)
            continue
        value = getattr(e, f.name)
        key = f"estimator.{f.name}"
        if any(k == key or k.startswith(key + ".") for k in chosen) or all(value != getattr(d, f.name)
                                                                           for d in defaults):
            raise ConfigError(f"config key 'estimator.{f.name}': model.kind 'ar' scores exact token log-probs (no "
                              f"likelihood estimator runs, so estimator settings do not apply); remove "
                              f"estimator.{f.name} (got {value!r}), or train a diffusion policy (model.kind diffusion)")


def _warn_estimator_fields(cfg: Config, name: str, estimator, e: EstimatorConfig) -> None:
    """Warn about flat ``estimator`` fields set away from their defaults that the estimator's class does not read
    (:meth:`~dlmrl.estimators.configurable.ConfigurableEstimator.reads`; they would be ignored silently), and about
    training with an estimator of infinite variance. A value of the dataclass defaults or of the default recipe
    counts as unset, so ``dlmrl train estimator.name=sdmc`` does not blame the user for the recipe's own
    ``merge: 2``."""
    import warnings

    from dlmrl.estimators import Coupled, DoubleMC

    if cfg.model.kind not in DIFFUSION_KINDS:
        return
    flat = flat_settings(e)
    reads = type(estimator).reads(flat)
    defaults = [flat_settings(d) for d in (EstimatorConfig(), _default_recipe().estimator)]
    ignored = [k for k, v in flat.items() if k not in reads and all(v != d[k] for d in defaults)]
    if ignored:
        warnings.warn(f"config keys {', '.join(f'estimator.{k}' for k in ignored)} do not apply to the {name!r} "
                      f"estimator (it reads {', '.join(sorted(reads)) or 'none of them'}; its own settings go in "
                      "estimator.options) and are ignored", UserWarning, stacklevel=3)
    bernoulli_dmc = isinstance(estimator, DoubleMC) and estimator.masking == "bernoulli"
    bernoulli_coupled = (isinstance(estimator, Coupled) and estimator.masking == "bernoulli"
                         and (estimator.t_min == 0 or estimator.t_max == 1))
    if bernoulli_dmc or bernoulli_coupled:
        warnings.warn(f"estimator {name!r} with bernoulli masking{'' if bernoulli_dmc else ' and t reaching 0 or 1'} "
                      "has infinite variance (a lone masked token weighs 1/t as t -> 0): its gradients are heavy-"
                      "tailed; exact_count masking (or sdmc) is unbiased with finite variance", UserWarning,
                      stacklevel=3)


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


def _check_algorithm(cfg: Config):
    """The preset exists, its overrides are valid, it runs on ``model.kind`` and the trainer supports it; returns
    the preset (:func:`~dlmrl.config.resolve.build_preset`)."""
    from dlmrl.objectives.advantages import SCALE_REWARDS

    tr, kind = cfg.train, cfg.model.kind
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
    _check(base_kind(kind) in preset.policies, "train.algorithm",
           f"{tr.algorithm!r} runs on {' and '.join(preset.policies)} policies only, but model.kind is {kind!r}")
    _check(preset.adaptive_temperature_tau is None or kind == "ar", "train.algorithm",
           f"{tr.algorithm!r} samples with HAPO's adaptive temperature, which needs model.kind 'ar'")
    _check(isinstance(tr.max_completions, int) and tr.max_completions >= 0, "train.max_completions",
           "must be an integer >= 0 (0 = no rollout budget)")
    _check_rollout_parts(cfg, preset)
    return preset


def _check_rollout_parts(cfg: Config, preset) -> None:
    """Dynamic sampling, anchors, episodes and tools inside the rollout: combinations the trainer runs, the
    environment, the advantage."""
    from dlmrl.envs import ENVS, default_env

    tr, algo = cfg.train, cfg.train.algorithm
    if preset.multi_turn:
        _check(cfg.model.kind == "ar", "train.algorithm", f"{algo!r} plays multi-turn episodes: model.kind 'ar' only")
        _check(not preset.dynamic_sampling and preset.anchor_threshold is None, "train.algorithm",
               f"{algo!r}: multi-turn episodes cannot be combined with dynamic sampling or anchors")
        env = tr.env or default_env(cfg.task.name)
        _check(env is not None, "train.env", f"task {cfg.task.name!r} has no default environment; set train.env "
                                             f"(known: {', '.join(ENVS.names())})")
        _check_env(cfg, env)
    elif tr.env is not None:  # tools inside the rollout: one growing sequence per trajectory (training/tool_loop.py)
        env = tr.env
        _check_env(cfg, env)
        if cfg.model.kind == "diffusion":  # (segment rounds: any ELBO estimator; the trajectory would be inexact)
            from dlmrl.config.resolve import estimator_name

            _check(estimator_name(cfg) != "trajectory", "train.env",
                   f"tools inside a full-diffusion rollout ({algo!r} scores with the trajectory estimator): under "
                   "bidirectional attention the turns decoded before an observation attended masks where it now "
                   "stands, so the trajectory likelihood would not be the sampler's; use model.kind block, or an ELBO "
                   "estimator (estimator.name sdmc, double_mc, ...), which scores the finished sequence")
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
        from dlmrl.objectives.shaping import generation_budget

        budget = generation_budget(cfg.model.kind, cfg.sampling.gen_length, preset)  # (the run's max_length)
        extra = ("" if cfg.model.kind != "ar" else " and EOS" if preset.overlong_cache_fraction is None
                 else ", EOS and DAPO's overlong cache")
        _check(budget >= turn, "sampling.gen_length",
               f"{budget} tokens (sampling.gen_length {cfg.sampling.gen_length}{extra}) is the whole trajectory's "
               f"budget with the tools inside the rollout (actions and observations); it cannot hold one turn of "
               f"task.options.turn_length {turn} tokens")


def _check_env(cfg: Config, env: str) -> None:
    """``env`` a registered environment that serves the task, and ``train.max_turns`` a turn limit (episodes and
    tools inside the rollout alike)."""
    from dlmrl.envs import ENVS

    _check(env in ENVS, "train.env", f"unknown environment {env!r}; known: {', '.join(ENVS.names())}")
    tasks = getattr(ENVS.get(env), "tasks", ())
    _check(cfg.task.name in tasks, "train.env", f"environment {env!r} serves tasks {tasks}, not {cfg.task.name!r}")
    _check(isinstance(cfg.train.max_turns, int) and cfg.train.max_turns >= 1, "train.max_turns",
           "must be an integer >= 1")


def _check_data_files(t: TaskConfig, reward_functions=None) -> int | float:
    """Check the task's fields and load its local data files up front (bad records fail here, naming the config
    key, the file, the line and the field), through the task class's ``check_options``.

    Returns the number of held-out examples, or ``math.inf`` when they come from the hub (not downloaded
    here; the run loads and checks them).

    Raises:
        ConfigError: naming the key (``task.test_file``, ``task.prompt_template``, ...).
    """
    _check(isinstance(t.num_numbers, int) and t.num_numbers >= 0, "task.num_numbers", "must be >= 0 (0 = all)")
    _check(t.verify_timeout > 0, "task.verify_timeout", "must be > 0 seconds")
    _check(t.verify_workers >= 1, "task.verify_workers", "must be >= 1")
    _check(t.num_proc is None or t.num_proc >= 1, "task.num_proc", "must be >= 1 (or null)")
    for key in ("dataset", "subset", "split", "test_dataset", "test_split", "prompt_template"):
        value = getattr(t, key)
        _check(value is None or value.strip() != "", f"task.{key}", "must not be empty (use null for the default)")
    from dlmrl.rewards.functions import RewardFunctionError

    try:
        size = check_task(t, reward_functions)
    except ConfigError:
        raise
    except RewardFunctionError as e:  # (a function whose signature does not fit the data's columns)
        raise ConfigError(f"config key 'train.reward_funcs': {e}") from None
    except OptionError as e:  # (the task's check names the setting it refuses)
        raise ConfigError(f"config key {task_key(t, e.field)!r}: {e}") from None
    except (ValueError, TypeError) as e:
        # (the built-in tasks' checks start their message with the key: "task.test_file: ...")
        key, sep, msg = str(e).partition(": ")
        if sep and key.startswith("task.") and " " not in key:
            raise ConfigError(f"config key {task_key(t, key)!r}: {msg}") from None
        # a data file's own problem (a bad record, not UTF-8) names the file first: blame the key that names it,
        # not the config file the run was started from
        for name in ("train_file", "test_file", "dataset", "test_dataset"):
            source = getattr(t, name)
            if source and str(e).startswith(str(source)):
                raise ConfigError(f"config key 'task.{name}': {e}") from None
        raise ConfigError(str(e)) from None
    return math.inf if size is None else size


def _check_reward_funcs(cfg: Config):
    """``train.reward_funcs`` / ``reward_weights``: set exactly for tasks that read them (the dataset task), every
    entry a registry name or an import string that imports (the user's module is imported here, before any model
    is loaded), one weight per function.

    Returns:
        The :class:`~dlmrl.rewards.functions.RewardFunctions`, or ``None`` for a task with a reward of its own.
    Raises:
        ConfigError: naming the key, and for an import string the module and the attribute.
    """
    from dlmrl.rewards.functions import RewardFunctions

    tr, t = cfg.train, cfg.task
    if not task_class(t).takes_reward_funcs:
        _check(not tr.reward_funcs, "train.reward_funcs",
               f"task {t.name!r} scores completions with its own reward; reward functions score your own prompts "
               "(task.name dataset)")
        _check(not tr.reward_weights, "train.reward_weights", "there are no train.reward_funcs to weigh")
        return None
    _check(bool(tr.reward_funcs), "train.reward_funcs",
           f"task {t.name!r} has no reward of its own: name at least one reward function, a registry name (dlmrl list "
           "rewards) or an import string module:function")
    try:
        return RewardFunctions(tr.reward_funcs, tr.reward_weights, what="")
    except (ValueError, TypeError, ImportError) as e:
        key = "train.reward_weights" if str(e).startswith("reward_weights") else "train.reward_funcs"
        raise ConfigError(f"config key {key!r}: {e}") from None


def _check_memory(cfg: Config, preset, estimator, for_training: bool) -> None:
    """``model.architecture`` and ``train.memory_budget``
    (:func:`dlmrl.training.memory_config.check_memory_config`): malformed values are refused naming the key; a
    training config whose memory plan's peak per process exceeds the budget is warned about."""
    from dlmrl.training.memory_config import check_memory_config

    nfe = 1 if cfg.model.kind == "ar" else estimator.describe(cfg.sampling.gen_length).nfe
    check_memory_config(cfg, nfe, objective=preset.objective if preset is not None else None,
                        for_training=for_training)


def validate_pretrain(cfg: PretrainConfig) -> None:
    """Check a pretrain config. Raises ``ConfigError`` naming the key."""
    _check(cfg.kind in POLICY_KINDS, "kind", f"unknown model kind {cfg.kind!r}; use {', '.join(POLICY_KINDS)}")
    for key in ("steps", "batch_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "eval_puzzles"):
        _check(getattr(cfg, key) >= 1, key, "must be >= 1")
    _check(cfg.hidden_size % cfg.num_heads == 0, "num_heads", "must divide hidden_size")
    _check(cfg.learning_rate > 0, "learning_rate", "must be > 0")
    _check(1 <= cfg.min_blanks <= cfg.max_blanks <= 12, "min_blanks", "need 1 <= min_blanks <= max_blanks <= 12")
    _check(cfg.task in ("sudoku", "multihop", "recommend"), "task",
           f"unknown pretraining task {cfg.task!r}; use sudoku, multihop or recommend")
    _check(cfg.task in ("multihop", "recommend") or not cfg.task_options, "task_options",
           "only the multihop and recommend pretrainings read them")
    _check(cfg.task != "recommend" or cfg.kind == "ar", "kind", "the recommend pretraining builds a causal model (kind: ar)")
    _check(cfg.kind != "block" or cfg.task == "sudoku", "kind", "the block pretraining SFTs on sudoku (task: sudoku)")
    if cfg.kind == "block":
        from dlmrl.kinds import parse_block_sizes

        try:
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
