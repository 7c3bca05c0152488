"""What a config resolves to: its algorithm preset, its training estimator, the default job."""

from __future__ import annotations

import dataclasses
import functools

from dlmrl.config.overrides import _resolve_key, load_yaml
from dlmrl.config.schema import Config, EstimatorConfig, SamplingConfig, TrainConfig, default_config_path
from dlmrl.errors import ConfigError


def estimator_settings(cfg: Config) -> tuple[str, EstimatorConfig]:
    """The training estimator's name and settings: ``estimator.name`` with the ``estimator`` section as it is;
    with the name null, the algorithm preset's recipe estimator (``AlgorithmPreset.estimator``; diffu_grpo:
    one_step, just_grpo: trajectory) with the recipe's ``estimator_options`` over the section (just_grpo:
    ``order: left_to_right``); else ``sdmc``. An invalid algorithm setting counts as having none (validation
    reports it)."""
    if cfg.estimator.name is not None:
        return cfg.estimator.name, cfg.estimator
    try:
        preset = build_preset(cfg)
    except ConfigError:
        return "sdmc", cfg.estimator
    if preset.estimator is None:
        return "sdmc", cfg.estimator
    return preset.estimator, dataclasses.replace(cfg.estimator, **dict(preset.estimator_options))


def estimator_name(cfg: Config) -> str:
    """The training estimator's name (:func:`estimator_settings`)."""
    return estimator_settings(cfg)[0]


def build_estimator(e: EstimatorConfig, name: str | None = None, sampling: SamplingConfig | None = None):
    """The estimator the ``estimator`` section describes (``factory.make_estimator``; raises its ValueError).

    ``name`` (e.g. :func:`estimator_name`) replaces ``e.name``; with both ``None`` it is ``sdmc``. ``sampling``
    (default: the defaults) gives the trajectory estimator its temperature (``sampling.temperature``, 1 when
    greedy) and steps (the most a rollout takes: ``gen_length`` with threshold decoding), and SPG its block length
    when ``estimator.mask_block_length`` is 0.
    """
    from dlmrl.estimators.factory import make_estimator

    s = sampling or SamplingConfig()
    return make_estimator(name or e.name or "sdmc", e.num_nodes, e.samples_per_node, e.masking, e.stratified,
                          e.p_mask_prompt, e.t_min, e.t_max, e.merge, e.order, e.eubo_beta, e.mix_weight,
                          e.mask_block_length or s.block_length, s.temperature if s.temperature > 0 else 1.0,
                          s.max_steps)


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
    return out


def build_preset(cfg: Config):
    """``get_algorithm(train.algorithm, **overrides)``; errors become ``ConfigError`` naming the field."""
    import warnings

    from dlmrl.objectives.presets import get_algorithm

    fields = {"ratio_level": "importance_sampling_level"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (a sequence ratio with a token-summed loss warns)
        try:
            return get_algorithm(cfg.train.algorithm, **preset_overrides(cfg.train))
        except ValueError as err:
            msg = str(err)
            if "unknown algorithm" in msg:
                key = "algorithm"
            else:
                first = msg.split()[0]
                key = fields.get(first, first if first in {f.name for f in dataclasses.fields(TrainConfig)}
                                 else ("advantage" if "advantage" in msg else "algorithm"))
            raise ConfigError(f"config key 'train.{key}': {msg}") from None


@functools.lru_cache(maxsize=1)
def _default_recipe() -> Config:
    """The packaged default recipe, read once (callers only read it)."""
    recipe = Config()
    load_yaml(recipe, default_config_path())
    return recipe


def use_the_algorithms_estimator(cfg: Config, overrides: list[str]) -> bool:
    """Give a config built on the default recipe its algorithm's own estimator when ``overrides`` change the
    algorithm but name no ``estimator.*`` key; True if it did. Prints a line on stderr saying so.

    The default recipe's estimator (``trajectory``, merge 2) is its GDPO's choice; ``dlmrl train
    algorithm=diffu_grpo`` means diffu_grpo with its own estimator (``one_step``), as a config file naming no
    estimator gets (``estimator.name: null`` = the preset's recipe estimator). Only for a diffusion model and an
    estimator section the overrides left as the recipe has it.
    """
    import sys

    recipe = _default_recipe()
    chosen = any(_resolve_key(Config, o.split("=", 1)[0].strip()).startswith("estimator.") for o in overrides)
    if (cfg.model.kind != "diffusion" or cfg.train.algorithm == recipe.train.algorithm or chosen
            or cfg.estimator != recipe.estimator):
        return False
    cfg.estimator = EstimatorConfig()
    print(f"dlmrl: train.algorithm={cfg.train.algorithm}: the default recipe's estimator ({recipe.estimator.name}, "
          f"merge {recipe.estimator.merge}) is its {recipe.train.algorithm}'s; using {cfg.train.algorithm}'s own "
          f"({estimator_name(cfg)}; set an estimator.* key to choose another)", file=sys.stderr)
    return True
