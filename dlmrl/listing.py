"""``dlmrl list <registry>``: every registered name with the first line of its docstring."""

from __future__ import annotations

import os
import re
import sys

_REGISTRIES = {
    "algorithms": ("dlmrl.objectives.presets", "ALGORITHMS"),
    "estimators": ("dlmrl.estimators", "ESTIMATORS"),
    "rewards": ("dlmrl.rewards", "REWARDS"),
    "tasks": ("dlmrl.data", "TASKS"),
    "advantages": ("dlmrl.objectives.advantage_registry", "ADVANTAGES"),
    "clip_rules": ("dlmrl.objectives.clip_rules", "CLIP_RULES"),
    "loss_types": ("dlmrl.objectives.aggregation", "LOSS_TYPES"),
    "weightings": ("dlmrl.objectives.weighting", "WEIGHTINGS"),
    "families": ("dlmrl.models.families", "FAMILIES"),
    "envs": ("dlmrl.envs", "ENVS"),
    "kinds": ("dlmrl.kinds", "KINDS"),
}


def plain_text(rst: str) -> str:
    """A docstring line without reStructuredText markup: ``x`` as x, :func:`a.b.c` as c."""
    return re.sub(r":\w+:`~?(?:[\w.]*\.)?([^`]+)`", r"\1", rst).replace("``", "")


def _run_list(name: str) -> int:
    """Print each registered name with the first line of its docstring."""
    import importlib
    import shutil
    import textwrap
    import warnings

    module, attr = _REGISTRIES[name]
    registry = getattr(importlib.import_module(module), attr)
    width = max(map(len, registry.names()), default=0)
    columns = max(shutil.get_terminal_size((100, 24)).columns, width + 40)
    lines = []
    for key in registry.names():
        text = plain_text(registry.doc(key))
        if name == "families":  # (a Family is an instance: say what it offers instead of its class's docstring)
            family = registry.get(key)
            why = family.no_cache_reason or "no cache adapter"
            text = ("model.kind diffusion: sampling.cache prefix | dual" if family.cached_logits is not None
                    else f"model.kind diffusion: sampling.cache none only ({why})")
            text += ("; no model.kind block" if family.block_forward is None else
                     "; model.kind block, exact key/value cache (the prompt cut into blocks)" if family.prompt_blocks
                     else "; model.kind block, exact key/value cache")
            if family.default_block_size is not None:
                text += f", block size {family.default_block_size} unless set"
        if name == "algorithms":  # which policy kinds (model.kind) the preset runs on (each kind's runs_preset)
            from dlmrl.kinds import KINDS

            with warnings.catch_warnings():  # (some presets warn about their own documented choices)
                warnings.simplefilter("ignore")
                preset = registry.get(key)()
            kinds = [k for k in KINDS.names() if KINDS.get(k).runs_preset(preset)
                     and KINDS.get(k).preset_problem(preset) is None]
            text += f" [{', '.join(kinds)}]"
        lines += textwrap.wrap(text, columns - 1, initial_indent=f"{key:<{width}}  ",
                               subsequent_indent=" " * (width + 2), break_on_hyphens=False) or [key]
    try:
        print("\n".join(lines))
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. `dlmrl list algorithms | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
