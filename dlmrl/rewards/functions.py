"""Reward functions as TRL's ``GRPOTrainer`` takes them: resolved by name, called per batch, weighted and summed.

A reward function has TRL's signature ``f(prompts, completions, **columns) -> list[float | None]``: ``prompts``
and ``completions`` are lists of ``B`` entries (strings, or for chat-message prompts TRL's conversational form:
the prompt's messages and ``[{"role": "assistant", "content": text}]``), each dataset column other than the
prompt arrives as a keyword argument holding a list of ``B`` values aligned with the completions, and the
function returns one value per completion, ``None`` where it does not apply.

:class:`RewardFunctions` holds the functions of a run: :meth:`~RewardFunctions.table` calls each once per batch
and checks what it returns, :meth:`~RewardFunctions.combine` is TRL's weighted sum (``None`` counts as NaN and
is left out of the sum: ``nansum``), :meth:`~RewardFunctions.metrics` TRL's per-function log
(``rewards/<name>/mean`` and ``rewards/<name>/std``, NaN-aware).

**Non-finite values** (our rule): a function that returns NaN, ``inf`` or ``-inf`` for a completion is read as
returning ``None`` there (not applicable: left out of the sum and of its mean), with a warning naming the function
(once per function and run); so rewards, advantages and every logged mean stay finite. A step in which *no*
completion gets a finite value from any function stops the run (:mod:`dlmrl.training.finite`).

Source: TRL ``trl/trainer/grpo_trainer.py`` (``GRPOTrainer._calculate_rewards``: ``None`` → NaN,
``(rewards_per_func * reward_weights).nansum(dim=1)``, a warning when every function returned ``None`` for a
row; ``_generate_and_score_completions``: ``rewards/{name}/mean`` = ``nanmean``, ``/std`` = ``nanstd``, Bessel-
corrected; ``reward_func.__name__`` as the name).
"""

from __future__ import annotations

import inspect
import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

#: the largest float32: a reward beyond it would be stored as an infinity
_FLOAT32_MAX = torch.finfo(torch.float32).max

__all__ = ["RewardFunctionError", "RewardFunctions", "ScoresEachReward", "gold_column_problems", "resolve_reward_func"]


class RewardFunctionError(ValueError):
    """A reward function returned something other than one number or ``None`` per completion; the message names
    the function, what it returned and what was expected."""


def _name_of(fn: Callable) -> str:
    """TRL's name for a reward function: its ``__name__`` (a ``functools.partial``: its function's)."""
    inner = getattr(fn, "func", fn)
    return getattr(fn, "__name__", None) or getattr(inner, "__name__", None) or type(fn).__name__


def resolve_reward_func(spec: str | Callable, what: str = "reward_funcs") -> tuple[str, Callable]:
    """A reward function and its name from a callable, a registry name (:data:`dlmrl.rewards.REWARDS`: the name
    is the registry name) or an import string ``module:function`` (:func:`dlmrl.plugins.import_object`; the name
    is the function's ``__name__``).

    Args:
        spec: what the user gave.
        what: how errors name it (``"config key 'train.reward_funcs' entry 0"``).
    Raises:
        ValueError: an unknown registry name (listing close and known names).
        TypeError: neither a callable nor a string, or an import string naming something that is not callable.
        dlmrl.plugins.PluginError: an import string whose module or attribute cannot be found (naming both).
    """
    if callable(spec):
        return _name_of(spec), spec
    if not isinstance(spec, str):
        raise TypeError(f"{what}: expected a reward function, a registry name or an import string module:function, "
                        f"got {type(spec).__name__} {spec!r}")
    if not spec.strip():
        raise ValueError(f"{what}: an empty name; give a registry name or an import string module:function")
    spec = spec.strip()
    if ":" not in spec and "." not in spec:  # (registry names have no dots; import strings have one or the other)
        from dlmrl.rewards import REWARDS

        try:
            return spec, REWARDS.get(spec)
        except KeyError as e:
            raise ValueError(f"{what}: {e.args[0]}; a function of your own is named by an import string "
                             "module:function (e.g. my_pkg.rewards:exact_match)") from None
    from dlmrl.plugins import import_object

    fn = import_object(spec, what)
    if not callable(fn):
        raise TypeError(f"{what}: {spec!r} is a {type(fn).__name__}, not a function")
    return _name_of(fn), fn


