"""Data-parallel training over processes (``accelerate launch --num_processes W``; W, the world size).

A step's global batch (``prompts_per_step × G`` completions) is split across the W processes by whole
prompt groups: process ``p`` samples prompts ``[p·n/W, (p+1)·n/W)`` of the step's ``n = prompts_per_step``
and all G completions of each. Every random number a row uses is the one it has in the whole batch (the sampler draws its noise
for the whole batch and keeps its rows, :func:`dlmrl.models.sampler.generate` ``rows``; AR sampling
through :class:`dlmrl.models.ar.RowSliceSampler`; MaskPlans are drawn for the whole batch and sliced),
so a row comes out the same whichever process samples it. The sampled rows are then gathered, so every
process holds the same global rollout and takes every batch-level decision itself (rewards, advantages,
DAPO's dynamic sampling, DaGRPO's anchors, the rollout budget, logged statistics); each process scores
and back-propagates its share of the rows (whole groups, :func:`group_share`) with a loss weight that
makes the average over processes the 1-process loss (:func:`loss_share`), and gradients are averaged
once per update (:meth:`Processes.average_gradients`).

Everything here is a no-op with one process, so a 1-process run is the single-process trainer.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dlmrl.config import Config, ConfigError, build_preset
from dlmrl.objectives.aggregation import LOSS_TYPES, Aggregation
from dlmrl.training.rollout import Rollout, mean_nfe


def launched_processes() -> int:
    """The process count of a ``torchrun`` / ``accelerate launch`` job (``WORLD_SIZE``; 1 when not launched),
    known before accelerate or torch.distributed is set up."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _cpu_launch() -> tuple[object, object] | None:
    """``(launch arguments, launch config or None)`` of the ``accelerate launch --cpu`` that started this process
    alone (no ``WORLD_SIZE``; ``ACCELERATE_USE_CPU`` and ``MASTER_ADDR`` set), read from its command line
    (``/proc/<parent>/cmdline``, parsed with accelerate's own parser) and config file; ``None`` otherwise or when
    they cannot be read."""
    env = os.environ
    if env.get("WORLD_SIZE") or not _truthy(env.get("ACCELERATE_USE_CPU")) or "MASTER_ADDR" not in env:
        return None
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
        argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    except OSError:
        return None
    at = next((i for i, a in enumerate(argv) if a == "launch" and any("accelerate" in b for b in argv[:i])), None)
    if at is None:
        return None
    from accelerate.commands.config import default_config_file, load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    try:
        args, _ = launch_command_parser().parse_known_args(argv[at + 1 :])
        path = args.config_file or default_config_file
        config = load_config_from_file(path) if os.path.isfile(path) else None
    except (SystemExit, ValueError, OSError, KeyError, TypeError):  # (unreadable: run as launched)
        return None
    return args, config


#: set in the environment of the CPU processes ``dlmrl train`` starts itself (:func:`cpu_relaunch_command`): the
#: process ``accelerate launch`` started reports for them
RELAUNCHED = "DLMRL_CPU_RELAUNCH"


def launcher_note() -> str | None:
    """The line a failed ``dlmrl train`` adds under ``accelerate launch``, whose launcher reports every non-zero exit
    with a traceback of its own and exit code 1 (accelerate's ``simple_launcher`` raises ``CalledProcessError``,
    its ``torchrun`` path re-raises ``ChildFailedError``; only ``--quiet`` leaves the traceback out, and nothing
    keeps the exit code): said once, by the process the launcher watches (its one process, or rank 0), not by the
    CPU processes dlmrl started itself. ``None`` outside ``accelerate launch``."""
    if "ACCELERATE_MIXED_PRECISION" not in os.environ or os.environ.get(RELAUNCHED):  # (set by accelerate launch)
        return None
    if os.environ.get("RANK", "0") != "0":
        return None
    return ("dlmrl: the error is the line above; accelerate launch adds a traceback of its own and exit code 1 for "
            "any failed process (accelerate launch --quiet leaves the traceback out)")


