"""LoRA adapters (``peft``) on either policy kind, the adapter-disabled reference view, and adapter files.

- :func:`apply_lora` wraps a ``transformers`` model in a ``peft.PeftModel`` whose only trainable parameters
  are the LoRA matrices (``r·(in + out)`` per targeted ``nn.Linear``); the base weights are frozen.
- :class:`AdapterDisabledPolicy` is the KL reference of a LoRA run: the *same* policy object scored inside
  ``PeftModel.disable_adapter()``, i.e. the frozen base model, with no second copy of the weights in memory.
- :func:`save_final_model` writes a ``save_pretrained`` folder: for a LoRA policy the adapter
  (``adapter_config.json`` + ``adapter_model.safetensors``), the tokenizer and :data:`BASE_NOTE` naming
  the base model; :func:`read_adapter` / :func:`attach_adapter` let the loaders put such a folder back
  onto its base (``dlmrl.models.loading.load_policy``, ``dlmrl.models.ar.load_ar_policy``).
- :func:`register_adapter_checkpointing` makes ``accelerate.save_state`` store only the trainable tensors
  of a LoRA model (the frozen base is reloaded from its checkpoint on resume).
- :func:`prepare_for_training` applies the ``model`` config section's LoRA and gradient-checkpointing
  switches to a loaded policy.

``peft`` is imported only when an adapter is made or loaded.
Reference: LoRA, Hu et al., arXiv 2106.09685 (``W + (α/r)·B·A``, ``B`` initialised to 0).
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dlmrl.errors import ConfigError
from dlmrl.models.checkpoint_keys import KIND_KEY

logger = logging.getLogger(__name__)

#: peft's adapter files.
ADAPTER_CONFIG = "adapter_config.json"
#: The note :func:`save_final_model` writes next to an adapter: ``{"base_model_name_or_path", "kind", "family",
#: "dtype", "trust_remote_code"}``.
BASE_NOTE = "dlmrl_base_model.json"


@dataclass(frozen=True)
class AdapterInfo:
    """What a folder holding an adapter says about its base.

    Attributes:
        path: the adapter folder (a local folder, or a hub id whose repo holds ``adapter_config.json``).
        base_model_name_or_path: the base checkpoint (:data:`BASE_NOTE`'s, else ``adapter_config.json``'s).
        kind: ``"diffusion"`` or ``"ar"`` when :data:`BASE_NOTE` records it, else ``None``.
        family: the diffusion family adapter the run used (``None`` when not recorded).
    """

    path: str
    base_model_name_or_path: str
    kind: str | None = None
    family: str | None = None


# -- finding the peft model inside wrappers -----------------------------------------------------------------


def peft_model_of(model: nn.Module) -> nn.Module | None:
    """The ``peft.PeftModel`` inside ``model`` (itself, or under DDP/accelerate ``.module`` wrappers), else ``None``."""
    while model is not None:
        if hasattr(model, "disable_adapter") and hasattr(model, "peft_config"):
            return model
        model = getattr(model, "module", None)
    return None


def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` is (or wraps) a ``peft.PeftModel``."""
    return peft_model_of(model) is not None


def base_transformers_model(model: nn.Module) -> nn.Module:
    """The ``transformers`` model inside DDP and ``PeftModel`` wrappers (LoRA layers, if any, stay injected)."""
    while hasattr(model, "module") and not hasattr(model, "config"):
        model = model.module
    peft_model = peft_model_of(model)
    return peft_model.get_base_model() if peft_model is not None else model


# -- making adapters ---------------------------------------------------------------------------------------


def parse_target_modules(spec: str) -> str | list[str]:
    """``"all-linear"`` (every ``nn.Linear`` but the output head, peft's rule) or a comma list of module names
    matched as name suffixes (``"q_proj, v_proj"`` → ``["q_proj", "v_proj"]``).

    Raises:
        ValueError: an empty spec or an empty name in the list.
    """
    spec = spec.strip()
    if spec == "all-linear":
        return spec
    names = [n.strip() for n in spec.split(",")]
    if not spec or any(not n for n in names):
        raise ValueError(f"target modules must be 'all-linear' or a comma list of module names, got {spec!r}")
    return names


