"""What the peers scripts share: the commits and machine a JSON records, a worker run in a fresh process, and the
statistical comparison of a quantity measured on both sides over repeats.

Each script in ``benchmarks/peers/`` times dlmrl against one peer tool (TRL, d1, SDAR, Fast-dLLM); this module holds
only the pieces that do not depend on the peer.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def set_threads(threads: int | None) -> None:
    """``torch.set_num_threads(threads)`` when given (None: torch's default)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def git(folder: Path, *cmd: str) -> str | None:
    """``git -C folder cmd...``'s stripped output, or None when git fails or is missing."""
    try:
        out = subprocess.run(["git", "-C", str(folder), *cmd], capture_output=True, text=True, check=False)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def dlmrl_commit() -> str | None:
    """dlmrl's HEAD, marked ``(with uncommitted changes)`` when tracked files differ from it."""
    commit = git(ROOT, "rev-parse", "HEAD")
    if commit and git(ROOT, "status", "--porcelain", "--untracked-files=no"):
        commit += " (with uncommitted changes)"
    return commit


def machine(threads: int | None) -> dict:
    """The platform, Python, CPU count, torch threads and the 1-minute load average now."""
    return {"platform": platform.platform(), "python": platform.python_version(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "threads": threads or "torch's default",
            "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def run_worker(script: Path, argv: list[str], tool: str, env: dict | None = None) -> dict:
    """``python script argv... --worker-out FILE`` in a fresh process from the repository root; the JSON it wrote.

    Raises:
        RuntimeError: the worker exited non-zero (its command and the end of its stderr in the message).
    """
    with tempfile.TemporaryDirectory(prefix=f"peers_{tool}_") as tmp:
        out = Path(tmp) / "worker.json"
        cmd = [sys.executable, str(Path(script).resolve()), *argv, "--worker-out", str(out)]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"the {tool} run failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                               f"{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


def agreement(ours: list[float | None], theirs: list[float | None], peer: str) -> dict:
    """Whether dlmrl's and the peer's values of one quantity over repeats agree within their seed spread.

    Returns the means over repeats (``dlmrl_mean``, ``<peer>_mean``), their difference, the standard deviations
    (``dlmrl_sd``, ``<peer>_sd``), the standard error of the difference ``sqrt(sd_dlmrl² / R_dlmrl + sd_peer² /
    R_peer)`` and ``within_noise``: ``|difference| <= 2 standard errors``. The means are None when a side has no
    value or any value is None; the spreads and the verdict are None with fewer than 2 values a side (no noise
    estimate).
    """
    out = {"dlmrl_mean": None, f"{peer}_mean": None, "difference": None, "dlmrl_sd": None, f"{peer}_sd": None,
           "standard_error": None, "within_noise": None}
    if not ours or not theirs or any(v is None for v in ours + theirs):
        return out
    m1, m2 = statistics.fmean(ours), statistics.fmean(theirs)
    out.update({"dlmrl_mean": m1, f"{peer}_mean": m2, "difference": m1 - m2})
    if len(ours) >= 2 and len(theirs) >= 2:
        s1, s2 = statistics.stdev(ours), statistics.stdev(theirs)
        se = math.sqrt(s1**2 / len(ours) + s2**2 / len(theirs))
        out.update({"dlmrl_sd": s1, f"{peer}_sd": s2, "standard_error": se, "within_noise": abs(m1 - m2) <= 2 * se})
    return out


def add_run_options(p, *, worker: str, peer: str, steps: int, units: str, lr: float, lr_source: str = "") -> None:
    """The options every side-by-side training script takes: ``--steps`` (``units`` per run, the first a warm-up),
    ``--repeats``, ``--seed``, ``--lr``, ``--threads`` and the hidden ``--worker`` / ``--worker-out`` of a worker
    process (``worker``: the peer's worker name)."""
    import argparse

    p.add_argument("--steps", type=int, default=steps, help=f"{units} per run (default {steps}; the first is warm-up)")
    p.add_argument("--repeats", type=int, default=3, help=f"dlmrl/{peer} pairs of runs, alternating (default 3)")
    p.add_argument("--seed", type=int, default=0, help="repeat r uses seed + r on both sides (default 0)")
    p.add_argument("--lr", type=float, default=lr, help=f"AdamW learning rate on both sides (default {lr_source}{lr:g})")
    p.add_argument("--threads", type=int, default=None, help="torch threads in both workers (default: torch's own)")
    p.add_argument("--worker", choices=("dlmrl", worker), help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)


def check_run_options(p, args, unit: str) -> None:
    """``p.error`` (exit 2, naming the option) for a value :func:`add_run_options`' options cannot take."""
    if args.steps < 2:
        p.error(f"--steps must be >= 2 (the first {unit} of each run is warm-up, not timed)")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    if not 0 < args.lr < 1:
        p.error("--lr must be in (0, 1)")


def step_recorder(log_key: str):
    """A ``transformers.TrainerCallback`` that records each optimizer step's wall time (``.seconds``, between
    ``on_step_begin`` and ``on_step_end``) and the trainer's log records holding ``log_key`` (``.logs``)."""
    import time

    from transformers import TrainerCallback

    class StepRecorder(TrainerCallback):
        def __init__(self):
            self.seconds, self.logs, self._t0 = [], [], None

        def on_step_begin(self, args, state, control, **kw):
            self._t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.seconds.append(time.perf_counter() - self._t0)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and log_key in logs:
                self.logs.append(dict(logs))

    return StepRecorder()


def number(v, fmt: str = "{:.4g}") -> str:
    """``fmt`` of ``v``, or ``-`` for None."""
    return "-" if v is None else fmt.format(v)


def ratio_line(ratio: dict | None, peer: str, what: str = "") -> list[str]:
    """The line ``ratio dlmrl/<peer><what> over repeats: min, median, max`` (none without a ratio)."""
    if not ratio:
        return []
    return [(f"ratio dlmrl/{peer}{what} over repeats: min {ratio['min']:.2f}x, median {ratio['median']:.2f}x, "
            f"max {ratio['max']:.2f}x")]


def agreement_line(label: str, a: dict, peer_key: str, peer: str, fmt: str = "{:.4g}") -> str:
    """One :func:`agreement` as a line: both means, the difference, its standard error and the verdict."""
    verdict = {True: "within 2 standard errors", False: "NOT within 2 standard errors",
               None: "no verdict (needs --repeats >= 2 and values on both sides)"}[a["within_noise"]]
    return (f"{label}: dlmrl {number(a['dlmrl_mean'], fmt)}, {peer} {number(a[f'{peer_key}_mean'], fmt)}, difference "
            f"{number(a['difference'], fmt)}, standard error {number(a['standard_error'], fmt)}: {verdict}")