def requested_cpu_processes() -> int | None:
    """The process count ``N`` of an ``accelerate launch --cpu --num_processes N`` that started this process
    alone, or ``None``.

    accelerate starts several CPU processes only through ``mpirun`` (a hostfile in its config); otherwise
    ``--cpu`` runs the script once, with ``ACCELERATE_USE_CPU`` and ``MASTER_ADDR`` set (the latter only
    when more than one process was asked for) and no ``WORLD_SIZE``. Then ``N`` is read from the launching
    ``accelerate`` command line (``N`` from its config file when the flag is absent). ``None`` when this process
    was not started that way, ``N <= 1``, several machines were asked for, or the command line cannot be read.
    """
    launch = _cpu_launch()
    if launch is None:
        return None
    args, config = launch
    n, machines = args.num_processes, args.num_machines
    if config is not None:
        n = n if n is not None else config.num_processes
        machines = machines if machines is not None else config.num_machines
    if n is None or n <= 1 or (machines or 1) > 1:
        return None
    return int(n)


def _accelerator_device_available() -> bool:
    import torch

    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())


def check_sharding_backend() -> None:
    """Refuse FSDP or DeepSpeed on a machine without accelerator devices, before any model is loaded.

    accelerate (1.15) enables FSDP only for multi-GPU/XPU/NPU/... process groups (``AcceleratorState``: the FSDP
    branch lists no ``MULTI_CPU``; its FSDP plugin also needs a device for ``sync_module_states``) and turns
    DeepSpeed off on CPU (``ACCELERATE_USE_DEEPSPEED ... and not cpu``); ``accelerate launch --cpu`` with an
    FSDP or DeepSpeed config drops the config's backend. Either way the run would train as plain data
    parallelism without a word; this says so instead.

    Raises:
        ConfigError: FSDP or DeepSpeed asked for (environment, or the ``--cpu`` launch's flags and config) and no
            CUDA/XPU device present.
    """
    if _accelerator_device_available():
        return
    asked = [name for name, var in (("FSDP", "ACCELERATE_USE_FSDP"), ("DeepSpeed", "ACCELERATE_USE_DEEPSPEED"))
             if _truthy(os.environ.get(var))]
    launch = _cpu_launch()
    if launch is not None:
        args, config = launch
        kind = str(getattr(config, "distributed_type", "")) if config is not None else ""
        if getattr(args, "use_fsdp", False) or kind.endswith("FSDP"):
            asked.append("FSDP")
        if getattr(args, "use_deepspeed", False) or kind.endswith("DEEPSPEED"):
            asked.append("DeepSpeed")
    if asked:
        what = " and ".join(dict.fromkeys(asked))
        raise ConfigError(f"{what} was asked for, but this machine has no GPU (or other accelerator): accelerate "
                          f"enables FSDP only on accelerator devices and turns DeepSpeed off on CPU, so the run would "
                          "silently train as plain data parallelism. On CPU drop the FSDP/DeepSpeed config and launch "
                          "with accelerate launch --cpu --num_processes N, with train.sharding=fsdp2 to shard the "
                          "model (see the README, Multi-process and multi-GPU)")


def cpu_relaunch_command(argv: list[str], num_processes: int) -> list[str]:
    """The command that runs ``python -m dlmrl.cli <argv>`` as ``num_processes`` local CPU processes (gloo) at
    accelerate's ``MASTER_ADDR`` / ``MASTER_PORT``: ``torch.distributed.run`` through
    :mod:`dlmrl.training.cpu_launch`, which reports failed processes in one line instead of a traceback."""
    import sys

    return [sys.executable, "-m", "dlmrl.training.cpu_launch", "--nnodes", "1", "--nproc_per_node",
            str(num_processes), "--master_addr", os.environ.get("MASTER_ADDR", "127.0.0.1"),
            "--master_port", os.environ.get("MASTER_PORT", "29500"), "-m", "dlmrl.cli", *argv]


