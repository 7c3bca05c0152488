"""What a command-line run prints of Python warnings: what matters once, library deprecations not at all.

- **Silenced**: ``DeprecationWarning``, ``PendingDeprecationWarning`` and ``FutureWarning`` raised inside the
  libraries dlmrl runs on (:data:`LIBRARIES`: pyarrow, datasets, accelerate, transformers, torch, peft, ...). They
  tell dlmrl's developers that a library will change an API dlmrl calls; a user can do nothing about them, and they
  repeat in every run. (The test suite does not install this policy, so developers still see them there.)
- **Shown once**: every other warning (dlmrl's own, a library's ``UserWarning``), the first time its text appears
  in the process; a repeat (the same check run at validation and again at set-up, a warning raised per step) is
  counted, and the count is printed at exit.
- **The user's choice wins**: with ``python -W ...`` or ``PYTHONWARNINGS`` set, nothing here is installed.
"""

from __future__ import annotations

import atexit
import sys
import warnings

__all__ = ["LIBRARIES", "install"]

#: top-level modules whose deprecation notices a dlmrl user cannot act on
LIBRARIES = ("pyarrow", "datasets", "accelerate", "transformers", "torch", "peft", "huggingface_hub", "tokenizers",
             "safetensors", "tensorboard", "numpy", "scipy", "matplotlib", "jsonschema", "math_verify", "latex2sympy2")
DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)

_state = {"installed": False, "seen": set(), "repeats": 0}


def install() -> bool:
    """Install the policy (module docstring) for this process; ``False`` when the user set ``-W`` /
    ``PYTHONWARNINGS`` (or it was installed already), so nothing changed."""
    if sys.warnoptions or _state["installed"]:
        return False
    _state["installed"] = True
    pattern = rf"({'|'.join(LIBRARIES)})(\.|$)"
    for category in DEPRECATIONS:
        warnings.filterwarnings("ignore", category=category, module=pattern)
    show = warnings.showwarning

    def show_once(message, category, filename, lineno, file=None, line=None):
        key = (category, str(message))
        if key in _state["seen"]:
            _state["repeats"] += 1
            return
        _state["seen"].add(key)
        show(message, category, filename, lineno, file, line)

    warnings.showwarning = show_once
    # (the default "once per call site" rule would print a warning again from another line or with other numbers
    # in it; the policy's own rule above decides, so every warning reaches it)
    warnings.filterwarnings("always", category=Warning, append=True)
    atexit.register(_report_repeats)
    return True


def _report_repeats() -> None:
    if _state["repeats"]:
        print(f"dlmrl: {_state['repeats']} repeated warning(s) not shown again (PYTHONWARNINGS=always shows every "
              "one)", file=sys.stderr)