def apply_lora(model: nn.Module, r: int, alpha: float, dropout: float = 0.0, target_modules: str = "all-linear",
               base_model_name_or_path: str | None = None, targets: str | list[str] | None = None,
               scope: str = "") -> nn.Module:
    """Wrap ``model`` in a ``peft.PeftModel`` with a fresh LoRA adapter named ``default``.

    Each targeted ``nn.Linear`` ``W (out, in)`` becomes ``W x + (alpha / r) · B A dropout(x)`` with ``A (r, in)``
    (Kaiming-uniform) and ``B (out, r)`` (zeros), so the adapted model starts equal to the base. Only ``A`` and
    ``B`` are trainable: ``r · (in + out)`` parameters per targeted layer. With a bfloat16/float16 base the
    adapter weights are float32 (peft's ``autocast_adapter_dtype``), so AdamW updates are not rounded away.

    Args:
        model: a ``transformers`` ``PreTrainedModel`` (``all-linear`` needs one).
        r: rank (>= 1). alpha: LoRA α (scale ``α / r``). dropout: dropout on the adapter's input.
        target_modules: see :func:`parse_target_modules`.
        base_model_name_or_path: recorded in ``adapter_config.json`` when the adapter is saved (defaults to the
            model's own ``name_or_path``).
        targets: peft's ``target_modules`` already resolved (a list of name suffixes or a regular expression peft
            full-matches), used instead of parsing ``target_modules``: a policy kind's
            :meth:`~dlmrl.kinds.base.PolicyKind.lora_targets`.
        scope: where ``targets`` looks for the names (the kind's :attr:`~dlmrl.kinds.base.PolicyKind.lora_scope`),
            for the message that refuses a name.
    Returns:
        the ``PeftModel`` (no task type: its ``forward`` passes every argument to the base model unchanged).
    Raises:
        ValueError: ``r < 1``, a bad ``target_modules`` spec, or a name of the list that matches no module (the
            message names it; peft itself refuses only a list none of whose names matches, and skips a misspelt
            one beside a good one).
    """
    from peft import LoraConfig, get_peft_model

    if r < 1:
        raise ValueError(f"LoRA rank r must be >= 1, got {r}")
    names = parse_target_modules(target_modules)
    config = LoraConfig(r=int(r), lora_alpha=alpha, lora_dropout=float(dropout),
                        target_modules=names if targets is None else targets, bias="none")

    def unmatched(missing: list[str], adapted: list[str]) -> ValueError:
        examples = "'q_proj' or 'self_attn.q_proj'" + ("" if scope else " (or 'layers.0.self_attn.q_proj')")
        return ValueError(f"no module of the model matches {', '.join(map(repr, missing))} (a name adapts the modules "
                          f"whose full name ends with it, e.g. {examples}{'; ' + scope if scope else ''}); adapted: "
                          f"{_short_list(adapted)}")

    with warnings.catch_warnings():  # (peft asks transformers' deprecated is_gradient_checkpointing)
        warnings.simplefilter("ignore", FutureWarning)
        try:
            peft_model = get_peft_model(model, config)
        except ValueError as e:  # (peft's own words show a kind's resolved pattern, not the names given)
            if names == "all-linear" or "not found in the base model" not in str(e):
                raise
            raise unmatched(names, []) from e
    if base_model_name_or_path is not None:
        peft_model.peft_config["default"].base_model_name_or_path = base_model_name_or_path
    if names != "all-linear":
        # (peft refuses a list none of whose names matches, but silently skips a misspelt one beside a good one)
        adapted = list(getattr(peft_model, "targeted_module_names", []))
        missing = [n for n in names if not any(a == n or a.endswith("." + n) for a in adapted)]
        if missing:
            raise unmatched(missing, adapted)
    return peft_model


def _short_list(names: list[str], shown: int = 6) -> str:
    """The first ``shown`` of ``names``, and how many more."""
    head = ", ".join(names[:shown])
    return head + (f" ... ({len(names) - shown} more)" if len(names) > shown else "") if names else "none"


