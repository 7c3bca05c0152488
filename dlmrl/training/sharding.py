"""Parameter sharding with torch's FSDP2 (``train.sharding: fsdp2``): every decoder layer and then the root module go
through ``torch.distributed.fsdp.fully_shard`` over all the run's processes, so each process holds 1/W of the
parameters, of their gradients and of AdamW's state.

Why dlmrl calls ``fully_shard`` itself rather than through ``accelerate``: accelerate (1.16) turns its FSDP plugin
on only for accelerator process groups (``AcceleratorState``'s FSDP branch lists no ``MULTI_CPU``; its
``--cpu`` launcher drops the FSDP config), so on CPU an FSDP config trains unsharded; FSDP2 itself shards over
gloo as over NCCL. Applying it here gives one code path for CPU tests and GPU runs (TRL/d1 shard through
accelerate, dLLM-RL through DeepSpeed ZeRO-3, NeMo RL on DTensor/FSDP2, torchtitan calls ``fully_shard`` as here).

How the run uses it (the data-parallel design of :mod:`dlmrl.training.distributed` stays: every process holds
the whole rollout and scores its share of the groups with a loss weight):

- **Gradients**: FSDP2 reduce-scatters (averages over the W processes) in every backward; the loss weights make
  that average the 1-process gradient, as DDP's all-reduce did (``Run.own_grad_sync`` is off).
- **Equal collectives**: a sharded module all-gathers its parameters in its forward and backward, so every
  process must run the same passes in the same order. In an update every process scores (a process without rows
  of its own scores one row at weight 0), and a micro-batched scorer (``estimator.micro_batch``) runs the most
  chunks any process has, padded with chunks of loss weight 0, reducing gradients on the last backward only
  (:class:`dlmrl.training.distributed.GradientSync`, FSDP2's ``set_requires_gradient_sync``).
- **Rollouts and every pass without gradients** (sampling, old and reference scores, evaluation) run with the
  parameters gathered once (:func:`gathered`): the processes sample different numbers of denoising passes
  (thresholds, early stops, AR rows that end), which per-layer all-gathers would deadlock on. The cost is the
  whole model in memory during the rollout; ``benchmarks/fsdp2_rollout_gather.py`` measures it against per-layer
  gathering (2 gloo processes, a 29M-parameter Llama, 16 passes with equal counts: 112 MB gathered at once against
  21 MB, and 8.8 s against 14.7 s: one all-gather instead of one per layer per pass).
- **Mixed precision**: with float32 master weights (:mod:`dlmrl.training.precision`) the policy is sharded in
  float32 with ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``.
- **Checkpoints**: model and optimizer through ``torch.distributed.checkpoint`` (:func:`register_checkpointing`:
  each process writes its shards into ``<checkpoint>/sharded/``; a load reshards, so a run resumes on another
  process count); ``final_model/`` from the full state dict gathered on the main process (:func:`full_state_dict`).

Reference: PyTorch FSDP2, ``torch.distributed.fsdp.fully_shard``
(https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html); Zhao et al., "PyTorch FSDP",
arXiv 2304.11277.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from dlmrl.training.checkpoint import SHARDED_DIR

#: ``train.sharding`` values that shard
SHARDED_MODES = ("fsdp2",)


def fsdp_modules(model: nn.Module | None) -> list[nn.Module]:
    """The modules of ``model`` that ``fully_shard`` was applied to, in ``model.modules()`` order (the root first)."""
    if model is None:
        return []
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: nn.Module | None) -> bool:
    """Whether ``model`` (or a module inside it) is sharded with FSDP2."""
    return bool(fsdp_modules(model))


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a (possibly LoRA-wrapped) transformer, the units ``fully_shard`` gathers one at a time.

    The model's own ``_no_split_modules`` class names where it declares them (``transformers``' models:
    ``LlamaDecoderLayer``, ``Qwen2DecoderLayer``; SDAR ``SDARDecoderLayer``, LLaDA2 ``LLaDA2MoeDecoderLayer``),
    else the children of the ``nn.ModuleList`` holding the most parameters whose children share one class (LLaDA's
    ``model.transformer.blocks``, ``LLaDALlamaBlock``; the ``tiny`` family's ``model.layers``). Nested matches are
    dropped (an MoE layer's experts inside a decoder layer), so no module is listed inside another. Empty for a
    model without a layer list (the root is then the only unit).
    """
    from dlmrl.models.lora import base_transformers_model

    base = base_transformers_model(model)
    names = set(getattr(base, "_no_split_modules", None) or ())
    found = [m for m in base.modules() if type(m).__name__ in names] if names else []
    if not found:
        best, size = [], 0
        for m in base.modules():
            if isinstance(m, nn.ModuleList) and len(m) and len({type(c) for c in m}) == 1:
                n = sum(p.numel() for p in m.parameters())
                if n > size:
                    best, size = list(m), n
        found = best
    inside = set()
    for m in found:
        inside.update(id(c) for c in m.modules() if c is not m)
    return [m for m in found if id(m) not in inside]


