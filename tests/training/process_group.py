"""Run a function in several CPU processes joined by a gloo process group (a test helper).

``torch.multiprocessing.spawn`` starts the processes; each calls ``fn(rank, count, *args)`` inside an initialised
``gloo`` group and its return value comes back through a file (``torch.save``). A process that raises fails the
call with that process's traceback (spawn's ``ProcessRaisedException``); one that hangs in a collective is ended by
the group's timeout.
"""

from __future__ import annotations

import os
import socket
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, count: int, port: int, out: str, fn, args: tuple, timeout_s: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # (two processes on a small machine: no oversubscription)
    dist.init_process_group("gloo", rank=rank, world_size=count, timeout=timedelta(seconds=timeout_s))
    try:
        result = fn(rank, count, *args)
        torch.save(result, Path(out) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_processes(fn, count: int = 2, *args, timeout_s: float = 120.0) -> list:
    """``[fn(0, count, *args), ..., fn(count - 1, count, *args)]``, each run in its own process of one gloo group.

    ``fn`` must be importable by name (a module-level function) and return something ``torch.save`` can write.
    """
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_entry, args=(count, free_port(), out, fn, args, timeout_s), nprocs=count, join=True)
        return [torch.load(Path(out) / f"{rank}.pt", weights_only=False) for rank in range(count)]