def _unique(names: list[str]) -> tuple[str, ...]:
    """Names made unique by a ``_2``, ``_3``, ... suffix on repeats (two lambdas would share one log key)."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}_{seen[n]}")
    return tuple(out)


class RewardFunctions:
    """The reward functions of a run with their weights.

    Args:
        funcs: callables, registry names or import strings (:func:`resolve_reward_func`), at least one.
        weights: one weight per function (TRL's ``reward_weights``); ``None`` = all 1.
        what: how errors name the list (``"reward_funcs"``; ``""`` when the caller names it, as config
            validation does).
    Attributes:
        names: one name per function (``__name__``, the registry name; repeats get ``_2``, ``_3``, ...).
        weights: ``(F,)`` float32.
    Raises:
        ValueError, TypeError: no function, a weight count other than the function count, a weight that is not a
            finite number, or a function :func:`resolve_reward_func` refuses.
    """

    def __init__(self, funcs: Sequence[str | Callable], weights: Sequence[float] | None = None,
                 what: str = "reward_funcs"):
        if isinstance(funcs, (str, bytes)) or callable(funcs):
            funcs = [funcs]
        funcs = list(funcs)
        if not funcs:
            raise ValueError(f"{what}: give at least one reward function")
        resolved = [resolve_reward_func(f, f"{what} entry {i}".strip()) for i, f in enumerate(funcs)]
        self.funcs = [fn for _, fn in resolved]
        self.names = _unique([name for name, _ in resolved])
        weights = [1.0] * len(funcs) if weights is None or len(weights) == 0 else list(weights)
        if len(weights) != len(funcs):
            raise ValueError(f"reward_weights: {len(weights)} weights for {len(funcs)} reward functions "
                             f"({', '.join(self.names)}); give one per function, or none (all 1)")
        for i, w in enumerate(weights):
            if not (isinstance(w, numbers.Real) and not isinstance(w, bool) and math.isfinite(w)):
                raise ValueError(f"reward_weights entry {i}: expected a finite number, got {w!r}")
        self.weights = torch.tensor([float(w) for w in weights], dtype=torch.float32)  # (F,)
        self._warned_all_none = False
        self._warned_non_finite: set[str] = set()

    def __len__(self) -> int:
        return len(self.funcs)

    def check_signatures(self, columns: Sequence[str], source: str) -> None:
        """Refuse, when the data loads, a function whose signature cannot take the data's columns: a parameter
        without a default that no column fills (it would raise a bare ``TypeError`` at the first scoring, after the
        "before" evaluation), a column it has no parameter for and no ``**kwargs`` to take it, or fewer than two
        positional parameters (``prompts`` and ``completions``). A function whose signature cannot be read is
        left to its call.

        Args:
            columns: the names of the columns the functions receive (every column but the prompt's).
            source: how errors name the data (a file, ``"train_dataset"``).
        Raises:
            RewardFunctionError: naming the function, the parameter or column, and the columns the data has.
        """
        has = ", ".join(repr(c) for c in columns) or "none besides the prompt"
        for name, fn in zip(self.names, self.funcs):
            problem = _signature_problem(fn, set(columns))
            if problem:
                raise RewardFunctionError(f"reward function {name!r} {problem} ({source} has the columns {has}); "
                                          "a reward function is f(prompts, completions, **columns) with one keyword "
                                          "argument per column other than the prompt")

    def check_rows(self, columns: dict[str, Sequence], locations: Sequence[str]) -> None:
        """Report, when the data loads, the rows a function says it cannot score: a function may carry
        ``check_columns(columns) -> [(row, problem), ...]`` (dlmrl's ``math`` and ``gsm8k`` rewards do: an empty or
        non-numeric gold answer); it scores those rows ``None``, so the run goes on without them.

        Args:
            columns: column name → one value per row. locations: one label per row (``"<file> line 7"``).
        Warns:
            UserWarning: per function, naming how many rows and the first few with their problem.
        """
        for name, fn in zip(self.names, self.funcs):
            check = getattr(fn, "check_columns", None)
            problems = check(columns) if callable(check) else []
            if problems:
                shown = "; ".join(f"{locations[i] if i < len(locations) else f'row {i}'}: {why}"
                                  for i, why in problems[:5])
                warnings.warn(f"reward function {name!r} cannot score {len(problems)} of {len(locations)} rows (it "
                              f"gives them None: not applicable): {shown}{' ...' if len(problems) > 5 else ''}",
                              UserWarning, stacklevel=2)

    def table(self, prompts: Sequence[Any], completions: Sequence[Any], columns: dict[str, Sequence],
              locations: Sequence[str] | None = None) -> torch.Tensor:
        """Every function on one batch: ``(B, F)`` float32, NaN where a function returned ``None`` or a non-finite
        number (NaN, ``inf``, ``-inf``: read as ``None``, with a warning once per function).

        A function that raises on the batch is called again row by row, so one bad row cannot stop a run: the rows
        that raise again get NaN (as ``None``) and a warning names them and the error; when every row raises the
        fault is the function's, and it propagates.

        Args:
            prompts, completions: ``B`` entries each (TRL's forms, module docstring).
            columns: column name → ``B`` values, passed as keyword arguments.
            locations: ``B`` labels naming each row's source (``"<file> line 7"``) for the warnings.
        Raises:
            RewardFunctionError: a function returned no sequence, a sequence of another length than ``B``, or
                an entry that is neither a real number nor ``None``; naming the function, the length got and
                expected, or the row and the value.
            Exception: what a function raised on every row of the batch.
        """
        B = len(completions)
        out = torch.empty(B, len(self.funcs), dtype=torch.float32)
        if B == 0:  # (a process whose share of the batch is empty: no call, which a user function may not expect)
            return out
        for j, (name, fn) in enumerate(zip(self.names, self.funcs)):
            try:
                values = fn(list(prompts), list(completions), **columns)
            except Exception as e:  # noqa: BLE001 (isolate the rows that make it fail; re-raised if all do)
                values = self._row_by_row(name, fn, prompts, completions, columns, locations, e)
            if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
                raise RewardFunctionError(f"reward function {name!r} returned {type(values).__name__} "
                                          f"{_short(values)}; it must return a list of {B} values (one float or None "
                                          "per completion)")
            if len(values) != B:
                raise RewardFunctionError(f"reward function {name!r} returned {len(values)} values for {B} "
                                          f"completions (expected {B}: one float or None per completion, in the "
                                          "order of the completions)")
            non_finite = []
            for i, v in enumerate(values):
                if v is None:
                    out[i, j] = math.nan
                elif isinstance(v, numbers.Real):
                    x = float(v)
                    if not abs(x) <= _FLOAT32_MAX:  # (NaN, ±inf, or beyond float32's range: read as None)
                        x = math.nan
                        non_finite.append((i, v))
                    out[i, j] = x
                else:
                    raise RewardFunctionError(f"reward function {name!r} returned {type(v).__name__} {_short(v)} "
                                              f"for completion {i}; expected a float or None")
            if non_finite and name not in self._warned_non_finite:  # (once per function: it would repeat)
                self._warned_non_finite.add(name)
                i, v = non_finite[0]
                warnings.warn(f"reward function {name!r} returned {len(non_finite)} non-finite values of {B} (e.g. "
                              f"{v} for completion {i}); they count as None (not applicable: left out of the sum "
                              "and of its mean). Return a finite number, or None (shown once; the run goes on)",
                              UserWarning, stacklevel=2)
        missing = torch.isnan(out).all(dim=1)
        if bool(missing.any()) and not self._warned_all_none:  # (once per run: it would repeat at every step)
            self._warned_all_none = True
            i = int(missing.nonzero()[0])
            warnings.warn(f"{int(missing.sum())} of {B} completions got None from every reward function (their "
                          f"reward is 0), e.g. completion {i}: {_short(completions[i])}; make at least one function "
                          "return a number for each completion (shown once; the run goes on)", UserWarning,
                          stacklevel=2)
        return out

    @staticmethod
    def _row_by_row(name: str, fn: Callable, prompts, completions, columns, locations, error: Exception) -> list:
        """``fn`` called on each row alone after it raised ``error`` on the batch: ``None`` for the rows that raise."""
        B = len(completions)
        values: list = []
        failed: list[tuple[int, Exception]] = []
        for i in range(B):
            try:
                row = fn([prompts[i]], [completions[i]], **{k: [v[i]] for k, v in columns.items()})
            except Exception as e:  # noqa: BLE001
                failed.append((i, e))
                values.append(None)
                continue
            if isinstance(row, (str, bytes, dict)) or not hasattr(row, "__len__") or len(row) != 1:
                raise error  # (the function does not score rows alone: its batch error is the one to report)
            values.append(row[0])
        if len(failed) == B:
            raise error
        where = lambda i: locations[i] if locations is not None else f"completion {i}"
        shown = "; ".join(f"{where(i)}: {type(e).__name__}: {e}" for i, e in failed[:3])
        warnings.warn(f"reward function {name!r} raised on {len(failed)} of {B} rows, which get None (not applicable; "
                      f"the others are scored): {shown}{' ...' if len(failed) > 3 else ''}", UserWarning, stacklevel=3)
        return values

    def combine(self, table: torch.Tensor) -> torch.Tensor:
        """``(B, F) -> (B,)`` float32: ``Σ_j w_j · r_ij`` over the functions that returned a value (TRL's
        ``nansum``); 0 for a row where none did."""
        return (table * self.weights.to(table)).nansum(dim=1)

    def metrics(self, table: torch.Tensor) -> dict[str, float | None]:
        """``rewards/<name>/mean`` and ``rewards/<name>/std`` of each function over the rows where it returned a
        value (``nanmean``; ``nanstd`` with Bessel's correction, as TRL); ``None`` where it returned fewer values
        than the statistic needs (no value; one value for the std)."""
        out: dict[str, float | None] = {}
        for j, name in enumerate(self.names):
            col = table[:, j].double()
            col = col[~torch.isnan(col)]
            out[f"rewards/{name}/mean"] = float(col.mean()) if len(col) else None
            out[f"rewards/{name}/std"] = float(col.std()) if len(col) > 1 else None
        return out


def _signature_problem(fn: Callable, columns: set[str]) -> str | None:
    """Why ``fn(prompts, completions, **{c: ... for c in columns})`` would fail to bind, or ``None`` (also when
    ``fn``'s signature cannot be read: a builtin)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    P = inspect.Parameter
    positional = [p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2 and not any(p.kind == P.VAR_POSITIONAL for p in params):
        return (f"takes {len(positional)} positional parameter{'s' if len(positional) != 1 else ''}, not the two "
                "(prompts, completions) it is called with")
    rest = positional[2:] + [p for p in params if p.kind == P.KEYWORD_ONLY]
    for p in rest:
        if p.default is P.empty and (p.kind == P.POSITIONAL_ONLY or p.name not in columns):
            return f"needs a column {p.name!r} (its parameter {p.name} has no default), which the data does not have"
    if not any(p.kind == P.VAR_KEYWORD for p in params):
        takes = {p.name for p in rest if p.kind != P.POSITIONAL_ONLY}
        extra = sorted(c for c in columns if c not in takes)
        if extra:
            return (f"has no parameter for the column{'s' if len(extra) > 1 else ''} "
                    f"{', '.join(map(repr, extra))} and no **kwargs to take {'them' if len(extra) > 1 else 'it'}")
    return None


def gold_column_problems(columns: dict[str, Sequence], parse: Callable[[str], Any], reward: str,
                         column: str = "answer") -> list[tuple[int, str]]:
    """``(row, problem)`` for each row whose gold ``column`` a reward function cannot read (``parse`` raises
    ``ValueError``, or the value is missing): the ``check_columns`` of dlmrl's ``math`` and ``gsm8k`` rewards, for
    :meth:`RewardFunctions.check_rows`."""
    if column not in columns:
        return [(0, f"no {column!r} column ({reward} reads the gold answer there)")]
    out = []
    for i, value in enumerate(columns[column]):
        if value is None:
            out.append((i, f"field {column!r}: missing or null"))
            continue
        try:
            parse(str(value))
        except ValueError as e:
            out.append((i, f"field {column!r}: {e}"))
    return out


@runtime_checkable
class ScoresEachReward(Protocol):
    """A task whose reward is a weighted sum of reward functions (the ``dataset`` task): the trainer logs each
    function's statistics from :meth:`reward_table`."""

    reward_functions: RewardFunctions

    def reward_table(self, examples: Sequence, texts: Sequence[str]) -> torch.Tensor:
        """``(B, F)`` float32 values of each reward function, NaN where it returned ``None``."""
        ...


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
