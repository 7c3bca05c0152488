"""The record written beside every held-out result: what produced the figures, and a hash of it.

Two numbers are comparable when their records agree; ``protocol_hash`` covers what decides the figures for a
given model (the scoring protocol, the sampling settings, the task's held-out data and prompts), ``hash`` covers
the whole record (also the model id and revision, dlmrl's, torch's and transformers' versions, the weights' dtype
and the device name: GPU type alone has moved a GSM8K figure by points, d3LLM issue #3). Both are the first 16 hex
digits of the SHA-256 of the canonical JSON (sorted keys) of what they cover.
"""

from __future__ import annotations

import hashlib
import json
import platform

import torch

__all__ = ["device_name", "eval_record", "short_hash"]


def short_hash(value) -> str:
    """SHA-256 of ``value``'s canonical JSON, first 16 hex digits."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def device_name(device: torch.device) -> str:
    """``cuda: NVIDIA H200`` (the GPU's name), ``mps``, or ``cpu: <machine>``."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    if device.type == "cpu":
        return f"cpu: {platform.processor() or platform.machine() or 'unknown'}"
    return device.type


def _model(cfg, policy) -> tuple[dict, torch.nn.Parameter | None]:
    model = getattr(policy, "model", None)
    config = getattr(model, "config", None)
    revision = getattr(config, "_commit_hash", None)  # (a hub snapshot's commit; None for a local folder)
    param = next(model.parameters(), None) if model is not None else None
    return {"name_or_path": cfg.model.name_or_path, "revision": revision, "kind": cfg.model.kind,
            "family": getattr(policy, "family", cfg.model.family), "dtype": str(param.dtype).removeprefix("torch.")
            if param is not None else cfg.model.dtype}, param


def _task(cfg) -> dict:
    t = cfg.task
    return {"name": t.name, "answer_mode": t.answer_mode if t.name == "sudoku" else None,
            "test_file": t.test_file, "test_dataset": t.test_dataset, "test_split": t.test_split,
            "dataset": t.dataset, "subset": t.subset,
            "test_prompt_template": t.test_prompt_template or t.prompt_template, "chat_template": t.chat_template,
            **({"options": dict(t.options)} if t.options else {})}  # (a task's own settings: its held-out data)


def eval_record(cfg, policy, settings: dict, trained_steps: int | None = None, kind=None) -> dict:
    """The record of one evaluation of ``policy`` under config ``cfg`` with ``settings``
    (:meth:`~dlmrl.evaluation.presets.EvalSettings.as_dict`; for ``model.kind: block`` its ``block_size`` in
    place of ``block_length``, which does not apply): ``protocol``, ``sampling``, ``task``, ``model``
    (id, revision, kind, family, weights dtype), ``dlmrl_version``, ``torch_version``, ``transformers_version``,
    ``device``, ``protocol_hash`` and ``hash`` (module docstring). ``kind``: the policy kind of ``model.kind``
    (:class:`~dlmrl.kinds.base.PolicyKind`; default: :func:`dlmrl.kinds.kind_of` ``cfg.model.kind``)."""
    import transformers

    from dlmrl import __version__

    model, param = _model(cfg, policy)
    if trained_steps is not None:  # (inside a training run: the weights are the run's after that many steps)
        model["trained_steps"] = trained_steps
    from dlmrl.kinds import kind_of

    sampling = {k: v for k, v in settings.items() if k != "protocol"}
    kind = kind if kind is not None else kind_of(cfg.model.kind)
    sampling = kind.record_sampling(sampling, cfg, policy)  # (block: its block_size, not block_length)
    record = {"protocol": settings["protocol"], "sampling": sampling, "task": _task(cfg), "model": model,
              "dlmrl_version": __version__, "torch_version": torch.__version__,
              "transformers_version": transformers.__version__,
              "device": device_name(param.device if param is not None else torch.device("cpu"))}
    record["protocol_hash"] = short_hash({k: record[k] for k in ("protocol", "sampling", "task")})
    record["hash"] = short_hash({k: v for k, v in record.items() if k != "protocol_hash"})
    return record
