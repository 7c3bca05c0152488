"""The policy kinds (``model.kind``), with no imports: the config, the models and the trainer all read them."""

from __future__ import annotations

#: policy kinds that are masked-diffusion models (a sampler's trajectory, likelihood estimators): full attention
#: (``diffusion``) and block-causal (``block``); ``ar`` is the causal LM
DIFFUSION_KINDS = ("diffusion", "block")
POLICY_KINDS = (*DIFFUSION_KINDS, "ar")
#: the ``config.json`` key in which dlmrl records the policy kind a checkpoint was trained as: every saved
#: ``final_model/``, ``Trainer.save`` folder and pretrained model carries it, so a folder moved out of its run still
#: loads as the kind it was trained as (:func:`dlmrl.models.loading.checkpoint_kind`)
KIND_KEY = "dlmrl_kind"


def base_kind(kind: str) -> str:
    """``"diffusion"`` for both diffusion kinds, else ``kind``: the policies an algorithm preset lists
    (``AlgorithmPreset.policies``) and the scorer's interface are those of a masked-diffusion or a causal LM."""
    return "diffusion" if kind in DIFFUSION_KINDS else kind


def parse_block_sizes(text: str) -> list[int]:
    """``"1,2,4"`` → ``[1, 2, 4]`` (the block pretraining's ``block_sizes``).

    Raises:
        ValueError: an entry that is not an integer >= 1, or none at all.
    """
    try:
        sizes = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(b < 1 for b in sizes):
        raise ValueError(f"block_sizes must be a comma list of integers >= 1, got {text!r}")
    return sizes