def check_process_split(cfg: Config, num_processes: int, preset=None) -> None:
    """Refuse, before any model is loaded, a config whose batch does not split over ``num_processes``.

    The rule: each process samples ``prompts_per_step / W`` prompts and all their G completions, so
    ``train.prompts_per_step`` must be a multiple of W and G >= 2. Presets whose loss ranks or normalises
    token entropies over the whole batch (SSPO's sentence-entropy rank, HAPO's entropy normalisation) are
    refused with W > 1 (``GroupObjective.needs_whole_batch``): each process would see only its share. So are tools
    inside the rollout (``train.env`` with a single-turn preset), which run on one process for now.

    Raises:
        ConfigError: naming the key and the process count.
    """
    tr = cfg.train
    if tr.num_generations < 2:
        raise ConfigError(f"config key 'train.num_generations': group size G must be >= 2, got {tr.num_generations}")
    if num_processes <= 1:
        return
    if tr.prompts_per_step % num_processes:
        ok = [m for m in range(num_processes, 4 * num_processes + 1, num_processes)]
        raise ConfigError(
            f"config key 'train.prompts_per_step': {tr.prompts_per_step} prompts do not split over {num_processes} "
            f"processes (each process samples prompts_per_step / num_processes prompts and all their "
            f"num_generations = {tr.num_generations} completions); use a multiple of {num_processes} "
            f"(e.g. {', '.join(map(str, ok[:3]))}) or launch a number of processes that divides it")
    preset = preset or build_preset(cfg)  # (the run's resolved one, RunSpec.preset)
    if tr.env is not None and not preset.multi_turn:
        raise ConfigError(f"config key 'train.env': tools inside the rollout run on one process for now "
                          f"({num_processes} launched); launch one process")
    objective = preset.objective
    if objective.needs_whole_batch:
        raise ConfigError(
            f"config key 'train.algorithm': {tr.algorithm!r} ranks or normalises token entropies over the whole "
            f"batch inside its loss ({objective.whole_batch_reason()}), which a process holding part of the "
            f"batch cannot do; run it with one process ({num_processes} launched)")


def split_range(n: int, index: int, count: int) -> tuple[int, int]:
    """Items ``[lo, hi)`` of ``n`` for process ``index`` of ``count`` (contiguous, sizes differ by at most 1)."""
    return n * index // count, n * (index + 1) // count


def group_share(group_ids: torch.Tensor, index: int, count: int) -> torch.Tensor:
    """``(n,)`` long indices of the rows of process ``index``: the rows of its contiguous range of groups
    (groups ordered by first appearance), so a group's rows (and DaGRPO's anchor, a Flow-GRPO trajectory's
    turns) never straddle processes.

    Args:
        group_ids: ``(B,)`` long group id of each row.
    """
    ids = group_ids.tolist()
    order: dict[int, int] = {}
    for g in ids:
        order.setdefault(g, len(order))
    lo, hi = split_range(len(order), index, count)
    return torch.tensor([i for i, g in enumerate(ids) if lo <= order[g] < hi], dtype=torch.long)


def _aggregation(loss_type: str | Aggregation) -> Aggregation:
    return LOSS_TYPES.build(loss_type) if isinstance(loss_type, str) else loss_type


def loss_units(loss_type: str | Aggregation, mask: torch.Tensor) -> float:
    """What the aggregation ``loss_type`` (a registered name or the part) divides a batch's sum by
    (:meth:`dlmrl.objectives.aggregation.Aggregation.units`): rows with a valid token (``grpo``,
    ``segment_mean``, ``sequence_sum``), rows (``dr_grpo``), valid tokens (``bnpo``); for ``dapo`` the number is
    passed in (``num_tokens``, the global count), so every batch counts 1.

    Args:
        mask: ``(B, L)`` bool valid tokens of the batch.
    Raises:
        ValueError: an unknown name.
    """
    return _aggregation(loss_type).units(mask)


def loss_share(loss_type: str | Aggregation, local_mask: torch.Tensor, global_mask: torch.Tensor) -> float:
    """The fraction ``u_p / u`` of the loss's normaliser this process's rows carry (:func:`loss_units`).

    An objective aggregated over a batch is ``Σ terms / u(batch)``; with rows split over W processes and
    gradients averaged, the process loss ``W · (u_p / u) · objective(rows_p)`` averages to the 1-process
    ``objective(all rows)``: ``(1/W) Σ_p W (u_p/u) Σ_p terms / u_p = Σ terms / u``. (For ``dapo`` the
    normaliser is the global token count already: its units are 1 for every share, so the factor is 1 and the
    weight is W.)

    Args:
        local_mask: ``(n, L)`` bool valid tokens of this process's rows. global_mask: ``(B, L)``, the batch's.
    """
    part = _aggregation(loss_type)
    total = part.units(global_mask)
    return part.units(local_mask) / total if total > 0 else 0.0


