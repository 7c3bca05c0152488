"""The config check of a task's data: its local files loaded and checked up front, its reward functions resolved."""

from __future__ import annotations

import math

from dlmrl.config.schema import Config, TaskConfig
from dlmrl.config.task_options import check_task, task_class, task_key
from dlmrl.errors import ConfigError, OptionError
from dlmrl.kinds import check_key as _check


def check_data_files(t: TaskConfig, reward_functions=None) -> int | float:
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


def check_reward_funcs(cfg: Config):
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
