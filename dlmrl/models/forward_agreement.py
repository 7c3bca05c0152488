"""How many forward calls a family's logits function makes, agreed over processes that shard the model.

Under FSDP2 or DeepSpeed ZeRO-3 every forward call of the model gathers each layer's parameters from every process
and every backward reduces its gradients: a process that calls the model fewer times than another leaves that one
waiting forever. The scorers already run the same number of scoring passes on every process
(:class:`dlmrl.estimators.scoring.Lockstep`); a family whose logits function calls the model a data-dependent
number of times inside one pass (LLaDA: one call per left-padding length, :func:`dlmrl.models.families.llada_logits`)
asks :func:`agreed_forwards` how many calls to make and pads its own count with calls that add zero to its output.

The scorer sets the agreement for the passes it runs (:func:`forward_agreement`); outside it (one process, DDP, the
rollout of a model gathered once per rollout) the local count stands.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

#: ``count(local) -> agreed`` of the scoring pass now running, or ``None`` (the local count stands)
_AGREE: ContextVar[Callable[[int], int] | None] = ContextVar("dlmrl_forward_agreement", default=None)


@contextlib.contextmanager
def forward_agreement(count: Callable[[int], int] | None) -> Iterator[None]:
    """Inside: :func:`agreed_forwards` asks ``count`` (a collective every process calls at the same point, e.g.
    :meth:`dlmrl.training.distributed.GradientSync.count`); ``None`` leaves the local count."""
    token = _AGREE.set(count)
    try:
        yield
    finally:
        _AGREE.reset(token)


def agreed_forwards(local: int) -> int:
    """The number of model calls every process makes where this one needs ``local`` (``local`` itself outside a
    :func:`forward_agreement`)."""
    count = _AGREE.get()
    return local if count is None else count(local)