def agreed_count(local: int, processes: Processes | None) -> int:
    """The number of passes every process runs when each may be a collective: the largest ``local`` over the
    processes (one all-reduce with ``MAX``).

    Under FSDP or DeepSpeed ZeRO every forward gathers parameters and every backward reduces gradients across the
    processes, so a process that ran fewer micro-batches than another would leave it waiting forever; each
    process runs the agreed number instead, padding its own count with passes of loss weight 0. It is a collective
    itself: every process calls it at the same point, with its own count.

    Args:
        local: this process's count (``>= 0``). processes: :class:`Processes` (``None`` or one process: ``local``).
    Returns:
        ``max`` over the processes of ``local``.
    Raises:
        ValueError: ``local`` is not an integer ``>= 0``.
    """
    if isinstance(local, bool) or not isinstance(local, int) or local < 0:
        raise ValueError(f"agreed_count: local must be an integer >= 0, got {local!r}")
    if processes is None or processes.count == 1:
        return local
    backend = torch.distributed.get_backend()
    if backend not in ("gloo", "nccl"):  # (another backend: all_gather_object finds its own device)
        return max(processes.gather(local))
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    count = torch.tensor([local], dtype=torch.long, device=device)
    torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
    return int(count.item())


class GradientSync:
    """Micro-batched backward passes of one update where every forward and backward is a collective (FSDP2 or FSDP
    through ``accelerate``, dlmrl's ``train.sharding``, DeepSpeed ZeRO): the
    :class:`~dlmrl.estimators.scoring.Lockstep` the scorers take.

    - :meth:`count`: every process runs the most passes any process needs (:func:`agreed_count`), padding its own
      with passes of loss weight 0, so no collective waits on a process that has stopped;
    - :meth:`sync`: gradients are reduced across the processes in the update's last backward only, accumulated
      locally before: FSDP1 and DDP ``no_sync()``, DeepSpeed the gradient-accumulation boundary (``accelerate``'s
      ``sync_gradients``, which its ``backward`` hands to ``engine.set_gradient_accumulation_boundary`` and which
      keeps it from stepping the optimizer before the last backward); FSDP2 reduces in every backward (below).

    The reduced gradient is the sum of the passes' gradients averaged over the processes, as one backward of the
    whole share would give; the loss weights (:func:`loss_share`) make that the 1-process gradient. FSDP2 (dlmrl's
    ``train.sharding``) reduce-scatters in every backward instead, which gives the same sum and keeps the
    accumulated gradients sharded: the memory plan (:mod:`dlmrl.training.memory_plan`) counts them at 1/P.

    Args:
        processes: the run's :class:`Processes`. model: the prepared model (FSDP2 module, FSDP/DDP wrapper or
            DeepSpeed engine). accelerator: ``accelerate``'s, read for DeepSpeed (``None``: none).
    Reference: PyTorch FSDP2 ``FSDPModule`` (reduce-scatter per backward, ``set_requires_gradient_sync``); DeepSpeed
    ``DeepSpeedEngine.set_gradient_accumulation_boundary``; accelerate ``Accelerator.backward``.
    """

    def __init__(self, processes: Processes, model: torch.nn.Module, accelerator=None):
        self.processes, self.model, self.accelerator = processes, model, accelerator

    def count(self, local: int) -> int:
        """The passes every process runs (:func:`agreed_count`; a collective: every process calls it)."""
        return agreed_count(local, self.processes)

    def _deepspeed(self) -> bool:
        kind = getattr(self.accelerator, "distributed_type", None)
        return kind is not None and str(kind).endswith("DEEPSPEED")

    @contextlib.contextmanager
    def sync(self, last: bool):
        """One backward: reduced across the processes when ``last``, else accumulated on this process only."""
        if last:
            yield
            return
        if self._deepspeed():
            state = self.accelerator.gradient_state
            before = state.sync_gradients
            state._set_sync_gradients(False)  # (accelerate's own switch; it has no public setter)
            try:
                yield
            finally:
                state._set_sync_gradients(before)
            return
        from torch.distributed.fsdp import FSDPModule

        if any(isinstance(m, FSDPModule) for m in self.model.modules()):
            # FSDP2: every backward reduce-scatters and the shards accumulate the reduced parts, so the gradients stay
            # sharded (1/P of them per process). Switching the sync off until the last backward would save the
            # communication but keep every parameter's gradient whole, in float32, on every process (FSDP2's
            # unsharded_accumulated_grad): 65 GB per GPU for a 16B model, the memory sharding is for.
            yield
            return
        with getattr(self.model, "no_sync", contextlib.nullcontext)():
            yield


