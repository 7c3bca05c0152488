"""A small typed registry: one per axis (estimators, rewards, tasks, families, algorithms).

Registering a name twice raises; looking up an unknown name suggests the closest names.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A dict from name to object, filled with the :meth:`register` decorator.

    Raises:
        KeyError: on a duplicate registration, or on lookup of an unknown name (the message lists
            close matches and every registered name).
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items:
                raise KeyError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        if name not in self._items:
            close = difflib.get_close_matches(name, list(self._items), n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise KeyError(
                f"unknown {self.kind} {name!r}.{hint} Known: {', '.join(sorted(self._items))}"
            )
        return self._items[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def names(self) -> list[str]:
        return sorted(self._items)

    def doc(self, name: str) -> str:
        """The first paragraph of the registered object's docstring, on one line."""
        text = (getattr(self._items[name], "__doc__", None) or "").strip()
        return " ".join(line.strip() for line in text.split("\n\n")[0].splitlines())
