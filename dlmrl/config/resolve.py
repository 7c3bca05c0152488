"""What a config resolves to, once: its algorithm preset and training estimator (:class:`RunSpec`), the default job.

Validation, ``dlmrl train --dry-run`` and the trainer read the same :class:`RunSpec`
(:func:`~dlmrl.config.validate` returns it).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlmrl.config.overrides import _resolve_key, load_yaml, user_keys
from dlmrl.config.schema import Config, EstimatorConfig, SamplingConfig, TrainConfig, default_config_path
from dlmrl.errors import ConfigError, OptionError
from dlmrl.kinds import find_kind, kind_names, kind_of

if TYPE_CHECKING:
    from dlmrl.estimators import PlanEstimator
    from dlmrl.objectives.presets import AlgorithmPreset


#: ``estimator`` fields that are not flat estimator settings: the choice, the class's own options, the chunking
NOT_FLAT = ("name", "options", "micro_batch", "logits_chunk", "self_conditioning")


def flat_settings(e: EstimatorConfig) -> dict:
    """The section's flat settings (every field but :data:`NOT_FLAT`), as the estimator classes read them."""
    return {f.name: getattr(e, f.name) for f in dataclasses.fields(e) if f.name not in NOT_FLAT}


@dataclass(frozen=True)
class RunSpec:
    """A config resolved once: what validation checked, ``--dry-run`` prints and training builds.

    Attributes:
        preset: the algorithm preset with the ``train`` section's overrides (:func:`build_preset`); ``None`` only
            for a config resolved for evaluation whose algorithm is invalid (evaluation trains nothing).
        estimator_name: the training estimator's registry name.
        estimator_section: the ``estimator`` section it is built from: with ``estimator.name`` null, the preset's
            recipe settings applied (:func:`estimator_choice`).
        estimator: the built estimator (:func:`build_estimator`); an AR policy scores exactly and leaves it unused.
        chosen_by: what chose it: ``estimator.name``, ``the preset's recipe`` or ``the default``.
    """

    preset: AlgorithmPreset | None
    estimator_name: str
    estimator_section: EstimatorConfig
    estimator: PlanEstimator
    chosen_by: str


def estimator_choice(cfg: Config, preset: AlgorithmPreset | None) -> tuple[str, EstimatorConfig, str]:
    """The training estimator's name, the section it is built from, and what chose it.

    ``estimator.name`` with the section as it is; with the name null, the preset's recipe estimator
    (``AlgorithmPreset.estimator``; diffu_grpo: one_step, just_grpo: trajectory) with the recipe's
    ``estimator_options`` applied (flat keys over the section, e.g. just_grpo's ``order: left_to_right``; any other
    key is one of the class's own fields and goes under ``estimator.options``, which the user's options override);
    else ``sdmc``. ``preset`` ``None`` (an invalid algorithm, reported by validation) counts as naming none. A kind
    that resolves ``estimator.name`` itself (``estimator_names``, e.g. ``uniform``) gets the section without its name
    and options here: its own estimator is the kind's (:meth:`~dlmrl.kinds.base.PolicyKind.own_estimator`).
    """
    e = cfg.estimator
    kind = find_kind(cfg.model.kind)
    if kind is not None and kind.estimator_names:
        # (the kind resolves estimator.name itself, PolicyKind.own_estimator: the masked default stands in, unused)
        e = dataclasses.replace(e, name=None, options={})
    if e.name is not None:
        return e.name, e, "estimator.name"
    if preset is None or preset.estimator is None:
        return "sdmc", e, "the default (the preset names no estimator)"
    recipe = dict(preset.estimator_options)
    flat = {k: v for k, v in recipe.items() if k in flat_settings(e)}
    own = {k: v for k, v in recipe.items() if k not in flat}
    return preset.estimator, dataclasses.replace(e, **flat, options={**own, **e.options}), "the preset's recipe"


def preset_or_none(cfg: Config) -> AlgorithmPreset | None:
    """:func:`build_preset`, or ``None`` for an invalid algorithm setting (validation reports it)."""
    try:
        return build_preset(cfg)
    except ConfigError:
        return None


def estimator_settings(cfg: Config) -> tuple[str, EstimatorConfig]:
    """The training estimator's name and section (:func:`estimator_choice`)."""
    return estimator_choice(cfg, preset_or_none(cfg))[:2]


def estimator_name(cfg: Config) -> str:
    """The training estimator's name (:func:`estimator_settings`)."""
    return estimator_settings(cfg)[0]


