"""What a config's ``task`` section resolves to: the registered task class, its options object, the task.

A task's settings are a frozen dataclass of its own (:class:`dlmrl.data.task.Task`'s ``options_class``). They come
from two places in the config: the flat ``task.<key>`` keys of :class:`~dlmrl.config.schema.TaskConfig`
(``task.min_blanks``, ``task.prompt_template``, ...: every field of the options class named like one of them), and
the ``task.options`` mapping (any field of the options class by its own name: a task registered from outside the
package takes its settings there); ``task.options`` wins where both set one. A flat key set away from its
default that the task's options class does not have would be ignored: :func:`check_task_keys` warns about it
(or refuses it, with the reason, where the task lists it in ``refused_keys``).
"""

from __future__ import annotations

import dataclasses
import warnings

from dlmrl.config.overrides import part_options
from dlmrl.config.schema import TaskConfig
from dlmrl.errors import ConfigError, OptionError

__all__ = ["build_task", "check_task", "check_task_keys", "task_class", "task_options"]

#: TaskConfig keys that are not a task's settings
_NOT_SETTINGS = ("name", "options")


def task_class(t: TaskConfig) -> type:
    """The registered task class ``t.name`` names.

    Raises:
        ConfigError: an unknown name (with the known ones).
    """
    from dlmrl.data.task import TASKS

    if t.name not in TASKS:
        raise ConfigError(f"config key 'task.name': unknown task {t.name!r}; known: {TASKS.names()}")
    return TASKS.get(t.name)


def _flat(t: TaskConfig) -> dict:
    return {f.name: getattr(t, f.name) for f in dataclasses.fields(TaskConfig) if f.name not in _NOT_SETTINGS}


def _options_class(t: TaskConfig) -> type:
    return task_class(t).options_class_for({**_flat(t), **t.options})


def task_options(t: TaskConfig):
    """The options object of ``t``'s task: the flat keys its options class has, then ``t.options`` over them.

    Raises:
        ConfigError: an unknown task, or a ``task.options`` name the options class does not have (did-you-mean) or
            a value of the wrong type, naming ``task.options.<name>``.
    """
    cls = _options_class(t)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    given = part_options(cls, t.options, "task.options")
    try:
        return cls(**{**{k: v for k, v in _flat(t).items() if k in names}, **given})
    except OptionError as e:  # (a check in the options class's __post_init__ that names its field)
        raise ConfigError(f"config key {task_key(t, e.field)!r}: {e}") from None
    except (ValueError, TypeError) as e:
        raise ConfigError(f"config key 'task.options': {cls.__name__}: {e}") from None


def task_key(t: TaskConfig, field: str) -> str:
    """The config key that set the task setting ``field``: ``task.options.<field>`` when ``task.options`` gives it,
    else the flat ``task.<field>`` (a field with no flat key: ``task.options.<field>``)."""
    field = field.removeprefix("task.options.").removeprefix("task.")
    flat = {f.name for f in dataclasses.fields(TaskConfig)}  # (a task's own setting has no flat key)
    return f"task.options.{field}" if field in t.options or field not in flat else f"task.{field}"


def check_task_keys(t: TaskConfig) -> None:
    """Check ``t.options`` against the task's options class (:func:`task_options`), refuse the flat keys ``t``'s task
    lists in ``refused_keys`` and warn about the others it does not read, when set away from their default (they
    would be ignored silently).

    Raises:
        ConfigError: a bad ``task.options`` entry; a refused key, naming it with the task's reason.
    Warns:
        UserWarning: naming the ignored keys and the settings the task has.
    """
    task_options(t)
    cls, options_cls = task_class(t), _options_class(t)
    reads = {f.name for f in dataclasses.fields(options_cls) if f.init}
    defaults = TaskConfig()
    unread = [k for k, v in _flat(t).items() if k not in reads and v != getattr(defaults, k)]
    for key in unread:
        if key in cls.refused_keys:
            raise ConfigError(f"config key 'task.{key}': {cls.refused_keys[key]} (got {getattr(t, key)!r})")
    if unread:
        warnings.warn(f"config keys {', '.join(f'task.{k}' for k in unread)} do not apply to the {t.name!r} task "
                      f"({options_cls.__name__}: {', '.join(sorted(reads)) or 'no settings'}) and are ignored",
                      UserWarning, stacklevel=3)


def check_task(t: TaskConfig, reward_functions=None) -> int | None:
    """The task's own up-front check of its options (``Task.check_options``: local data files loaded): the number
    of held-out examples, ``None`` when unknown (hub data), 0 when the task has none. A task that takes
    ``train.reward_funcs`` also gets ``reward_functions`` (to report the rows they cannot score as it loads them).

    Raises:
        ConfigError: from :func:`task_options`. ValueError: the task's, naming the setting.
    """
    cls = task_class(t)
    if cls.takes_reward_funcs and reward_functions is not None:
        return cls.check_options(task_options(t), reward_functions=reward_functions)
    return cls.check_options(task_options(t))


def build_task(t: TaskConfig, tokenizer, mask_token_id: int | None, gen_length: int | None = None, **resources):
    """The task ``t`` describes: ``Task.from_options(task_options(t), tokenizer, mask_token_id, gen_length,
    **resources)``.

    Args:
        gen_length: canvas length for the tasks whose canvas is not fixed (the trainer passes
            ``sampling.gen_length``); Sudoku's grid is always 16.
        resources: objects built outside the config (the dataset task's ``reward_functions``).
    Raises:
        ConfigError: an unknown task or a bad ``task.options`` entry.
    """
    return task_class(t).from_options(task_options(t), tokenizer, mask_token_id, gen_length, **resources)