def lora_parameter_count(model: nn.Module) -> int:
    """Number of trainable parameters of ``model`` (for a LoRA model: ``Σ r · (in + out)`` over targeted layers)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def enable_gradient_checkpointing(model: nn.Module, fallback: Callable[[nn.Module], None] | None = None) -> None:
    """Recompute each layer's activations in the backward pass (non-reentrant ``torch.utils.checkpoint``).

    Active only in train mode (transformers' rule); gradients equal those without it up to float rounding.
    Works under a LoRA adapter without ``enable_input_require_grads`` (non-reentrant checkpointing needs no
    input that requires grad).

    Args:
        model: the policy's model (``PeftModel`` and DDP wrappers are looked through).
        fallback: ``(transformers model) -> None`` for a class without ``transformers``' support: the family's
            :attr:`dlmrl.models.families.Family.activation_checkpointing` (LLaDA's own checkpointing).
    Raises:
        ValueError: the model class does not support gradient checkpointing and there is no fallback.
    """
    base = base_transformers_model(model)
    if not getattr(base, "supports_gradient_checkpointing", False):
        if fallback is None:
            raise ValueError(f"{type(base).__name__} does not support gradient checkpointing")
        fallback(base)
        return
    kwargs = {"use_reentrant": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if hasattr(base, "activation_checkpointing_enable"):
            base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def base_reference(name_or_path: str) -> str:
    """How a saved adapter names its base: an existing local folder as an absolute path (so the adapter
    loads from any working directory); a hub id or a shipped name (``tiny-sudoku``) unchanged."""
    path = Path(name_or_path)
    return str(path.resolve()) if path.exists() else name_or_path


def prepare_for_training(policy, model_cfg, kind=None) -> Any:
    """Apply the ``model`` section's training switches to a loaded policy (in place; returns it).

    - ``use_peft``: a fresh LoRA adapter (:func:`apply_lora` with ``lora_r``, ``lora_alpha``, ``lora_dropout``,
      ``lora_target_modules``). A policy loaded from an adapter folder keeps that adapter and trains it (the
      KL reference is then the base without it); with ``use_peft`` off such an adapter is merged into the base
      and the whole model is trained.
    - ``gradient_checkpointing``: :func:`enable_gradient_checkpointing`.
    - a bfloat16/float16 model trained without LoRA gets a warning: AdamW updates below the weights' precision
      (e.g. lr 1e-6 on weights of size 0.02 in bfloat16) are lost; not for bfloat16 with
      ``model.fp32_master_weights``, which the trainer then keeps in float32 (:mod:`dlmrl.training.precision`).

    Args:
        policy: a ``MaskedDiffusionPolicy`` or ``AutoregressivePolicy`` (its ``model`` is replaced when wrapped).
        model_cfg: ``dlmrl.config.ModelConfig``.
        kind: the policy's :class:`~dlmrl.kinds.base.PolicyKind`: what ``lora_target_modules`` means for its model
            (:meth:`~dlmrl.kinds.base.PolicyKind.lora_targets`) and what it does once an adapter is on
            (:meth:`~dlmrl.kinds.base.PolicyKind.adapter_attached`); ``None``: :func:`parse_target_modules`'s rule
            (the built-in masked and AR kinds' own). The trainer passes ``model.kind``'s.
    Raises:
        ConfigError: naming ``model.lora_target_modules`` (no module matches) or ``model.gradient_checkpointing``
            (unsupported model).
    """
    m = model_cfg
    loaded = peft_model_of(policy.model)
    if getattr(m, "use_peft", False):
        if loaded is not None:
            loaded.set_adapter(loaded.active_adapter)  # (marks the loaded adapter trainable)
            loaded.peft_config[loaded.active_adapter].inference_mode = False
        else:
            try:  # (what all-linear and a name list mean for this kind's model)
                targets = kind.lora_targets(m.lora_target_modules) if kind is not None else None
                policy.model = apply_lora(policy.model, m.lora_r, m.lora_alpha, m.lora_dropout, m.lora_target_modules,
                                          base_reference(m.name_or_path), targets=targets,
                                          scope=getattr(kind, "lora_scope", ""))
            except ValueError as e:
                raise ConfigError(f"config key 'model.lora_target_modules': {e}") from e
            if kind is not None:
                kind.adapter_attached(policy.model)
    elif loaded is not None:
        policy.model = _unload_shared(loaded.merge_and_unload())
        policy.model.requires_grad_(True)
    if getattr(m, "gradient_checkpointing", False):
        try:
            enable_gradient_checkpointing(policy.model, _family_checkpointing(policy))
        except ValueError as e:
            raise ConfigError(f"config key 'model.gradient_checkpointing': {e}") from e
    low = next(policy.model.parameters()).dtype in (torch.bfloat16, torch.float16)
    master = low and getattr(m, "fp32_master_weights", False) and getattr(m, "dtype", None) == "bfloat16"
    if not getattr(m, "use_peft", False) and low and not master:  # (master weights: dlmrl.training.precision)
        logger.warning("model.dtype=%s without LoRA: AdamW updates smaller than the weights' precision are lost; "
                       "use model.use_peft=true (float32 adapter), float32 weights or (bfloat16) "
                       "model.fp32_master_weights=true", m.dtype)
    return policy


def _family_checkpointing(policy) -> Callable[[nn.Module], None] | None:
    """The family's own activation checkpointing of a diffusion policy (``None`` for an AR policy or a family
    without one)."""
    from dlmrl.models.families import FAMILIES

    family = getattr(policy, "family", None)
    return FAMILIES.get(family).activation_checkpointing if family in FAMILIES else None


def _unload_shared(model: nn.Module) -> nn.Module:
    """``model`` with every adapter layer peft's ``merge_and_unload`` left in place swapped for its (merged) base
    layer: peft unloads each module once, under its first name, so an adapter module registered under two names
    (DiffusionGemma's encoder and decoder share one: :func:`dlmrl.models.diffusion_gemma.share_encoder_adapters`)
    stays wrapped under the second. A model without shared adapters has none left: unchanged."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in list(model.named_modules(remove_duplicate=False)):
        if name and isinstance(module, BaseTunerLayer):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, module.get_base_layer())
    return model


# -- the reference view -----------------------------------------------------------------------------------


class AdapterDisabledPolicy:
    """The base model of a LoRA policy as a policy: the same object, scored with the adapter switched off.

    Calls (``__call__`` of a diffusion policy: ``(input_ids (B, T) long, attention_mask (B, T)) -> (B, T, V)``
    float32 logits; ``completion_logits`` of a block-diffusion policy; ``token_logprobs`` of an AR policy: ``(B, L)`` float32 log-probs and entropies) run inside
    ``PeftModel.disable_adapter()``, so they score the frozen base weights, i.e. the initial model of a run
    that started from a fresh adapter, however far the adapter has trained. Every other attribute
    (``mask_token_id``, ``tokenizer``, ``model``, ``device``, ...) is the wrapped policy's: no weights are
    copied. Use it under ``torch.no_grad()`` (the KL reference is a constant).

    Raises:
        ValueError: at construction, when the policy's model holds no peft adapter.
    """

    def __init__(self, policy):
        if not is_peft_model(policy.model):
            raise ValueError("AdapterDisabledPolicy needs a policy whose model holds a peft adapter (use_peft)")
        self.policy = policy

    @contextlib.contextmanager
    def adapter_disabled(self):
        """Context in which the wrapped policy's model runs without its adapter."""
        with peft_model_of(self.policy.model).disable_adapter():
            yield

    def __call__(self, *args, **kwargs):
        with self.adapter_disabled():
            return self.policy(*args, **kwargs)

    def token_logprobs(self, *args, **kwargs):
        with self.adapter_disabled():
            return self.policy.token_logprobs(*args, **kwargs)

    def generate(self, *args, **kwargs):
        with self.adapter_disabled():
            return self.policy.generate(*args, **kwargs)

    def parameters(self):
        return self.policy.parameters()

    def __getattr__(self, name: str):
        if name == "policy":  # (not yet set: during unpickling)
            raise AttributeError(name)
        value = getattr(self.policy, name)
        if name == "completion_logits":  # (a block-diffusion policy's scoring pass: the base's, like __call__)
            def without_adapter(*args, **kwargs):
                with self.adapter_disabled():
                    return value(*args, **kwargs)
            return without_adapter
        return value


#: the name of the second adapter a LoRA run with ``train.sync_ref_model`` scores its KL reference with
#: (:func:`add_reference_adapter`, :mod:`dlmrl.training.reference_sync`)
REFERENCE_ADAPTER = "dlmrl_ref"


def add_reference_adapter(model: nn.Module) -> None:
    """Add :data:`REFERENCE_ADAPTER` to a LoRA model: the active adapter's configuration and current weights,
    frozen; the active adapter stays the active, trainable one.

    Raises:
        ValueError: ``model`` holds no peft adapter, or already holds the reference adapter.
    """
    peft = peft_model_of(model)
    if peft is None:
        raise ValueError("add_reference_adapter needs a model that holds a peft adapter (use_peft)")
    if REFERENCE_ADAPTER in peft.peft_config:
        raise ValueError(f"the model already holds an adapter named {REFERENCE_ADAPTER!r}")
    active = peft.active_adapter
    flags = {name: p.requires_grad for name, p in peft.named_parameters()}
    peft.add_adapter(REFERENCE_ADAPTER, peft.peft_config[active])
    peft.set_adapter(active)
    params = dict(peft.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            tag = f".{REFERENCE_ADAPTER}."
            if tag in name:
                p.copy_(params[name.replace(tag, f".{active}.")])
                p.requires_grad_(False)
            elif name in flags:
                p.requires_grad_(flags[name])


class ReferenceAdapterPolicy(AdapterDisabledPolicy):
    """The KL reference of a LoRA run whose reference follows the policy (``train.sync_ref_model``): the same
    policy object scored with :data:`REFERENCE_ADAPTER` active instead of its own adapter (calls as
    :class:`AdapterDisabledPolicy`'s). Use it under ``torch.no_grad()``.

    Raises:
        ValueError: at construction, when the policy's model holds no reference adapter.
    """

    def __init__(self, policy):
        super().__init__(policy)
        if REFERENCE_ADAPTER not in peft_model_of(policy.model).peft_config:
            raise ValueError(f"the policy's model holds no {REFERENCE_ADAPTER!r} adapter (add_reference_adapter)")

    @contextlib.contextmanager
    def adapter_disabled(self):
        """Context in which the wrapped policy's model runs with the reference adapter (the policy's own adapter
        and every parameter's ``requires_grad`` restored after)."""
        peft = peft_model_of(self.policy.model)
        active = peft.active_adapter
        flags = [(p, p.requires_grad) for p in peft.parameters()]
        peft.set_adapter(REFERENCE_ADAPTER)
        try:
            yield
        finally:
            peft.set_adapter(active)
            for p, flag in flags:
                p.requires_grad_(flag)


# -- adapter folders ---------------------------------------------------------------------------------------


def _hub_id(name_or_path: str) -> bool:
    """``owner/name`` that is not a local path (adapter repos on the hub always have an owner)."""
    return (name_or_path.count("/") == 1 and not name_or_path.startswith((".", "/"))
            and not Path(name_or_path).exists())


def read_adapter(name_or_path: str, hub: bool = False) -> AdapterInfo | None:
    """The adapter a local folder (or, with ``hub=True``, a hub repo) holds; ``None`` when it holds none.

    A local folder is an adapter folder when it has ``adapter_config.json``. With ``hub=True`` an ``owner/name``
    id is looked up with ``transformers.utils.find_adapter_config_file`` (any failure, e.g. no network, counts
    as "no adapter": the normal loader then reports what is wrong).

    Raises:
        ValueError: an adapter that names no base model (neither :data:`BASE_NOTE` nor ``adapter_config.json``'s
            ``base_model_name_or_path``).
    """
    path = Path(name_or_path)
    if path.is_dir():
        config_file = path / ADAPTER_CONFIG
        if not config_file.is_file():
            return None
    elif hub and _hub_id(name_or_path):
        try:
            from transformers.utils import find_adapter_config_file

            found = find_adapter_config_file(name_or_path)
        except Exception:  # noqa: BLE001 (offline, gated, not a repo: not an adapter we can read)
            return None
        if found is None:
            return None
        config_file = Path(found)
    else:
        return None
    config = json.loads(config_file.read_text())
    note_file = config_file.parent / BASE_NOTE
    note = json.loads(note_file.read_text()) if note_file.is_file() else {}
    base = note.get("base_model_name_or_path") or config.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{name_or_path}: the adapter names no base model ({ADAPTER_CONFIG} has no "
                         f"base_model_name_or_path and there is no {BASE_NOTE})")
    return AdapterInfo(str(name_or_path), str(base), note.get("kind"), note.get("family"))


def find_adapter(name_or_path: str) -> AdapterInfo | None:
    """The adapter ``name_or_path`` names, for the loaders: a local folder with ``adapter_config.json``, or a hub
    repo that has no ``config.json`` but an ``adapter_config.json`` (a whole model's repo is never searched for
    an adapter, so loading a model costs one config lookup, which ``from_pretrained`` then finds cached).
    The base note of a hub adapter is read only when the adapter's files are fetched with it (local folders).

    Raises:
        ValueError: see :func:`read_adapter`.
    """
    info = read_adapter(name_or_path)
    if info is not None or not _hub_id(name_or_path):
        return info
    from transformers import PretrainedConfig

    try:
        PretrainedConfig.get_config_dict(name_or_path)
        return None
    except OSError:
        return read_adapter(name_or_path, hub=True)


def attach_adapter(model: nn.Module, adapter: AdapterInfo, trainable: bool = False) -> nn.Module:
    """Load ``adapter``'s weights onto ``model`` (its base, already loaded) as a ``peft.PeftModel``.

    ``trainable=False`` loads it for inference (adapter frozen); the adapter's float32 weights stay float32 on a
    bfloat16 base. The adapted model's logits equal those of the model the adapter was saved from.
    """
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return PeftModel.from_pretrained(model, adapter.path, is_trainable=trainable)


#: the loader of a built-in kind's saved adapter, for the message when another loader is asked
ADAPTER_LOADERS = {"ar": "load_ar_policy (model.kind=ar)", "diffusion": "load_policy (model.kind=diffusion)",
                   "block": "load_policy (model.kind=diffusion)",
                   "uniform": "load_uniform_policy (model.kind=uniform)"}


def check_adapter_kind(adapter: AdapterInfo, accepts: tuple[str, ...]) -> None:
    """Raise ``ValueError`` when the adapter was trained as a policy kind the calling loader does not build
    (``accepts``: the names of the kinds it loads for; a block adapter is a diffusion one: ``load_policy`` takes
    both). The message names the loader of a built-in kind, else ``model.kind`` and the module that registers it."""
    if adapter.kind is not None and adapter.kind not in accepts:
        loader = ADAPTER_LOADERS.get(adapter.kind) or (
            f"model.kind {adapter.kind} (a kind registered outside dlmrl: import the module that registers it, "
            "dlmrl --import MODULE)")
        raise ValueError(f"{adapter.path}: this adapter was trained on a {adapter.kind!r} policy over "
                         f"{adapter.base_model_name_or_path!r}; load it with {loader}")


def save_final_model(model: nn.Module, tokenizer, path: str | Path, model_cfg=None,
                     state_dict: dict | None = None, mask_token_id: int | None = None) -> None:
    """Write ``model`` (unwrapped from accelerate) and ``tokenizer`` with ``save_pretrained`` (safetensors).

    A LoRA model writes its adapter only (``adapter_config.json``, ``adapter_model.safetensors``) plus
    :data:`BASE_NOTE` (``base_model_name_or_path`` and, from ``model_cfg``, ``kind``, ``family``, ``dtype``,
    ``trust_remote_code``), so ``load_policy(path)`` / ``load_ar_policy(path)`` and ``dlmrl eval --model path``
    rebuild the adapted policy on its base; any other model writes its full weights, its ``config.json``
    recording the policy kind (``dlmrl_kind``) and a block run's ``block_size``. ``state_dict``: the weights to
    write instead of ``model.state_dict()`` (a sharded model's, gathered: ``dlmrl.training.sharding.full_state_dict``).
    ``mask_token_id``: the policy's mask id, written into the saved ``config.json`` of full weights, so the copy
    loads with the id the run used: the family may have read it from the tokenizer's vocabulary (iLLaDA's 5, LLaDA-MoE's
    ``<|mask|>``) while ``save_pretrained`` would write the configuration class's default (LLaDA's code: 50256).
    """
    path = Path(path)
    peft_model = peft_model_of(model)
    block_size = getattr(model_cfg, "block_size", None) if model_cfg is not None else None
    if peft_model is None:
        if block_size is not None:  # (a block-diffusion run: its block size travels with the weights' config.json)
            model.config.block_size = block_size
        if model_cfg is not None:  # (the kind it was trained as: a moved folder loads as that kind)
            setattr(model.config, KIND_KEY, model_cfg.kind)
        if mask_token_id is not None:
            model.config.mask_token_id = int(mask_token_id)
        model.save_pretrained(path, safe_serialization=True, **({"state_dict": state_dict} if state_dict else {}))
        from dlmrl.models.compat import keep_generation_config

        keep_generation_config(model, path)
    else:
        # (embeddings are never targeted; 'auto' would look the base up on the hub to compare vocabularies)
        peft_model.save_pretrained(str(path), safe_serialization=True, save_embedding_layers=False,
                                   **({"state_dict": state_dict} if state_dict else {}))
        config = peft_model.peft_config[peft_model.active_adapter]
        note = {"base_model_name_or_path": config.base_model_name_or_path}
        if model_cfg is not None:
            note.update(kind=model_cfg.kind, family=model_cfg.family, dtype=model_cfg.dtype,
                        trust_remote_code=model_cfg.trust_remote_code)
            if block_size is not None:
                note["block_size"] = block_size
        (path / BASE_NOTE).write_text(json.dumps(note, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(path)


# -- accelerate checkpoints --------------------------------------------------------------------------------


def _model_file(input_dir: str | Path, index: int) -> Path:
    from accelerate.utils import SAFE_MODEL_NAME

    return Path(input_dir) / (f"{SAFE_MODEL_NAME}.safetensors" if index == 0
                              else f"{SAFE_MODEL_NAME}_{index}.safetensors")


def register_adapter_checkpointing(accelerator) -> None:
    """Make ``accelerator.save_state`` store only the trainable tensors of each LoRA model it holds (and a
    reference adapter's, :data:`REFERENCE_ADAPTER`, whose state a reference that follows the policy needs).

    Save: each LoRA model's state dict is cut to its parameters with ``requires_grad`` (the adapter), so a
    checkpoint of an 8B base holds megabytes of weights, not gigabytes. Load: such a file is loaded with
    ``load_state_dict(strict=False)`` onto the model (whose frozen base the run loaded from its checkpoint
    again), and accelerate's own strict loading of that model is skipped. A checkpoint that holds full weights
    loads the same way. Optimizer, scheduler, RNG and custom states are accelerate's as usual, so a resumed run
    equals an uninterrupted one. Models without an adapter are untouched. Supports the trainer's layout: LoRA
    models only after any non-LoRA ones in ``accelerator.prepare`` order (accelerate numbers model files by
    position).

    Raises (at load):
        RuntimeError: the file holds keys the model does not have, or lacks one of its trainable tensors.
    """
    def save_hook(models: list, weights: list, output_dir: str) -> None:
        for i, model in enumerate(models):
            if i < len(weights) and is_peft_model(model):
                trainable = {name for name, p in model.named_parameters() if p.requires_grad}
                reference = f".{REFERENCE_ADAPTER}."  # (a reference that follows the policy: its state too)
                weights[i] = {k: v for k, v in weights[i].items() if k in trainable or reference in k}

    def load_hook(models: list, input_dir: str) -> None:
        from safetensors.torch import load_file

        for i in reversed(range(len(models))):
            model = models[i]
            if not is_peft_model(model):
                continue
            file = _model_file(input_dir, i)
            if not file.is_file():
                continue  # (not a safetensors checkpoint: accelerate loads it)
            state = load_file(str(file), device=str(next(model.parameters()).device))
            result = model.load_state_dict(state, strict=False)
            trainable = {name for name, p in model.named_parameters() if p.requires_grad}
            missing = trainable & set(result.missing_keys)
            if result.unexpected_keys or missing:
                raise RuntimeError(f"{file}: cannot resume the LoRA model: unexpected keys "
                                   f"{result.unexpected_keys[:5]}, missing trainable keys {sorted(missing)[:5]}")
            del models[i]

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)


__all__ = [
    "ADAPTER_CONFIG",
    "BASE_NOTE",
    "REFERENCE_ADAPTER",
    "AdapterDisabledPolicy",
    "AdapterInfo",
    "ReferenceAdapterPolicy",
    "add_reference_adapter",
    "apply_lora",
    "attach_adapter",
    "base_reference",
    "base_transformers_model",
    "check_adapter_kind",
    "enable_gradient_checkpointing",
    "find_adapter",
    "is_peft_model",
    "lora_parameter_count",
    "parse_target_modules",
    "peft_model_of",
    "prepare_for_training",
    "read_adapter",
    "register_adapter_checkpointing",
    "save_final_model",
]
