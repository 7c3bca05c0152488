"""Policies: the masked-diffusion policy and the autoregressive adapter, their loaders and tiny defaults.

Names are imported lazily (``from dlmrl.models import load_ar_policy`` loads ``dlmrl.models.ar`` on
first use), so importing one sub-module does not pull in ``transformers`` for the others.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "MaskedDiffusionPolicy": "dlmrl.models.policy",
    "load_policy": "dlmrl.models.loading",
    "TINY_DEFAULT": "dlmrl.models.loading",
    "read_checkpoint_config": "dlmrl.models.loading",
    "resolve_mask_token_id": "dlmrl.models.loading",
    "FAMILIES": "dlmrl.models.families",
    "Family": "dlmrl.models.families",
    "detect_family": "dlmrl.models.families",
    "shift_logits_right": "dlmrl.models.families",
    "AutoregressivePolicy": "dlmrl.models.ar",
    "ARRollout": "dlmrl.models.ar",
    "StepTemperatureProcessor": "dlmrl.models.ar",
    "HapoTemperature": "dlmrl.models.ar",
    "build_tiny_causal_model": "dlmrl.models.ar",
    "load_ar_policy": "dlmrl.models.ar",
    "TINY_AR_DEFAULT": "dlmrl.models.ar",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dlmrl.models' has no attribute {name!r}")
