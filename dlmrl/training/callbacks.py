"""Callbacks: user code the trainer calls as a run goes (the hook names of ``transformers``' ``TrainerCallback``).

A callback is any object with one or more of these methods (subclass :class:`Callback` to get the others as
no-ops):

- ``on_log(record)``: a step's metrics as written to ``metrics.jsonl`` (every ``train.logging_steps`` steps; on
  the main process only, as the file is written);
- ``on_step_end(step, record)``: after every step, on every process, with the step just finished (1-based) and
  its metrics;
- ``on_evaluate(metrics)``: after every held-out evaluation (before training, every ``eval.eval_steps``, after
  training, and :meth:`dlmrl.api.Trainer.evaluate`), with the task's metrics.

A callback that raises stops the run there (its exception propagates; the last checkpoint stays resumable).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["HOOKS", "Callback", "Callbacks"]

#: the methods the trainer calls
HOOKS = ("on_log", "on_step_end", "on_evaluate")


class Callback:
    """A callback whose hooks do nothing; override the ones you need."""

    def on_log(self, record: dict) -> None:
        """A step's logged metrics (``metrics.jsonl``'s line)."""

    def on_step_end(self, step: int, record: dict) -> None:
        """Step ``step`` (1-based) is done; ``record`` holds its metrics."""

    def on_evaluate(self, metrics: dict) -> None:
        """A held-out evaluation's metrics."""


class Callbacks:
    """The run's callbacks; calling ``callbacks.on_log(record)`` calls every callback's ``on_log`` that exists,
    in order.

    Raises:
        TypeError: a callback with none of the hooks (:data:`HOOKS`), naming it: most likely a typo in a method
            name or a class passed instead of an instance.
    """

    def __init__(self, callbacks: Iterable | None = ()):
        if callbacks is None:
            callbacks = ()
        elif not isinstance(callbacks, (list, tuple)):
            callbacks = (callbacks,)
        self.callbacks = list(callbacks)
        for cb in self.callbacks:
            if isinstance(cb, type) or not any(callable(getattr(cb, h, None)) for h in HOOKS):
                raise TypeError(f"callback {cb!r} has none of the methods {', '.join(HOOKS)}"
                                f"{' (a class: pass an instance)' if isinstance(cb, type) else ''}")

    def _call(self, hook: str, *args) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, hook, None)
            if callable(fn):
                fn(*args)

    def on_log(self, record: dict) -> None:
        self._call("on_log", record)

    def on_step_end(self, step: int, record: dict) -> None:
        self._call("on_step_end", step, record)

    def on_evaluate(self, metrics: dict) -> None:
        self._call("on_evaluate", metrics)
