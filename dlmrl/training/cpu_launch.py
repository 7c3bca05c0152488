"""``torch.distributed.run`` for the CPU processes ``dlmrl train`` starts itself, with failures in one line.

When a process stops with an error (say a model that cannot be loaded), it prints its own message (``dlmrl
train: ...``); ``torch.distributed.run`` would then add a ``ChildFailedError`` traceback under it, which buries
the message. This entry point runs the same launcher and reports which processes failed and how, then exits
with their exit code.

    python -m dlmrl.training.cpu_launch --nproc_per_node 2 ... -m dlmrl.cli train ...   (torchrun's arguments)
"""

from __future__ import annotations

import sys


def _first_signal_only() -> None:
    """Make the elastic agent's signal handler act on the first signal only. Ctrl-C reaches the agent and
    ``accelerate launch`` together, and accelerate then sends SIGTERM to every process it started: a second
    ``SignalException`` raised inside the agent's shutdown (its logging, its wait for the processes to save their
    checkpoint) would print a traceback and cut the shutdown short. (A private function of
    ``torch.distributed.elastic.multiprocessing.api``; left alone where it does not exist.)"""
    from torch.distributed.elastic.multiprocessing import api

    original = getattr(api, "_terminate_process_handler", None)
    if original is None or getattr(original, "_dlmrl_once", False):
        return
    fired = []

    def once(signum, frame):
        if fired:  # (the shutdown the first signal asked for is under way)
            return
        fired.append(signum)
        original(signum, frame)

    once._dlmrl_once = True
    api._terminate_process_handler = once


def main(argv: list[str] | None = None) -> int:
    """Run ``torch.distributed.run`` with ``argv``; ``0``, the first failed process's exit code, or after Ctrl-C or
    SIGTERM (the agent stops the processes, each saving a checkpoint after its step) ``128 + signal``, in one line
    instead of the agent's ``SignalException`` traceback."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    _first_signal_only()
    try:
        run(parse_args(argv if argv is not None else sys.argv[1:]))
    except (KeyboardInterrupt, SignalException) as e:
        # (a second signal, accelerate launch's SIGTERM after the Ctrl-C, can interrupt the agent's shutdown:
        # the first one is what stopped the run)
        first = e
        while isinstance(first.__context__, (KeyboardInterrupt, SignalException)):
            first = first.__context__
        sig = getattr(first, "sigval", 2)  # (KeyboardInterrupt: SIGINT)
        print(f"dlmrl train: the CPU processes were stopped (signal {int(sig)}); each saves a checkpoint after its "
              "current step (continue with --resume)", file=sys.stderr)
        return 128 + int(sig)
    except ChildFailedError as e:
        failures = sorted(e.failures.items())
        codes = ", ".join(f"process {rank}: exit code {f.exitcode}" for rank, f in failures)
        print(f"dlmrl train: {len(failures)} CPU process(es) stopped ({codes}); the message each printed is "
              "above", file=sys.stderr)
        # (a process the launcher stopped because another failed shows a negative code, the signal's: report the
        # code of one that failed on its own)
        own = [f.exitcode for _, f in failures if isinstance(f.exitcode, int) and f.exitcode > 0]
        return own[0] if own else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