def check_launch(accelerator) -> None:
    """Refuse ``train.sharding: fsdp2`` under an ``accelerate`` FSDP or DeepSpeed config, which would shard (or
    wrap) the model a second way: dlmrl shards it itself, so launch with a plain multi-process config
    (``configs/accelerate/fsdp2.yaml``).

    Raises:
        ConfigError: naming ``train.sharding`` and accelerate's distributed type.
    """
    from dlmrl.errors import ConfigError

    kind = str(getattr(accelerator, "distributed_type", ""))
    if kind.endswith(("FSDP", "DEEPSPEED")):
        raise ConfigError(f"config key 'train.sharding': fsdp2 shards the model itself, but accelerate was launched "
                          f"with {kind.rsplit('.', 1)[-1]}; launch with a plain multi-process config "
                          "(configs/accelerate/fsdp2.yaml) or set train.sharding none")


def ensure_process_group(device_type: str) -> None:
    """A process group for a 1-process sharded run (accelerate creates none for one process): a world of one over an
    in-memory store, kept for the life of the process (a later run reuses it)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


@dataclass
class Sharding:
    """What :func:`shard_policy` did.

    Attributes:
        models: the sharded root modules (the policy's, then the KL reference's when it is a separate model).
        layers: the decoder layers sharded in the policy (0: only the root, a model without a layer list).
        compute_dtype: FSDP2's ``param_dtype`` (bfloat16 with master weights), or ``None``.
        world: the processes the parameters are split over.
    """

    models: list[nn.Module] = field(default_factory=list)
    layers: int = 0
    compute_dtype: torch.dtype | None = None
    world: int = 1


def _mixed_precision(model: nn.Module, compute: torch.dtype | None):
    """FSDP2's mixed-precision policy: ``compute`` (master weights) or, when the model's parameters have several
    dtypes (a LoRA adapter, float32, on a bfloat16 base), the lowest of them, gathered in that dtype with gradients
    reduced in float32; otherwise the default (no casts)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if compute is None and len(dtypes) > 1:
        compute = min(dtypes, key=lambda d: torch.finfo(d).bits)
    if compute is None:
        return MixedPrecisionPolicy(), None
    return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32), compute


def shard_module(model: nn.Module, mesh, compute: torch.dtype | None = None) -> tuple[int, torch.dtype | None]:
    """``fully_shard`` every decoder layer of ``model`` (:func:`decoder_layers`), then ``model`` itself (in place:
    its class becomes an ``FSDPModule`` subclass, its parameters ``DTensor`` s sharded on dim 0), and run FSDP2's
    lazy initialisation now, so that ``model`` is the root whichever of its modules runs first (an AR policy's
    ``generate`` calls the base model under a LoRA wrapper). Returns ``(layers sharded, compute dtype)``."""
    from torch.distributed.fsdp import fully_shard

    model.to(mesh.device_type)
    mp, compute = _mixed_precision(model, compute)
    layers = decoder_layers(model)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    state = model._get_fsdp_state()  # (FSDP2 picks the root at the first forward: make it this one)
    state._lazy_init()
    return len(layers), compute


