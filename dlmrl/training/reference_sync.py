"""A KL reference that follows the policy: TR-DPO's reference update, as TRL's ``sync_ref_model``.

Every ``ref_model_sync_steps`` optimizer steps the reference moves toward the policy,

    π_ref ← α · π_θ + (1 − α) · π_ref      (per parameter; α = ``ref_model_mixup_alpha``),

TR-DPO (Gorbatovski et al., arXiv 2404.09656, §3 "soft update"); TRL's ``SyncRefModelCallback.sync_target_model``
(``trl/trainer/callbacks.py``: ``target.mul_(1 − α).add_(source, alpha=α)``) with ``GRPOConfig``'s defaults
α 0.6 and 512 steps. NVIDIA's report of diffusion RL collapsing under full fine-tuning (NeMo RL, pull request 3167)
is why dlmrl offers it: a KL toward a reference that follows the policy restrains each stretch of updates without
pinning the policy to its start.

**Full fine-tuning**: the reference is the frozen copy of the initial weights the KL term already keeps; its
parameters are mixed in place. **LoRA** (dlmrl's choice; TRL refuses ``sync_ref_model`` with PEFT): the reference
is a second adapter (:data:`dlmrl.models.lora.REFERENCE_ADAPTER`) on the same base, created equal to the policy's
adapter at the start (so the reference is the initial model, as the disabled adapter was), and the mix is applied
to the adapter's own parameters (``lora_A``, ``lora_B``, ...). That mixes the factors, not the weight deltas
``B·A`` (the delta of the mixed factors differs from the mixed deltas by ``α(1 − α)·(B_θ − B_ref)(A_θ − A_ref)``),
so for α < 1 the reference is a model in the adapter's family between the two, not TR-DPO's weight average
exactly; α = 1 (a hard sync) is exact. It costs one adapter's parameters instead of a copy of the model
(``tests/training/test_reference_sync.py`` measures both).

**When** (dlmrl's steps are rollout batches, each of ``train.num_iterations × steps_per_generation`` optimizer
steps): the mix is applied at the end of the training step in which the run's optimizer-step count reaches a
multiple of ``ref_model_sync_steps`` (once, with the weights at the end of that step). The reference's state is in
every checkpoint, so ``--resume`` continues with the reference the run had.
"""

from __future__ import annotations

import torch
from torch import nn

from dlmrl.models.lora import REFERENCE_ADAPTER, peft_model_of

__all__ = ["SyncedReference", "adapter_pairs"]


def adapter_pairs(model: nn.Module, source: str = "default",
                  target: str = REFERENCE_ADAPTER) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(target, source)`` parameter pairs of two adapters of one peft model, matched by name (the adapter's
    name is a path component of each of its parameters, e.g. ``...q_proj.lora_A.default.weight``).

    Raises:
        ValueError: ``model`` holds no peft adapter, or the two adapters' parameters do not match one to one.
    """
    peft = peft_model_of(model)
    if peft is None:
        raise ValueError("adapter_pairs needs a model that holds a peft adapter")
    params = dict(peft.named_parameters())
    tag_s, tag_t = f".{source}.", f".{target}."
    pairs = [(params[name.replace(tag_s, tag_t)], p) for name, p in params.items()
             if tag_s in name and name.replace(tag_s, tag_t) in params]
    own = sum(1 for name in params if tag_t in name)
    if not pairs or len(pairs) != own:
        raise ValueError(f"adapters {source!r} and {target!r} do not match one to one ({len(pairs)} pairs, {own} "
                         f"parameters of {target!r})")
    return pairs


class SyncedReference:
    """The mix of the policy into its KL reference (module docstring).

    Args:
        pairs: ``(reference parameter, policy parameter)`` tensors: the reference copy's and the policy's parameters
            in order (full fine-tuning), or :func:`adapter_pairs` (LoRA).
        alpha: α in (0, 1] (``train.ref_model_mixup_alpha``).
        every: optimizer steps between mixes (``train.ref_model_sync_steps``, >= 1).
    """

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], alpha: float, every: int):
        for ref, own in pairs:
            if ref.shape != own.shape:
                raise ValueError(f"reference and policy parameters differ in shape: {tuple(ref.shape)} vs "
                                 f"{tuple(own.shape)}")
        self.pairs, self.alpha, self.every = pairs, float(alpha), int(every)

    def due(self, steps_before: int, steps_after: int) -> bool:
        """Whether the optimizer-step count passed a multiple of ``every`` going from ``steps_before`` to
        ``steps_after``."""
        return steps_after // self.every > steps_before // self.every

    @torch.no_grad()
    def sync(self) -> None:
        """``ref ← α · θ + (1 − α) · ref`` for every pair, in place (in the reference's dtype)."""
        for ref, own in self.pairs:
            ref.mul_(1.0 - self.alpha).add_(own.detach().to(ref.dtype), alpha=self.alpha)

    @staticmethod
    def full(reference: nn.Module, policy: nn.Module, alpha: float, every: int) -> SyncedReference:
        """The pairs of a frozen full copy ``reference`` of ``policy`` (same architecture: parameters in the same
        order, names checked)."""
        ref = dict(reference.named_parameters())
        own = dict(policy.named_parameters())
        if list(ref) != list(own):
            raise ValueError("the reference copy's parameters are not the policy's (names differ)")
        return SyncedReference([(ref[n], own[n]) for n in own], alpha, every)
