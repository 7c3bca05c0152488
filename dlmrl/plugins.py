"""User code that dlmrl imports by name: ``module:attribute`` import strings, ``--import MODULE`` and the
``dlmrl.plugins`` entry points.

Importing a module is how its registrations happen: a module that calls ``REWARDS.register("name")``,
``TASKS.register(...)``, ``ESTIMATORS.register(...)``, ``ALGORITHMS.register(...)`` or ``KINDS.register(...)`` (a
policy kind, :mod:`dlmrl.kinds`) at import time makes those
names visible to config validation, ``dlmrl list`` and training. ``dlmrl train --import MODULE`` imports such a
module before the config is read; an installed package can instead declare an entry point in the
``dlmrl.plugins`` group (pyproject: ``[project.entry-points."dlmrl.plugins"] my_pkg = "my_pkg.dlmrl_plugin"``),
which the ``dlmrl`` command loads at start (an entry point naming a function, ``"my_pkg:register"``, has that
function called once, with no arguments).

Every failure raises :class:`PluginError` naming what was asked for: the import string or option, the module,
the attribute, and the exception the import raised.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from typing import Any

__all__ = ["ENTRY_POINT_GROUP", "PluginError", "import_modules", "import_object", "load_plugins"]

#: the entry-point group the ``dlmrl`` command loads at start
ENTRY_POINT_GROUP = "dlmrl.plugins"

_loaded: set[str] = set()  # entry points already loaded in this process (a plugin's registrations run once)


class PluginError(ImportError):
    """User code named by an import string, ``--import`` or an entry point cannot be imported or used; the
    message names it, the module and the attribute."""


def _import_module(module: str, what: str):
    """``importlib.import_module(module)``; any failure becomes a :class:`PluginError` starting with ``what``."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = f" (module {e.name!r} is not installed or not on sys.path)" if e.name else ""
        raise PluginError(f"{what}: cannot import module {module!r}{missing}: {e}") from e
    except Exception as e:
        raise PluginError(f"{what}: importing module {module!r} raised {type(e).__name__}: {e}") from e


def import_object(spec: str, what: str = "import string") -> Any:
    """The object an import string names: ``"package.module:attribute"`` (the attribute may be dotted,
    ``module:Class.method``), or TRL's ``"package.module.attribute"`` (the part after the last dot is the
    attribute).

    Args:
        spec: the import string.
        what: how the caller names it in errors (``"config key 'train.reward_funcs' entry 0"``).
    Raises:
        PluginError: a string of neither form, a module that cannot be imported (or raises while importing), or a
            missing attribute; the message names ``what``, the module and the attribute.
    """
    if ":" in spec:
        module, _, attr = spec.partition(":")
    else:
        module, _, attr = spec.rpartition(".")
    if not module.strip() or not attr.strip():
        raise PluginError(f"{what}: {spec!r} is not an import string; write module:attribute "
                          "(e.g. my_pkg.rewards:exact_match)")
    obj = _import_module(module.strip(), f"{what} {spec!r}")
    for i, part in enumerate(attr.strip().split(".")):
        if not hasattr(obj, part):
            owner = module if i == 0 else f"{module}:{'.'.join(attr.split('.')[:i])}"
            raise PluginError(f"{what} {spec!r}: module {module!r} imports, but {owner!r} has no attribute "
                              f"{part!r}")
        obj = getattr(obj, part)
    return obj


def import_modules(modules: list[str] | tuple[str, ...], what: str = "--import") -> None:
    """Import each module in order (``dlmrl train --import MODULE``), so that its registrations run.

    Raises:
        PluginError: naming the option and the module that failed.
    """
    for module in modules:
        _import_module(module, f"{what} {module}")


def load_plugins() -> list[str]:
    """Load every ``dlmrl.plugins`` entry point (once per process): import its module and, when it names a
    function, call it with no arguments. Returns the names loaded by this call.

    Raises:
        PluginError: naming the entry point, its value and its distribution.
    """
    names = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = f"{ep.name}={ep.value}"
        if key in _loaded:
            continue
        dist = getattr(getattr(ep, "dist", None), "name", None)
        what = f"entry point {ep.name!r} (group {ENTRY_POINT_GROUP}{f', from {dist}' if dist else ''})"
        module, _, attr = ep.value.partition(":")
        try:
            obj = import_object(ep.value, what) if attr else _import_module(module.strip(), f"{what} {ep.value!r}")
        except PluginError as e:
            raise PluginError(f"{e}; fix or uninstall that package") from e.__cause__
        if callable(obj) and not inspect.isclass(obj) and not inspect.ismodule(obj):
            try:
                obj()
            except Exception as e:
                raise PluginError(f"{what} {ep.value!r}: calling it raised {type(e).__name__}: {e}") from e
        _loaded.add(key)
        names.append(ep.name)
    return names