@dataclass
class Processes:
    """This process's place in a data-parallel run and the collectives the trainer needs.

    Attributes:
        index: this process (0 = main). count: processes (1: every method is a no-op).
    """

    index: int = 0
    count: int = 1

    @classmethod
    def from_accelerator(cls, accelerator) -> Processes:
        return cls(accelerator.process_index, accelerator.num_processes)

    def share(self, n: int) -> tuple[int, int]:
        """This process's items ``[lo, hi)`` of ``n`` (:func:`split_range`)."""
        return split_range(n, self.index, self.count)

    def gather(self, obj: Any) -> list:
        """Every process's ``obj`` (picklable; tensors on the CPU), in process order."""
        if self.count == 1:
            return [obj]
        out: list = [None] * self.count
        torch.distributed.all_gather_object(out, obj)
        return out

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any process (e.g. a stop signal that reached one of them)."""
        return flag if self.count == 1 else any(self.gather(bool(flag)))

    def gather_rows(self, values: torch.Tensor, rows: torch.Tensor, total: int) -> torch.Tensor:
        """``(total, ...)``: each process's ``values (K_p, ...)`` placed at its global ``rows (K_p,)``."""
        out = values.new_zeros((total, *values.shape[1:]))
        for r, v in self.gather((rows.cpu(), values.detach().cpu())):
            out[r.to(out.device)] = v.to(out)
        return out

    def average_gradients(self, parameters: Iterable[torch.nn.Parameter], bucket: int = 1 << 24) -> None:
        """Average the ``.grad`` of ``parameters`` over processes (one all-reduce per bucket of ``bucket``
        numbers; a parameter without a gradient counts as zeros), as DDP would after one backward."""
        if self.count == 1:
            return
        params = [p for p in parameters if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        group: list[torch.Tensor] = []
        size = 0
        for i, p in enumerate(params):
            group.append(p.grad)
            size += p.grad.numel()
            if size >= bucket or i == len(params) - 1:
                flat = torch.cat([g.reshape(-1) for g in group])
                torch.distributed.all_reduce(flat)
                flat /= self.count
                offset = 0
                for g in group:
                    g.copy_(flat[offset : offset + g.numel()].view_as(g))
                    offset += g.numel()
                group, size = [], 0

    def combine_metrics(self, metrics: dict[str, float | None], weight: float) -> dict[str, float | None]:
        """Batch-level values of per-process metrics: ``loss`` summed over processes / W (each process's loss is
        its weighted share), ``*_min`` / ``*_max`` the min / max over processes with rows (``weight > 0``),
        ``grad_norm`` and ``lr`` as they are (the same everywhere), every other value the mean weighted by each
        process's share of the loss normaliser ``weight`` (exact for the aggregated KL; for token-level ratio
        statistics a close approximation)."""
        if self.count == 1:
            return metrics
        parts = self.gather((weight, metrics))
        out: dict[str, float | None] = {}
        for key, value in metrics.items():
            vals = [(w, m[key]) for w, m in parts if m.get(key) is not None]
            if value is None and not vals:
                out[key] = None
            elif key in ("grad_norm", "lr"):
                out[key] = value
            elif key == "loss":
                out[key] = sum(v for _, v in vals) / self.count
            elif key.endswith(("_min", "_max")):
                held = [v for w, v in vals if w > 0] or [v for _, v in vals]
                out[key] = min(held) if key.endswith("_min") else max(held)
            else:
                total = sum(w for w, _ in vals)
                out[key] = (sum(w * v for w, v in vals) / total) if total > 0 else vals[0][1]
        return out


def gather_rollout(ro: Rollout, processes: Processes, pad_id: int) -> Rollout:
    """The whole batch from every process's share ``ro`` (shares in process order; :meth:`Rollout.cat`:
    prompts left-padded to the longest, group and trajectory ids renumbered), on ``ro``'s device.

    ``nfe`` is the largest share's (the sampler runs the same steps on every share; AR: the longest
    completion of the whole batch), or with per-row counts (``row_nfe``: diffusion rollouts, where threshold
    decoding gives every share its own steps) their mean over the whole batch; ``passes`` the shares' sum (the
    forward passes the processes ran).
    """
    if processes.count == 1:
        return ro
    device = ro.completion.device
    parts = processes.gather(ro.to("cpu"))
    out = Rollout.cat(parts, pad_id).to(device)
    out.nfe = mean_nfe(out.row_nfe) if out.row_nfe is not None else max(p.nfe for p in parts)
    out.passes = sum(p.sampling_passes() for p in parts)
    return out