def build_estimator(e: EstimatorConfig, name: str | None = None, sampling: SamplingConfig | None = None):
    """The estimator the ``estimator`` section describes: ``cls.from_config(flat settings, sampling, options)``
    of the registered class (:meth:`dlmrl.estimators.configurable.ConfigurableEstimator.from_config`).

    ``name`` (e.g. :func:`estimator_name`) replaces ``e.name``; with both ``None`` it is ``sdmc``. ``sampling``
    (default: the defaults) gives the trajectory estimator its temperature and steps, and SPG its block length
    when ``estimator.mask_block_length`` is 0.

    Raises:
        ConfigError: an unknown name (on ``estimator.name``, with a did-you-mean), an ``estimator.options`` key
            that is not a field of the class (``estimator.options.<key>``), or a value the class rejects (the key
            that set it).
    """
    from dlmrl.config.overrides import part_options
    from dlmrl.estimators import ESTIMATORS

    name = name or e.name or "sdmc"
    try:
        cls = ESTIMATORS.get(name)
    except KeyError as err:
        raise ConfigError(f"config key 'estimator.name': {err.args[0]}") from None
    own = part_options(cls, e.options, "estimator.options")
    return cls.from_config(flat_settings(e), sampling or SamplingConfig(), own)


def _recorded_kind(cfg: Config) -> tuple[str | None, bool]:
    """(the kind ``cfg.model.name_or_path`` records, or ``None``; whether the config chose ``model.kind``: the user's
    YAML file, an override or the API's dict set it (:func:`~dlmrl.config.overrides.user_keys`; not the packaged
    recipe nor a run's saved config), or a config built in Python holds a kind other than the default)."""
    from dlmrl.models.loading import checkpoint_kind

    m = cfg.model
    keys = user_keys(cfg)
    return checkpoint_kind(m.name_or_path, kind_names()), ("model.kind" in keys if keys is not None else m.kind != type(m)().kind)


def adopt_checkpoint_kind(cfg: Config) -> None:
    """Give ``cfg`` the policy kind its checkpoint was saved as (``config.json``'s ``dlmrl_kind``, a LoRA folder's
    note: :func:`dlmrl.models.loading.checkpoint_kind`) when the config did not choose ``model.kind``, so ``dlmrl
    eval --model moved/final_model`` and ``Trainer("moved/final_model")`` run a block or causal model as one, not as
    full diffusion. A chosen kind is left for :func:`checkpoint_kind_conflict` to check, and so is a kind that runs
    the recorded one (:meth:`~dlmrl.kinds.base.PolicyKind.accepts_checkpoint`: the Python API's kind of a policy
    object of a kind of your own over a saved masked-diffusion model). Idempotent; nothing is fetched for a hub id
    (it records nothing here).

    Raises:
        ConfigError: a recorded value that is not a kind (naming the file).
    """
    recorded, chosen = _recorded_kind(cfg)
    kind = find_kind(cfg.model.kind)
    runs_it = kind is not None and recorded is not None and kind.accepts_checkpoint(recorded)
    if recorded is not None and not chosen and not runs_it:
        cfg.model.kind = recorded


def checkpoint_kind_conflict(cfg: Config) -> str | None:
    """Why ``model.kind`` contradicts the kind its checkpoint records (a shipped name: the shipped models of the
    configured kind to use instead), else ``None``."""
    from dlmrl.models.checkpoint_keys import KIND_KEY
    from dlmrl.models.loading import SHIPPED_KINDS, is_shipped

    m = cfg.model
    recorded, _ = _recorded_kind(cfg)
    kind = find_kind(m.kind)
    if recorded is None or recorded == m.kind or (kind is not None and kind.accepts_checkpoint(recorded)):
        return None
    how = "shipped" if is_shipped(m.name_or_path) else "saved"
    instead = [name for name, kind in SHIPPED_KINDS.items() if kind == m.kind]
    use = f"use {' or '.join(map(repr, instead))}, " if is_shipped(m.name_or_path) and instead else ""
    return (f"model.name_or_path {m.name_or_path!r} is a {how} {recorded} model (its saved config records "
            f"{KIND_KEY}: {recorded}) but model.kind is {m.kind!r}; {use}set model.kind {recorded} or leave it out")


def estimator_sampling(cfg: Config) -> SamplingConfig:
    """The ``sampling`` section as the estimator sees one denoising run: the config's own, or for ``model.kind:
    block`` that of one block (``gen_length = block_length = model.block_size``, ``steps`` per block), so the
    trajectory estimator's NFE counts a block's steps (its passes cover every block at once) and SPG's masks tile
    the policy's blocks."""
    return kind_of(cfg.model.kind).estimator_sampling(cfg)


def resolve_run(cfg: Config, for_training: bool = True) -> RunSpec:
    """The config's :class:`RunSpec`, without :func:`~dlmrl.config.validate`'s range checks (``validate`` returns
    the same object after them; this is for a config known to be valid).

    Raises:
        ConfigError: as :func:`build_preset` (for training) and :func:`build_estimator`.
    """
    preset = build_preset(cfg) if for_training else preset_or_none(cfg)
    name, section, chosen_by = estimator_choice(cfg, preset)
    return RunSpec(preset, name, section, build_estimator(section, name, estimator_sampling(cfg)), chosen_by)


#: ``train`` keys that are :class:`~dlmrl.objectives.objective.GroupObjective` fields of the same name
#: (null = the preset's); ``importance_sampling_level`` is ``ratio_level``
OBJECTIVE_KEYS = ("epsilon", "epsilon_high", "beta", "loss_type", "max_completion_length", "clip_rule", "dual_clip",
                  "delta", "weighting", "egsw_alpha", "egsw_temperature", "entropy_num_groups", "entropy_top_fraction",
                  "espo_alpha", "vocab_size", "hapo_entropy_pivot", "hapo_clip_alpha", "hapo_advantage_beta",
                  "kl_kind", "kl_level", "kl_reference", "anchor_weight")
