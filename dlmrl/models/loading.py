"""Loading a policy from a local folder, a hub id, or the shipped tiny default."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import torch

from dlmrl.models.families import FAMILIES, detect_family
from dlmrl.models.policy import MaskedDiffusionPolicy

#: Name that resolves to the tiny Sudoku denoiser shipped in ``dlmrl/assets``.
TINY_DEFAULT = "tiny-sudoku"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(name_or_path: str) -> str:
    """``tiny-sudoku`` → the shipped checkpoint folder; anything else is returned unchanged."""
    if name_or_path == TINY_DEFAULT:
        return str(resources.files("dlmrl") / "assets" / "tiny_sudoku")
    return name_or_path


def load_policy(
    name_or_path: str = TINY_DEFAULT,
    family: str = "auto",
    trust_remote_code: bool = False,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
) -> MaskedDiffusionPolicy:
    """Load a masked-diffusion policy (model + tokenizer + family adapter).

    Args:
        name_or_path: a local folder, a hub id, or ``"tiny-sudoku"`` for the shipped default.
        family: ``auto`` (detected from the checkpoint config) or a name in ``FAMILIES``.
        trust_remote_code: passed to ``from_pretrained`` only as given (never forced on).
        dtype: ``float32``, ``bfloat16`` or ``float16``.
    Raises:
        ValueError: unknown dtype, undetectable family, or no mask token.
        FileNotFoundError: a local-looking path that does not exist.
    """
    from transformers import AutoConfig, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    path = resolve_model_path(name_or_path)
    if (path.startswith((".", "/")) or Path(path).suffix) and not Path(path).exists():
        raise FileNotFoundError(f"model path {path!r} does not exist")
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    name = detect_family(config) if family == "auto" else family
    fam = FAMILIES.get(name)
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    model = fam.load(path, trust_remote_code, DTYPES[dtype]).to(device)
    mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask_id is None:
        mask_id = fam.default_mask_token_id
    if mask_id is None:
        raise ValueError(f"{path}: the tokenizer has no mask token and family {name!r} sets none")
    return MaskedDiffusionPolicy(
        model=model,
        tokenizer=tokenizer,
        mask_token_id=int(mask_id),
        family=name,
        logits_fn=fam.logits,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
