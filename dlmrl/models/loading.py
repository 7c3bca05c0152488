"""Loading a policy from a local folder, a hub id, or the shipped tiny default.

One loader for every family (``dlmrl.models.families``): the family is read from the checkpoint's
``config.json`` without running any of its code, checkpoints whose model code ships with them are
refused unless ``trust_remote_code`` is set, and the mask token id is resolved from the tokenizer,
the config or the family's constant, in that order.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import torch

from dlmrl.models.families import FAMILIES, detect_family
from dlmrl.models.lora import attach_adapter, check_adapter_kind, find_adapter
from dlmrl.models.policy import MaskedDiffusionPolicy

#: Name that resolves to the tiny Sudoku denoiser shipped in ``dlmrl/assets``.
TINY_DEFAULT = "tiny-sudoku"
#: Name of the shipped tiny block-diffusion Sudoku model (``model.kind: block``; trained on block sizes 1-16).
TINY_BLOCK_DEFAULT = "tiny-sudoku-block"
#: Name of the shipped tiny DiffusionGemma Sudoku model (``model.kind: uniform``; uniform-noise SFT, canvases of 16).
TINY_UNIFORM_DEFAULT = "tiny-sudoku-uniform"
_SHIPPED = {TINY_DEFAULT: "tiny_sudoku", TINY_BLOCK_DEFAULT: "tiny_sudoku_block",
            TINY_UNIFORM_DEFAULT: "tiny_sudoku_uniform"}
#: shipped causal (``model.kind: ar``) checkpoints by name: the Sudoku default, the multi-hop tool-use base (SFT on
#: scripted traces) and the recommender (SFT on the recommend task's users); ``dlmrl.models.ar`` loads them
SHIPPED_AR = {"tiny-sudoku-ar": "tiny_sudoku_ar", "tiny-multihop-ar": "tiny_multihop_ar",
              "tiny-recommend-ar": "tiny_recommend_ar"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def shipped_path(name: str, shipped: dict[str, str] | None = None) -> str | None:
    """The ``dlmrl/assets`` folder of a shipped checkpoint named ``name`` among ``shipped`` (name -> folder; default
    every shipped checkpoint, diffusion, block and AR), else ``None``."""
    folder = (shipped if shipped is not None else {**_SHIPPED, **SHIPPED_AR}).get(name)
    return str(resources.files("dlmrl") / "assets" / folder) if folder else None


def resolve_model_path(name_or_path: str) -> str:
    """``tiny-sudoku`` / ``tiny-sudoku-block`` / ``tiny-sudoku-uniform`` → the shipped checkpoint folder; anything else
    is returned unchanged."""
    return shipped_path(name_or_path, _SHIPPED) or name_or_path


#: every shipped checkpoint's name and the policy kind its ``config.json`` records
SHIPPED_KINDS = {TINY_DEFAULT: "diffusion", TINY_BLOCK_DEFAULT: "block", TINY_UNIFORM_DEFAULT: "uniform",
                 **dict.fromkeys(SHIPPED_AR, "ar")}


def is_shipped(name: str) -> bool:
    """Whether ``name`` names a checkpoint shipped in ``dlmrl/assets`` (``tiny-sudoku``, ``tiny-sudoku-ar``, ...)."""
    return name in SHIPPED_KINDS


def checkpoint_kind(name_or_path: str, known=None) -> str | None:
    """The policy kind a local (or shipped) checkpoint records: a LoRA adapter folder's note
    (``dlmrl_base_model.json`` ``kind``, else its base model's), else ``config.json``'s ``dlmrl_kind`` (:data:`dlmrl.models.checkpoint_keys.KIND_KEY`);
    ``None`` when it records none (a checkpoint dlmrl did not write, a hub id: nothing is fetched here).
    ``known``: the policy kinds' names (:data:`dlmrl.kinds.KINDS`, the config check's); a recorded value outside
    them is refused (default: the built-in kinds of :data:`SHIPPED_KINDS`).

    Raises:
        ConfigError: a recorded value that is not a policy kind (naming the file).
    """
    import json

    from dlmrl.errors import ConfigError
    from dlmrl.models.checkpoint_keys import KIND_KEY
    from dlmrl.models.lora import read_adapter

    known = list(known) if known is not None else list(dict.fromkeys(SHIPPED_KINDS.values()))

    try:
        adapter = read_adapter(name_or_path)
    except (ValueError, OSError):  # (an unreadable adapter: the loader reports it)
        adapter = None
    if adapter is not None:
        return adapter.kind if adapter.kind is not None else checkpoint_kind(adapter.base_model_name_or_path, known)
    folder = Path(shipped_path(name_or_path) or name_or_path)
    file = folder / "config.json"
    try:
        value = json.loads(file.read_text()).get(KIND_KEY) if file.is_file() else None
    except (OSError, ValueError, AttributeError):  # (an unreadable config.json: the loader reports it)
        return None
    if value is not None and value not in known:
        raise ConfigError(f"{file}: {KIND_KEY} {value!r} is not a policy kind (one of {', '.join(known)}; a kind "
                          "registered by a plugin: import its module, dlmrl --import MODULE)")
    return value


def checkpoint_block_size(name_or_path: str, family: str = "auto") -> int | None:
    """The block size a block-diffusion checkpoint records: its ``config.json`` ``block_size`` (SDAR's configs and
    dlmrl's tiny block model carry one) or ``bd_size`` (Fast-dLLM v2's), else its family's default (``llada2``: 32;
    ``family`` ``auto`` = detected from the config), following a LoRA adapter folder to its base model; ``None`` when
    there is none or the config cannot be read (a hub id is looked up like any config).

    Raises:
        ValueError: ``config.json`` records a ``block_size`` that is not an integer >= 1 (``0``, ``16.0``,
            ``"16"``): naming the file and the value (a recorded size is never replaced by the family's default).
    """
    import json

    from dlmrl.models.lora import BASE_NOTE

    adapter = find_adapter(name_or_path)
    if adapter is not None:  # (a block run's adapter records the block size it was trained with)
        note = Path(adapter.path) / BASE_NOTE
        if note.is_file() and isinstance(json.loads(note.read_text()).get("block_size"), int):
            return json.loads(note.read_text())["block_size"]
    path = resolve_model_path(adapter.base_model_name_or_path if adapter is not None else name_or_path)
    if looks_local(path) and not Path(path).exists():
        return None
    try:
        config = read_checkpoint_config(path)
    except (OSError, ValueError):
        return None
    value = config.get("block_size")
    if value is None:  # (Fast-dLLM v2's config.json calls it bd_size)
        value = config.get("bd_size")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if value is not None:  # (a bad recorded size is the checkpoint's mistake: refused, not silently replaced)
        where = Path(path) / "config.json" if Path(path).is_dir() else f"the config.json of {path}"
        raise ValueError(f"{where} records block_size {value!r}, which is not a block size (an integer >= 1); fix "
                         "config.json's block_size, or set model.block_size")
    try:
        name = detect_family(config) if family == "auto" else family
    except ValueError:
        return None
    return FAMILIES.get(name).default_block_size if name in FAMILIES else None


def looks_local(name_or_path: str) -> bool:
    """Whether a model name can only be a local path, so a missing one is an error here rather than a hub
    lookup: it starts with ``.``, ``/`` or ``~``, has more than one ``/`` (hub ids are ``name`` or
    ``owner/name``), or ends in a file extension. ``GSAI-ML/LLaDA-1.5`` and ``Qwen/Qwen2.5-0.5B`` are hub ids."""
    file_ext = (".json", ".safetensors", ".bin", ".pt", ".yaml", ".yml")
    return (name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
            or name_or_path.lower().endswith(file_ext))


def read_checkpoint_config(path: str) -> dict:
    """The checkpoint's ``config.json`` as a plain dict, read without importing any checkpoint code.

    Raises:
        OSError: if there is no ``config.json`` at ``path`` (or, for a hub id, it cannot be fetched).
    """
    from transformers import PretrainedConfig

    config, _ = PretrainedConfig.get_config_dict(path)
    return config


def needs_remote_code(config: dict) -> bool:
    """True when the checkpoint's model code ships with it: an ``auto_map`` and a ``model_type``
    that ``transformers`` does not know (LLaDA's ``llada``, Dream's ``Dream``), or knows only because checkpoint
    code run earlier in this process registered it (LLaDA's ``configuration_llada.py`` calls
    ``AutoConfig.register("llada", ...)`` when imported)."""
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not config.get("auto_map"):
        return False
    return model_type not in CONFIG_MAPPING or CONFIG_MAPPING[model_type].__module__.startswith("transformers_modules")


def resolve_mask_token_id(
    tokenizer, config: dict, family_default: int | None, override: int | None = None
) -> int:
    """The absorbing mask token id ``M``.

    Order: ``override``; else the tokenizer's ``mask_token_id`` (BERT-family ``[MASK]``/``<mask>``);
    else ``config.json``'s ``mask_token_id`` (LLaDA: 126336, Dream: 151666); else the family's
    fallback (``Family.fallback_mask_token_id``: a mask token its tokenizers name, LLaDA-MoE's ``<|mask|>``, or its
    constant).

    Raises:
        ValueError: if the tokenizer and the config name different ids (pass ``override``), or no
            source names one.
    """
    if override is not None:
        return int(override)
    from_tokenizer = getattr(tokenizer, "mask_token_id", None)
    from_config = config.get("mask_token_id")
    if from_tokenizer is not None and from_config is not None and int(from_tokenizer) != int(from_config):
        raise ValueError(
            f"the tokenizer's mask token id ({from_tokenizer}) differs from config.json's mask_token_id "
            f"({from_config}); pass mask_token_id= to load_policy to choose"
        )
    for candidate in (from_tokenizer, from_config, family_default):
        if candidate is not None:
            return int(candidate)
    raise ValueError("no mask token: the tokenizer has none, config.json sets no mask_token_id, and the family finds "
                     "none in the checkpoint; add mask_token_id to the checkpoint's config.json (or pass mask_token_id= to "
                     "load_policy)")


def _output_vocab_size(model) -> int | None:
    try:
        head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None else None


def load_policy(
    name_or_path: str = TINY_DEFAULT,
    family: str = "auto",
    trust_remote_code: bool = False,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    mask_token_id: int | None = None,
    adapter_kinds: tuple[str, ...] = ("diffusion", "block"),
) -> MaskedDiffusionPolicy:
    """Load a masked-diffusion policy (model + tokenizer + family adapter).

    Args:
        name_or_path: a local folder, a hub id, or ``"tiny-sudoku"`` for the shipped default. A folder holding
            a LoRA adapter (``adapter_config.json``, as a LoRA run's ``final_model/``) loads its base model
            (named by the folder's ``dlmrl_base_model.json`` or ``adapter_config.json``) with these arguments
            and puts the adapter on it (a ``peft.PeftModel``, adapter frozen; ``dlmrl.models.lora``).
        family: ``auto`` (detected from ``config.json``: ``model_type`` / ``architectures`` /
            ``auto_map``) or a name in ``FAMILIES`` (``llada``, ``dream``, ``masked_lm``, ``tiny``, ``sdar``, ``llada2``),
            which overrides detection.
        trust_remote_code: passed to ``from_pretrained`` only as given (never forced on); required for
            checkpoints that ship their own model code (LLaDA, Dream).
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        device: where the model is moved.
        mask_token_id: overrides the mask id found by :func:`resolve_mask_token_id`.
        adapter_kinds: the policy kinds whose LoRA adapters this call loads (a saved adapter records the kind it was
            trained as; default the two masked-diffusion kinds; a kind of your own passes its name).
    Returns:
        :class:`MaskedDiffusionPolicy` whose ``__call__`` gives ``(B, T, V)`` float32 logits with
        position ``i`` predicting token ``i`` (Dream's shift undone).
    Raises:
        ValueError: unknown dtype, undetectable family, remote code without ``trust_remote_code``,
            no mask token, a mask id outside the model's vocabulary, or an adapter folder trained as a kind not in
            ``adapter_kinds`` (an AR one: load it with ``load_ar_policy``).
        KeyError: unknown family name (the message suggests close names).
        FileNotFoundError: a local-looking path that does not exist.
    """
    from transformers import AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    adapter = find_adapter(name_or_path)
    if adapter is not None:
        check_adapter_kind(adapter, adapter_kinds)
        base_family = family if family != "auto" else adapter.family or "auto"
        policy = load_policy(adapter.base_model_name_or_path, base_family, trust_remote_code, dtype, device,
                             mask_token_id, adapter_kinds)
        policy.model = attach_adapter(policy.model, adapter).to(device)
        return policy
    path = resolve_model_path(name_or_path)
    if looks_local(path) and not Path(path).exists():
        raise FileNotFoundError(f"model path {path!r} does not exist")
    config = read_checkpoint_config(path)
    name = detect_family(config) if family == "auto" else family
    fam = FAMILIES.get(name)
    if needs_remote_code(config) and not trust_remote_code:
        raise ValueError(
            f"{name_or_path}: this {name!r} checkpoint ships its own model code (config.json auto_map: "
            f"{config.get('auto_map')}), and loading it runs that code. Set model.trust_remote_code=true "
            "(or trust_remote_code=True) if you trust its source."
        )
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    model = fam.load(path, trust_remote_code, DTYPES[dtype]).to(device)
    return _assemble_policy(model, tokenizer, config, name, mask_token_id, name_or_path)


def _assemble_policy(model, tokenizer, config: dict, family: str, mask_token_id: int | None,
                     label: str) -> MaskedDiffusionPolicy:
    """The policy of a loaded model: the family's logits, the mask id (:func:`resolve_mask_token_id`) checked
    against the vocabulary (errors start with ``label``)."""
    fam = FAMILIES.get(family)
    mask_id = resolve_mask_token_id(tokenizer, config, fam.fallback_mask_token_id(tokenizer, config), mask_token_id)
    vocab = _output_vocab_size(model)
    if vocab is not None and not 0 <= mask_id < vocab:
        raise ValueError(f"{label}: mask token id {mask_id} is outside the model's vocabulary of {vocab}")
    return MaskedDiffusionPolicy(
        model=model,
        tokenizer=tokenizer,
        mask_token_id=mask_id,
        family=family,
        logits_fn=fam.logits,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def load_block_policy(
    name_or_path: str = TINY_BLOCK_DEFAULT,
    block_size: int | None = None,
    family: str = "auto",
    trust_remote_code: bool = False,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    mask_token_id: int | None = None,
    adapter_kinds: tuple[str, ...] = ("diffusion", "block"),
):
    """Load a block-diffusion policy: :func:`load_policy`'s model and tokenizer run block-causally.

    Args:
        block_size: tokens per block; ``None`` = the checkpoint's ``config.json`` ``block_size``, else its family's
            default (:func:`checkpoint_block_size`). Other arguments as :func:`load_policy`.
    Returns:
        :class:`~dlmrl.models.block_policy.BlockDiffusionPolicy`.
    Raises:
        ValueError: as :func:`load_policy`; no block size given or recorded; a family whose model code takes no
            4-D attention mask (``llada``, ``dream``, ``masked_lm``: bidirectional checkpoints without a block
            layout; ``tiny`` covers ``transformers`` decoders such as Llama and Qwen).
    """
    from dlmrl.models.block_policy import block_policy_from

    block_size = block_size if block_size is not None else checkpoint_block_size(name_or_path, family)
    if block_size is None:
        raise ValueError(f"{name_or_path}: no block size given and config.json records none (set model.block_size)")
    policy = load_policy(name_or_path, family, trust_remote_code, dtype, device, mask_token_id, adapter_kinds)
    fam = FAMILIES.get(policy.family)
    if fam.block_forward is None:
        raise ValueError(f"{name_or_path}: family {policy.family!r} has no block-causal forward (its model code takes "
                         "no 4-D attention mask); model.kind block runs families "
                         f"{', '.join(n for n in FAMILIES.names() if FAMILIES.get(n).block_forward is not None)}")
    return block_policy_from(policy, block_size, fam.block_forward, fam.prompt_blocks)


def diffusion_policy_from_model(model, tokenizer, family: str = "auto",
                                mask_token_id: int | None = None) -> MaskedDiffusionPolicy:
    """An already-loaded ``transformers`` masked-diffusion model and its tokenizer as a policy (what
    :func:`load_policy` does after loading: the family detected from ``model.config`` unless named, the mask
    id resolved from the tokenizer, the config or the family).

    Raises:
        ValueError: an undetectable family, no mask token, or a mask id outside the vocabulary.
        KeyError: an unknown family name.
    """
    config = model.config.to_dict()
    name = detect_family(config) if family == "auto" else family
    return _assemble_policy(model, tokenizer, config, name, mask_token_id,
                            config.get("_name_or_path") or type(model).__name__)
