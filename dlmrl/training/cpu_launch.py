"""``torch.distributed.run`` for the CPU processes ``dlmrl train`` starts itself, with failures in one line.

When a process stops with an error (say a model that cannot be loaded), it prints its own message (``dlmrl
train: ...``); ``torch.distributed.run`` would then add a ``ChildFailedError`` traceback under it, which buries
the message. This entry point runs the same launcher and reports which processes failed and how, then exits
with their exit code.

    python -m dlmrl.training.cpu_launch --nproc_per_node 2 ... -m dlmrl.cli train ...   (torchrun's arguments)
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run ``torch.distributed.run`` with ``argv``; ``0``, or the first failed process's exit code."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(argv if argv is not None else sys.argv[1:]))
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