def shard_policy(policy, ref, device: torch.device) -> Sharding:
    """Shard the trained policy's model and, when it is a separate model, the KL reference's (frozen: its forward
    passes run gathered, :func:`gathered`), over every process (a 1-D device mesh of ``WORLD_SIZE``). A policy whose
    forward :mod:`dlmrl.training.precision` wrapped in autocast is sharded with FSDP2's mixed precision instead
    (bfloat16 gather, float32 gradient reduction over float32 shards).

    Call before the optimizer is built (it must hold the sharded parameters).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from dlmrl.training.precision import remove_autocast

    ensure_process_group(device.type)
    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))
    compute = remove_autocast(policy.model)
    layers, compute = shard_module(policy.model, mesh, compute)
    models = [policy.model]
    ref_model = getattr(ref, "model", None) if ref is not None else None
    if ref_model is not None and ref_model is not policy.model and not hasattr(ref, "adapter_disabled"):
        ref_compute = remove_autocast(ref_model)
        if ref_compute is not None:  # (the reference computes as the policy: bfloat16 weights, no casts)
            ref_model.to(ref_compute)
        shard_module(ref_model, mesh)
        models.append(ref_model)
    return Sharding(models, layers, compute, world)


@contextlib.contextmanager
def gathered(*models: nn.Module | None):
    """Run the block with every sharded module of ``models`` gathered once (FSDP2 ``unshard``) and kept gathered
    across forward passes (``reshard_after_forward`` off), then sharded again: forward passes inside make no
    collective call, so processes may run different numbers of them (a rollout). A no-op for unsharded models.

    Memory: the whole model (in its compute dtype) on every process for the duration.
    """
    mods = list({id(m): m for model in models for m in fsdp_modules(model)}.values())
    if not mods:
        yield
        return
    roots = {id(model) for model in models if model is not None}
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in mods:
            # (FSDP2's defaults: decoder layers free their gathered parameters after forward, the root keeps them
            # for the backward that follows)
            m.set_reshard_after_forward(id(m) not in roots, recurse=False)
            m.reshard()


class GatheredScorer:
    """A scorer (:class:`~dlmrl.training.scorers.DiffusionScorer` / :class:`~dlmrl.training.scorers.ARScorer`) whose
    :meth:`prepare` (old and reference scores, no gradients, micro-batched or not) runs with the models gathered
    (:func:`gathered`); its :meth:`backward` runs per layer (one forward and one backward on every process).
    Every other attribute, read or set, is the wrapped scorer's."""

    def __init__(self, scorer, models: list[nn.Module]):
        object.__setattr__(self, "scorer", scorer)
        object.__setattr__(self, "models", models)

    def prepare(self, *args, **kwargs):
        with gathered(*self.models):
            return self.scorer.prepare(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.scorer, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self.scorer, name, value)


def _state_dict_options(**kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # (a LoRA run's frozen base is reloaded from its checkpoint: only trained tensors are saved, as
    # dlmrl.models.lora.register_adapter_checkpointing does for unsharded runs)
    return StateDictOptions(ignore_frozen_params=True, **kwargs)


def register_checkpointing(accelerator, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Save and load ``model`` and ``optimizer`` with ``torch.distributed.checkpoint`` inside ``accelerate``'s
    ``save_state`` / ``load_state`` (their pre-hooks, which every process runs with the checkpoint folder): each
    process writes its own shards to ``<checkpoint>/sharded/`` (``*.distcp`` and a ``.metadata`` index), state
    dicts keyed by parameter names (``get_state_dict``), so a load reshards onto any process count. accelerate
    itself then saves the schedule, the RNG states and the run state, as for an unsharded run (the model and
    optimizer are not given to ``accelerator.prepare``). The checkpoint's manifest lists the shard files with the
    rest (:func:`dlmrl.training.checkpoint.write_manifest`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    options = _state_dict_options()

    def save_hook(models: list, weights: list, output_dir: str) -> None:
        model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(Path(output_dir) / SHARDED_DIR))

    def load_hook(models: list, input_dir: str) -> None:
        folder = Path(input_dir) / SHARDED_DIR
        if not folder.is_dir():
            raise FileNotFoundError(f"{input_dir}: no {SHARDED_DIR}/ folder (torch.distributed.checkpoint files of "
                                    "model and optimizer): this checkpoint was saved without train.sharding fsdp2")
        model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
        state = {"model": model_sd, "optimizer": optim_sd}
        dcp.load(state, checkpoint_id=str(folder))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=options)

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """The whole model's state dict (unsharded tensors, on the CPU) on the main process and ``{}`` on the others
    (``get_model_state_dict`` with ``full_state_dict`` and ``cpu_offload``: every process must call it); ``None``
    for an unsharded model (save it as it is). A tied parameter (an output head sharing the embedding) is listed
    once, under its first name, as ``model.state_dict()`` leads ``save_pretrained`` to write it (the gathered copies
    are separate tensors, which it would write twice)."""
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    seen, tied = set(), set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.add(name)
        seen.add(id(p))
    return {k: v for k, v in full.items() if k not in tied}


def local_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> tuple[int, int]:
    """``(parameter bytes, optimizer-state bytes)`` this process holds: a sharded tensor counts its local shard."""
    def size(t: torch.Tensor) -> int:
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.numel() * local.element_size()

    params = sum(size(p) for p in model.parameters())
    states = 0
    if optimizer is not None:
        for state in optimizer.state.values():
            states += sum(size(v) for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return params, states
