"""Configs: the schema (nested dataclasses whose field docs are the ``--help`` text), YAML files and
``key=value`` overrides, what a config resolves to (preset, estimator), and validation.

Every unknown key or bad value raises ``ConfigError`` naming the key (and the file and line for YAML
input) before any model is loaded. Option names follow TRL's ``GRPOConfig`` where one exists.

- :mod:`dlmrl.config.schema`: the dataclasses;
- :mod:`dlmrl.config.overrides`: YAML files and ``key=value`` overrides onto them;
- :mod:`dlmrl.config.resolve`: the algorithm preset and training estimator a config names, resolved once into a
  :class:`RunSpec`;
- :mod:`dlmrl.config.task_options`: the task a config names, its options object (flat keys and ``task.options``);
- :mod:`dlmrl.config.validation`: range and registry checks (``validate`` returns the :class:`RunSpec`), the
  default job.
"""

from dlmrl.config.overrides import (
    apply_mapping,
    apply_overrides,
    flatten,
    load_yaml,
    locate_error,
    mapping_keys,
    save_yaml,
    to_dict,
)
from dlmrl.config.resolve import (
    RunSpec,
    adopt_checkpoint_kind,
    build_estimator,
    build_preset,
    estimator_name,
    estimator_settings,
    preset_overrides,
    resolve_run,
    use_the_algorithms_estimator,
)
from dlmrl.config.schema import (
    DEFAULT_TRAIN_CONFIG,
    SCHEDULERS,
    Config,
    EstimatorConfig,
    EvalConfig,
    ModelConfig,
    PretrainConfig,
    SamplingConfig,
    TaskConfig,
    TrainConfig,
    default_config_path,
    doc,
    help_text,
    iter_fields,
)
from dlmrl.config.task_options import build_task, check_task_keys, task_options
from dlmrl.config.validation import (
    TRACKERS,
    check_cache_family,
    default_job_config,
    tracker_available,
    validate,
    validate_pretrain,
)
from dlmrl.errors import ConfigError

__all__ = [
    "DEFAULT_TRAIN_CONFIG", "SCHEDULERS", "TRACKERS", "Config", "ConfigError", "EstimatorConfig", "EvalConfig",
    "ModelConfig", "PretrainConfig", "RunSpec", "SamplingConfig", "TaskConfig", "TrainConfig",
    "adopt_checkpoint_kind", "apply_mapping", "apply_overrides", "build_estimator", "build_preset", "build_task",
    "check_cache_family", "check_task_keys",
    "default_config_path", "default_job_config", "doc", "estimator_name", "estimator_settings", "flatten",
    "help_text", "iter_fields", "load_yaml", "locate_error", "mapping_keys", "preset_overrides", "resolve_run",
    "save_yaml", "task_options", "to_dict", "tracker_available", "use_the_algorithms_estimator", "validate",
    "validate_pretrain",
]
