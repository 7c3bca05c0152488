"""The glue between a config and its memory plan (:mod:`dlmrl.training.memory_plan`): the architecture a config
names (:func:`architecture_for`), the run's numbers (:func:`settings_from_config`), ``dlmrl train --dry-run``'s
``memory`` section (:func:`memory_section`), the config check of ``model.architecture`` and ``train.memory_budget``
(:func:`check_memory_config`), sizes in bytes (:func:`parse_bytes`, :func:`format_bytes`) and the process count a
plan is for (:func:`launched_process_count`, :func:`planned_processes`)."""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

from dlmrl.kinds import kind_of
from dlmrl.kinds.base import MEMORY_SHAPE_KEYS
from dlmrl.training.memory_plan import (
    ASSUMED_PROMPT_TOKENS,
    PHASE_TERMS,
    STATIC_TERMS,
    Architecture,
    MemoryPlan,
    MemorySettings,
    architecture_from_config,
    plan_memory,
)

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(value) -> int:
    """``train.memory_budget``: an integer number of bytes, or a string with a unit (``80GB``, ``79.6 GiB``,
    ``500MB``; decimal kB/MB/GB/TB, binary KiB/MiB/GiB/TiB).

    Raises:
        TypeError: neither a number nor a string. ValueError: a string that is not a size, or a value not > 0.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"expects bytes (an integer) or a size such as 80GB, got {value!r}")
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"expects bytes (an integer) or a size with a unit (B, kB, MB, GB, TB, KiB, MiB, GiB, "
                             f"TiB), such as 80GB, got {value!r}")
        number = float(m.group(1)) * _UNITS[m.group(2).lower()]
    else:
        number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"must be > 0, got {value!r}")
    return int(number)


def format_bytes(n: float) -> str:
    """``n`` bytes in GB (10^9), three significant figures below 100 GB (``"0.0123 GB"``, ``"7.45 GB"``)."""
    gb = n / 1e9
    if gb >= 100:
        return f"{gb:,.0f} GB"
    return f"{gb:.3g} GB"


def sharding_from_environment(processes: int) -> str:
    """The sharding ``accelerate launch`` set up, from its environment: DeepSpeed's ZeRO stage
    (``ACCELERATE_DEEPSPEED_ZERO_STAGE`` 1, 2, 3), FSDP's strategy (``FSDP_SHARDING_STRATEGY``: FULL_SHARD / 1
    and HYBRID_SHARD shard weights, SHARD_GRAD_OP / 2 gradients and optimizer state, NO_SHARD / 3 none), else
    DDP for several processes and ``none`` for one."""
    env = os.environ
    if processes <= 1:
        return "none"
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        return {"1": "zero1", "2": "zero2", "3": "fsdp"}.get(str(env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")),
                                                            "zero2")
    if env.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        strategy = str(env.get("FSDP_SHARDING_STRATEGY", "FULL_SHARD")).upper()
        if strategy in ("2", "SHARD_GRAD_OP"):
            return "zero2"
        if strategy in ("3", "NO_SHARD"):
            return "ddp"
        return "fsdp"
    return "ddp"


def architecture_for(cfg) -> tuple[Architecture | None, str]:
    """The model's :class:`Architecture` and where it came from: a local (or shipped) folder's ``config.json``
    (a LoRA adapter folder's base model's), else ``model.architecture`` (the numbers a recipe records for its hub
    model; its ``name_or_path``, when given, must be the model's). ``(None, why)`` when neither is there.

    Raises:
        ValueError: ``model.architecture`` (or the config.json) has a key missing or malformed (naming it).
    """
    m = cfg.model
    name = m.name_or_path
    kind = kind_of(m.kind)
    path = Path(kind.model_path(name))
    if path.is_dir() and (path / "adapter_config.json").is_file():
        try:
            from dlmrl.models.lora import read_adapter

            base = read_adapter(str(path)).base_model_name_or_path
            path = Path(kind.model_path(base))
            name = base
        except (ValueError, OSError):
            pass
    if (path / "config.json").is_file():
        import json

        config = json.loads((path / "config.json").read_text())
        return architecture_from_config(config, f"{path / 'config.json'}"), f"{path / 'config.json'}"
    recorded = dict(getattr(m, "architecture", None) or {})
    if recorded:
        about = recorded.pop("name_or_path", None)
        if about is not None and about != name:
            return None, (f"model.architecture describes {about!r}, not {name!r}: its numbers are not used (set "
                          "model.architecture for this model, or remove its name_or_path)")
        return architecture_from_config(recorded, "model.architecture"), "model.architecture (recorded in the config)"
    return None, (f"{name!r} is a hub id whose config.json --dry-run does not download; record its numbers under "
                  "model.architecture (config.json's keys) to get a memory plan")


def _prompt_tokens(cfg) -> tuple[int, str]:
    """``(prompt tokens, how they were found)``: Sudoku's grid modes prompt with the 16 cells and ``=`` (17
    tokens); other tasks' prompts are the data's, not read here (:data:`ASSUMED_PROMPT_TOKENS`)."""
    t = cfg.task
    if t.name == "sudoku" and t.answer_mode != "text":
        return 17, "the puzzle's 16 cells and '='"
    return ASSUMED_PROMPT_TOKENS, "assumed: --dry-run reads no data"


def settings_from_config(cfg, nfe: int, processes: int, objective=None, sharding: str | None = None,
                         foreach_optimizer: bool | None = None) -> tuple[MemorySettings, dict]:
    """The :class:`MemorySettings` of a validated config and the numbers behind them (for the plan's reader).

    ``nfe``: the estimator's forward passes per completion (:meth:`describe`'s ``nfe``; its bound when data-
    dependent). ``objective``: the preset's :class:`~dlmrl.objectives.objective.Objective` (a KL toward the
    initial model without LoRA keeps a frozen copy of the weights; ``None``: no reference copy). Per process, one
    optimizer step scores ``prompts_per_step x num_generations /
    steps_per_generation / processes`` completions, ``x nfe`` canvases, ``estimator.micro_batch`` of them per
    forward (0: all); a canvas runs ``P + L`` positions (a block model's composite pass ``P + 2L``; AR ``P + L + 1``).
    A sampling call holds ``sampling.rollout_batch_size`` rows (0: the process's whole share). Read when present:
    ``model.fp32_master_weights`` (master copy for full bfloat16 training), ``train.sharding`` (``fsdp2``: weights,
    gradients and optimizer state sharded over the processes; otherwise accelerate's DeepSpeed/FSDP environment,
    :func:`sharding_from_environment`), ``estimator.logits_chunk``. ``sharding`` / ``foreach_optimizer`` override
    what is read (default: AdamW's multi-tensor step when a CUDA device is present).
    """
    m, tr, s, e = cfg.model, cfg.train, cfg.sampling, cfg.estimator
    prompt, prompt_note = _prompt_tokens(cfg)
    length = s.gen_length
    per_process = -(-tr.prompts_per_step * tr.num_generations // max(processes, 1))
    per_update = -(-per_process // tr.steps_per_generation)
    # (what one scoring canvas and one rollout forward hold for this kind: the policy kind's shapes)
    shapes = kind_of(m.kind).memory_shapes(cfg, prompt, per_update, nfe)
    missing = [k for k in MEMORY_SHAPE_KEYS if k not in shapes]
    if missing:
        raise TypeError(f"policy kind {m.kind!r}: memory_shapes() returned no {', '.join(missing)} (the keys of "
                        "dlmrl.kinds.base.MEMORY_SHAPE_KEYS)")
    canvases, positions = shapes["canvases"], shapes["positions"]
    per_forward = min(e.micro_batch, canvases) if e.micro_batch else canvases
    if shapes.get("canvases_per_forward"):  # (a kind whose scorer chunks otherwise says how many it runs at once)
        per_forward = min(int(shapes["canvases_per_forward"]), canvases)
    reference = (objective is not None and objective.beta > 0 and "logp_ref" in objective.required_inputs
                 and not m.use_peft)
    batch = getattr(s, "rollout_batch_size", 0) or 0  # (sampling.rollout_batch_size: rows per sampling call)
    rows = min(batch, per_process) if batch else per_process
    if foreach_optimizer is None:
        foreach_optimizer = _accelerator_device()
    # fp32 master weights (model.fp32_master_weights, default on): full fine-tuning of bfloat16 weights
    master = bool(getattr(m, "fp32_master_weights", True)) and not m.use_peft and m.dtype == "bfloat16"
    if sharding is None:
        sharding = "fsdp" if getattr(tr, "sharding", "none") == "fsdp2" and processes > 1 else (
            sharding_from_environment(processes))
    chunk = getattr(e, "logits_chunk", 0) or None
    settings = MemorySettings(
        weight_dtype=m.dtype, lora_r=m.lora_r if m.use_peft else None, lora_targets=m.lora_target_modules,
        lora_dropout=m.lora_dropout if m.use_peft else 0.0, master_weights=master, processes=max(processes, 1),
        sharding=sharding, canvases_per_forward=per_forward, positions=positions,
        head_positions=shapes["head_positions"], scored_positions=shapes["scored_positions"],
        float_copy_all=shapes["float_copy_all"], grads_during_forward=per_forward < canvases,
        gradient_checkpointing=m.gradient_checkpointing, logprob_chunk=chunk, dense_mask=shapes["dense_mask"],
        foreach_optimizer=foreach_optimizer, reference_model=reference, rollout_rows=rows,
        rollout_tokens=(prompt + length) if shapes["cached"] else 0, rollout_kv_copies=shapes.get("kv_copies", 1),
        rollout_forward_positions=shapes["rollout_forward_positions"],
        rollout_scored_positions=shapes["rollout_block"], rollout_prefill_positions=shapes["prefill_positions"],
        rollout_sampler=shapes.get("rollout_sampler", "gumbel"),
        rollout_gathers_weights=getattr(tr, "sharding", "none") == "fsdp2",
        soft_inputs=bool(shapes.get("soft_inputs", False)),
        rollout_soft_inputs=bool(shapes.get("rollout_soft_inputs", False)),
        uncheckpointed_positions=int(shapes.get("uncheckpointed_positions", 0)),
        kv_copy_positions=int(shapes.get("kv_copy_positions", 0)),
        reference_adapter=bool(getattr(tr, "sync_ref_model", False)) and m.use_peft and objective is not None
        and objective.beta > 0 and "logp_ref" in objective.required_inputs)
    numbers = {"prompt_tokens": f"{prompt} ({prompt_note})", "completions_per_update": per_update,
               "canvases_per_update": canvases, "canvases_per_forward": per_forward,
               "positions_per_canvas": positions, "tokens_per_forward": per_forward * positions,
               "log_probs": f"in chunks of {chunk} scored positions (estimator.logits_chunk)" if chunk else
                            "full logits (estimator.logits_chunk 0)",
               "rollout_rows_per_call": rows}
    return settings, numbers


def _accelerator_device() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 (a broken torch install: plan as on CPU)
        return False


def _layer_shapes(arch) -> str:
    """The layers shaped otherwise, for the architecture line (DiffusionGemma's full-attention layers)."""
    shapes: dict[tuple[int, int], list[int]] = {}
    for i, hd, kv in arch.attention_overrides:
        shapes.setdefault((kv, hd), []).append(i)

    def which(layers) -> str:
        return ("layers " if len(layers) > 1 else "layer ") + ", ".join(map(str, layers))

    text = "".join(f"; {which(layers)}: {kv} key/value head{'s' if kv > 1 else ''} of {hd}"
                   for (kv, hd), layers in shapes.items())
    return text + (f"; no v_proj in {which(arch.kv_shared_layers)}" if arch.kv_shared_layers else "")


def memory_section(cfg, nfe: int, processes: int, objective=None) -> dict:
    """The ``memory`` section of ``dlmrl train --dry-run``: per process, each term and the peak in GB, the numbers
    they come from, and ``train.memory_budget``'s verdict. A model whose architecture is unknown (a hub id without
    ``model.architecture``) gets the reason instead of numbers."""
    try:
        arch, source = architecture_for(cfg)
    except ValueError as err:
        return {"unavailable": f"model.architecture: {err}"}
    if arch is None:
        return {"unavailable": source}
    settings, numbers = settings_from_config(cfg, nfe, processes, objective)
    plan = plan_memory(arch, settings)
    t = plan.terms
    gb = {k: format_bytes(v) for k, v in t.items()}
    out: dict = {
        "per_process": True,
        "architecture": f"{source}: {arch.num_layers} layers, hidden {arch.hidden_size}, {arch.num_heads} heads "
                        f"({arch.num_kv_heads} key/value, head dim {arch.head_dim}), MLP {arch.intermediate_size}, "
                        f"vocabulary {arch.vocab_size}"
                        + (f", {arch.num_experts} experts ({arch.experts_per_token} per token, width "
                           f"{arch.moe_intermediate_size})" if arch.num_experts else "")
                        + _layer_shapes(arch),
        "parameters": f"{plan.total_parameters:,} ({plan.trainable_parameters:,} trained)",
        "setup": f"{settings.weight_dtype} weights, {'LoRA r ' + str(settings.lora_r) if settings.lora_r else 'full'}"
                 f", {settings.processes} process(es), sharding {settings.sharding}"
                 + (", fp32 master weights" if settings.has_master else ""),
        **{k: v for k, v in numbers.items()},
        "terms": {
            "parameters": gb["parameters"],
            "master_weights": gb["master_weights"],
            "gradients": gb["gradients"],
            "optimizer_state": gb["optimizer_state"],
            "activations": f"{gb['activations']} (checkpointing "
                           f"{'on' if settings.gradient_checkpointing else 'off'}; on {gb['activations_checkpointing']},"
                           f" off {gb['activations_no_checkpointing']})",
            "logits_per_forward": gb["logits_per_forward"],
            "rollout_kv_cache": gb["rollout_kv_cache"],
            "rollout_logits": gb["rollout_logits"],
        },
    }
    for extra in ("attention_mask", "reference_model", "ddp_buckets", "gathered_layer", "rollout_gathered_weights",
                  "scoring_gathered_weights", "soft_inputs", "rollout_soft_inputs"):
        if t[extra]:
            out["terms"][extra] = gb[extra]
    unmatched = arch.unmatched_lora_targets(settings.lora_targets) if settings.lora_r else []
    if unmatched:  # (the run itself stops on them: dlmrl.models.lora.apply_lora)
        out["lora_target_modules"] = (f"model.lora_target_modules: {', '.join(unmatched)} "
                                      f"{'matches' if len(unmatched) == 1 else 'match'} no linear layer of "
                                      f"this architecture by the plan's module names, so no adapter is counted for "
                                      f"them; the run refuses a name no module of the model matches")
    out["phases"] = {k: format_bytes(v) for k, v in plan.phases.items()}
    out["peak"] = f"{format_bytes(plan.peak)} ({plan.peak_phase})"
    budget = getattr(cfg.train, "memory_budget", None)
    if budget is not None:
        limit = parse_bytes(budget)  # (checked by the config check)
        out["memory_budget"] = (f"{format_bytes(limit)}: "
                                + ("fits" if plan.peak <= limit else
                                   f"EXCEEDED by {format_bytes(plan.peak - limit)}"))
    out["how_to_read"] = ("bytes one process holds (GB = 1e9); peak = the largest phase, each phase on top of the "
                          "weights, master copy and optimizer state; benchmarks/memory_plan_check.py compares the "
                          "plan with measured peaks (README, Memory plan)")
    return out


#: the process count ``dlmrl train --dry-run --num-processes N`` plans for (:func:`planned_processes`), else None
_PLANNED: ContextVar[int | None] = ContextVar("dlmrl_planned_processes", default=None)


@contextlib.contextmanager
def planned_processes(n: int | None) -> Iterator[None]:
    """Inside: :func:`launched_process_count` is ``n`` (``None``: the launch's own count), so the config check's
    budget warning plans the same launch as ``--dry-run --num-processes n``."""
    token = _PLANNED.set(n)
    try:
        yield
    finally:
        _PLANNED.reset(token)


def launched_process_count() -> int:
    """The processes of a launched job as the config check sees them before accelerate starts: the count
    ``--dry-run --num-processes`` plans for (:func:`planned_processes`), else ``WORLD_SIZE`` (``torchrun``,
    ``accelerate launch`` on GPUs), else 1. (An ``accelerate launch --cpu --num_processes N`` starts one process
    that ``dlmrl train`` relaunches as N; its check counts 1, its --dry-run N.)"""
    if _PLANNED.get() is not None:
        return _PLANNED.get()
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def check_memory_config(cfg, nfe: int, processes: int | None = None, objective=None,
                        for_training: bool = True) -> MemoryPlan | None:
    """The config check of ``model.architecture`` and ``train.memory_budget``: the recorded architecture must read
    (:func:`architecture_from_config`), the budget must be bytes or a size (:func:`parse_bytes`), and with both a
    budget and a known architecture a training config whose plan's peak per process exceeds the budget is warned
    about, naming the key and the largest terms. ``processes``: default :func:`launched_process_count`.

    Returns:
        the plan when it was checked against a budget, else ``None``.
    Raises:
        ConfigError: naming ``model.architecture`` or ``train.memory_budget``.
    """
    import warnings

    from dlmrl.errors import ConfigError

    recorded = dict(getattr(cfg.model, "architecture", None) or {})
    recorded.pop("name_or_path", None)
    if recorded:
        try:
            architecture_from_config(recorded, "model.architecture")
        except ValueError as err:
            raise ConfigError(f"config key 'model.architecture': {err}") from None
    budget = getattr(cfg.train, "memory_budget", None)
    if budget is None:
        return None
    try:
        limit = parse_bytes(budget)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"config key 'train.memory_budget': {err}") from None
    if not for_training:
        return None
    try:
        arch, why = architecture_for(cfg)
    except (ValueError, OSError) as err:
        raise ConfigError(f"config key 'train.memory_budget': the model's architecture cannot be read: {err}") from None
    if arch is None:
        warnings.warn(f"config key 'train.memory_budget' cannot be checked: {why}", UserWarning, stacklevel=3)
        return None
    processes = launched_process_count() if processes is None else processes
    settings, numbers = settings_from_config(cfg, nfe, processes, objective)
    plan = plan_memory(arch, settings)
    if plan.peak > limit:
        held = PHASE_TERMS[plan.peak_phase] + STATIC_TERMS  # (the terms the peak phase holds)
        top = sorted(((v, k) for k, v in plan.terms.items() if k in held), reverse=True)[:3]
        warnings.warn(f"config key 'train.memory_budget': the memory plan's peak per process is "
                      f"{format_bytes(plan.peak)} ({plan.peak_phase}), over the budget of {format_bytes(limit)}; "
                      f"largest terms: {', '.join(f'{k} {format_bytes(v)}' for v, k in top)} "
                      f"({numbers['canvases_per_forward']} canvases x {numbers['positions_per_canvas']} positions "
                      "per forward with grad; see dlmrl train --dry-run's memory section)", UserWarning, stacklevel=3)
    return plan


__all__ = [
    "architecture_for",
    "check_memory_config",
    "format_bytes",
    "launched_process_count",
    "memory_section",
    "parse_bytes",
    "planned_processes",
    "settings_from_config",
    "sharding_from_environment",
]
