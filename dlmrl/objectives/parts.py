"""The objective's parts that describe themselves: clip rules, loss aggregations (loss types) and weightings.

A part is a frozen dataclass of its own hyperparameters, registered by name in its kind's
:class:`PartRegistry` (:data:`dlmrl.objectives.clip_rules.CLIP_RULES`,
:data:`dlmrl.objectives.aggregation.LOSS_TYPES`, :data:`dlmrl.objectives.weighting.WEIGHTINGS`). Besides
its formula it carries the facts the trainer needs about it, as class attributes (or properties):

- ``required_inputs``: the optional :meth:`GroupObjective.compute` inputs it reads (``entropy``,
  ``segment_ids``, ``group_ids``);
- ``needs_whole_batch``: it reads statistics over every row of the batch (a rank or a normalisation over
  the batch), so a process holding a share of the rows cannot compute it;
- ``zero_rows_skippable``: rows with advantage 0 may go unscored without changing the loss (their
  surrogate is 0 and no other row's term depends on them).

A :class:`~dlmrl.objectives.objective.GroupObjective` names its parts (``clip_rule="sspo"``,
``loss_type="dapo"``, ``weighting="egsw"``) and builds each from its own fields of the same names
(:meth:`Part.from_options`), so a config names a part and sets its hyperparameters with flat ``train.*``
keys. A user's part is a subclass registered under a new name (in a module loaded by ``--import``)::

    @CLIP_RULES.register("half")
    @dataclass(frozen=True)
    class HalfClip(ClipRule):
        epsilon: float = 0.2      # filled from GroupObjective.epsilon (train.epsilon)

        def ranges(self, mask, **inputs):
            return self.epsilon / 2, self.epsilon / 2

and ``train.clip_rule: half`` then uses it. Fields named like a :class:`GroupObjective` field get that
field's value; any field is set by ``train.part_options.clip_rule.<field>`` (``GroupObjective.part_options``),
which wins over the flat value; the others keep their defaults.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar, TypeVar

from dlmrl.errors import OptionError
from dlmrl.registry import Registry


def check_choice(field_name: str, value: object, choices: Iterable[str]) -> None:
    """Raise ``ValueError`` naming the field, with a did-you-mean, if ``value`` is not in ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise OptionError(field_name, f"{field_name} {value!r} is not one of {', '.join(map(repr, choices))}.{hint}")


def check_values(owner: object, checks: Iterable[tuple[str, bool, str]]) -> None:
    """Raise ``ValueError`` ``"<name> <value> <why>"`` for the first ``(name, ok, why)`` that is not ok."""
    for name, ok, why in checks:
        if not ok:
            raise OptionError(name, f"{name} {getattr(owner, name)!r} {why}")


class Part:
    """Base of every part: the facts about it the trainer asks (see the module docstring).

    Subclasses are frozen dataclasses; the class attributes below are the defaults (a part that reads
    nothing optional, is row-local and lets zero-advantage rows go unscored) and may be overridden by
    class attributes or by properties that depend on the hyperparameters.
    """

    #: the registry name (set by :meth:`PartRegistry.register`)
    name: ClassVar[str] = ""
    required_inputs: ClassVar[frozenset[str]] = frozenset()
    needs_whole_batch: ClassVar[bool] = False
    zero_rows_skippable: ClassVar[bool] = True

    @classmethod
    def hyperparameters(cls) -> tuple[str, ...]:
        """The names of the part's dataclass fields."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_options(cls, options: Mapping[str, object]) -> Part:
        """The part with each of its fields that ``options`` names set from it (the others: defaults)."""
        return cls(**{k: options[k] for k in cls.hyperparameters() if k in options})


P = TypeVar("P", bound=Part)


class PartRegistry(Registry[type[P]]):
    """A :class:`~dlmrl.registry.Registry` of part classes of one kind.

    Args:
        kind: what a name names, in messages (``"clip rule"``).
        field_name: the :class:`GroupObjective` field (and ``train.*`` key) that names the part.
        base: the kind's base class; every registered class must be a dataclass subclass of it.
    """

    def __init__(self, kind: str, field_name: str, base: type[P]):
        super().__init__(kind)
        self.field_name = field_name
        self.base = base

    def register(self, name: str) -> Callable[[type[P]], type[P]]:
        def decorator(cls: type[P]) -> type[P]:
            if not (isinstance(cls, type) and issubclass(cls, self.base) and dataclasses.is_dataclass(cls)):
                raise TypeError(f"{self.kind} {name!r}: register a dataclass subclass of {self.base.__name__}, "
                                f"got {cls!r}")
            super(PartRegistry, self).register(name)(cls)
            cls.name = name
            return cls

        return decorator

    def build(self, name: str, options: Mapping[str, object] | None = None) -> P:
        """The part registered as ``name``, its fields set from ``options`` (:meth:`Part.from_options`).

        Raises:
            ValueError: an unknown name, as ``"<field_name> 'x' is not one of ..."`` with a did-you-mean,
                or a hyperparameter the part refuses.
        """
        check_choice(self.field_name, name, self.names())
        return self.get(name).from_options(options or {})