#: keys whose 0 means "off" (the objective's None), since null already means "the preset's"
_ZERO_IS_NONE = ("max_completion_length", "dual_clip", "delta")


def preset_overrides(tr: TrainConfig) -> dict:
    """The preset parts the ``train`` section sets (TRL names mapped to :class:`GroupObjective` fields)."""
    out = {k: getattr(tr, k) for k in OBJECTIVE_KEYS if getattr(tr, k) is not None}
    out.update({k: None for k in _ZERO_IS_NONE if out.get(k) == 0})
    if tr.importance_sampling_level is not None:
        out["ratio_level"] = tr.importance_sampling_level
    if tr.scale_rewards is not None:
        out["advantage"] = tr.scale_rewards  # (TRL's names are the advantage estimators' names)
    if tr.advantage is not None:
        out["advantage"] = tr.advantage
    if tr.dynamic_sampling_max_rounds is not None:
        out["dynamic_sampling_max_rounds"] = tr.dynamic_sampling_max_rounds
    if tr.part_options:
        # (a value that is no mapping is validation's to report, naming its key: here it is left out)
        out["part_options"] = {kind: dict(own) for kind, own in tr.part_options.items() if isinstance(own, dict)}
    return out


#: the ``train.*`` key of a preset or objective field whose name differs (TRL's names)
_TRAIN_KEYS = {"ratio_level": "importance_sampling_level"}


def build_preset(cfg: Config):
    """``get_algorithm(train.algorithm, **overrides)``; errors become ``ConfigError`` naming the field."""
    import warnings

    from dlmrl.objectives.presets import get_algorithm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (a sequence ratio with a token-summed loss warns)
        try:
            return get_algorithm(cfg.train.algorithm, **preset_overrides(cfg.train))
        except OptionError as err:  # (a setting: the train.* key that set it, by the field the check names)
            msg, key = str(err), _TRAIN_KEYS.get(err.field, err.field)
            if key.split(".")[0] not in {f.name for f in dataclasses.fields(TrainConfig)}:
                key = "algorithm"
        except ValueError as err:  # (an unknown algorithm)
            msg, key = str(err), "algorithm"
    raise ConfigError(f"config key 'train.{key}': {msg}") from None


@functools.lru_cache(maxsize=1)
def _default_recipe() -> Config:
    """The packaged default recipe, read once (callers only read it)."""
    recipe = Config()
    load_yaml(recipe, default_config_path())
    return recipe


def use_the_algorithms_estimator(cfg: Config, overrides: list[str]) -> bool:
    """Give a config built on the default recipe its algorithm's own estimator when ``overrides`` change the
    algorithm but name no ``estimator.*`` key that chooses one (``estimator.options``, ``micro_batch``, ``logits_chunk`` and ``self_conditioning`` tune the one that runs); True if it did. Prints a line on stderr saying so.

    The default recipe's estimator (``trajectory``, merge 2) is its GDPO's choice; ``dlmrl train
    algorithm=diffu_grpo`` means diffu_grpo with its own estimator (``one_step``), as a config file naming no
    estimator gets (``estimator.name: null`` = the preset's recipe estimator). Only for a diffusion model and an
    estimator section the overrides left as the recipe has it.
    """
    import sys

    recipe = _default_recipe()
    # (estimator.options and estimator.micro_batch tune whichever estimator runs: they choose none)
    tuning = ("estimator.options", "estimator.micro_batch", "estimator.logits_chunk", "estimator.self_conditioning")
    chosen = any(k.startswith("estimator.") and not k.startswith(tuning)
                 for k in (_resolve_key(Config, o.split("=", 1)[0].strip()) for o in overrides))
    untuned = dataclasses.replace(cfg.estimator, options=recipe.estimator.options,
                                  micro_batch=recipe.estimator.micro_batch,
                                  logits_chunk=recipe.estimator.logits_chunk,
                                  self_conditioning=recipe.estimator.self_conditioning)
    # (a kind that runs no estimator has none to choose; an unknown kind is refused by the config check)
    kind = find_kind(cfg.model.kind)
    runs_none = kind is not None and not kind.scores_with_estimators
    if (runs_none or cfg.train.algorithm == recipe.train.algorithm or chosen
            or untuned != recipe.estimator):
        return False
    cfg.estimator = EstimatorConfig(options=cfg.estimator.options, micro_batch=cfg.estimator.micro_batch,
                                    logits_chunk=cfg.estimator.logits_chunk,
                                    self_conditioning=cfg.estimator.self_conditioning)
    print(f"dlmrl: train.algorithm={cfg.train.algorithm}: the default recipe's estimator ({recipe.estimator.name}, "
          f"merge {recipe.estimator.merge}) is its {recipe.train.algorithm}'s; using {cfg.train.algorithm}'s own "
          f"({estimator_name(cfg)}; set an estimator.* key to choose another)", file=sys.stderr)
    return True
