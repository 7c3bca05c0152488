"""Running checkpoint model code written for ``transformers`` 4 under ``transformers`` 5.

LLaDA (``GSAI-ML/LLaDA-8B-*``, ``GSAI-ML/LLaDA-1.5``) and Dream (``Dream-org/Dream-v0-*-7B``, Dream-Coder,
DiffuCoder) ship their own ``modeling_*.py`` and ``configuration_*.py``, written for ``transformers`` 4.38–4.46
(LLaDA's README: "install transformers==4.38.2"; Dream's ``config.json``: ``"transformers_version": "4.46.2"``),
as do SDAR/TraDo and LLaDA2 (:mod:`dlmrl.models.sdar`, :mod:`dlmrl.models.llada2`).
dlmrl requires ``transformers >= 5``, which changed things that code relies on: patches 1–7 were measured with 5.24.0
on NVlabs/Fast-dLLM@24cc59e's copies of LLaDA's and Dream's code (``llada/model/``, ``dream/model/``) by
``benchmarks/remote_code_check.py``, 8 on SDAR's, 10 on LLaDA2's (``benchmarks/sdar_parity.py``,
``benchmarks/llada2_parity.py``). :func:`load_checkpoint_model`
loads such a checkpoint with one patch per change, each applied only where the thing is missing, so code
that already works under ``transformers`` 5 runs untouched:

1. **post_init** (:func:`patch_model_class`): ``transformers`` 5's ``from_pretrained`` reads
   ``model.all_tied_weights_keys`` (``_move_missing_keys_from_meta_to_device``), which
   ``PreTrainedModel.post_init()`` sets. LLaDA's ``LLaDAModelLM.__init__`` (``modeling_llada.py``) never calls
   ``post_init()``, so loading dies with
   ``AttributeError: ... no attribute 'all_tied_weights_keys'``. The patched ``__init__`` calls ``post_init()``
   when the original did not.
2. **tie_weights keywords** (:func:`patch_model_class`): ``transformers`` 5 calls
   ``model.tie_weights(missing_keys=..., recompute_mapping=False)``; LLaDA overrides ``tie_weights(self)`` with no
   parameters (a ``TypeError``). The patched method accepts and ignores them (LLaDA's own rule, tie ``ff_out`` to
   ``wte`` when ``weight_tying``, still runs).
3. **use_cache** (:func:`patch_config`): ``transformers`` 5's ``PretrainedConfig.__init__`` pops the generation
   parameters (``GenerationConfig._get_default_generation_params()``, ``use_cache`` among them) from its keyword
   arguments, so ``config.json``'s ``"use_cache": false`` no longer reaches ``LLaDAConfig``; ``LLaDAModelLM.forward``
   reads ``self.config.use_cache`` (``AttributeError``). The patch sets it from ``config.json`` (else ``False``,
   the default of ``LLaDAConfig`` and ``DreamConfig``; neither family uses a cache in diffusion).
4. **RoPE "default"** (:func:`ensure_default_rope`): ``transformers`` 5 dropped the ``"default"`` entry of
   ``modeling_rope_utils.ROPE_INIT_FUNCTIONS`` (plain RoPE moved into each model's
   ``compute_default_rope_parameters``); Dream's ``DreamRotaryEmbedding.__init__`` looks it up
   (``KeyError: 'default'``). The patch registers plain RoPE under that name if absent.
5. **_tied_weights_keys as a dict** (:func:`patch_model_class`): in ``transformers`` 4 it listed the output
   weights tied to the input embeddings (Dream's ``DreamModel._tied_weights_keys = ["lm_head.weight"]``);
   ``transformers`` 5 reads a ``{tied: source}`` mapping (``save_pretrained`` calls its ``.keys()``:
   ``AttributeError: 'list' object has no attribute 'keys'``, and so does ``post_init`` when
   ``tie_word_embeddings`` is on). The patch turns the list into that mapping, the source being the input
   embedding weight (what ``tie_weights`` tied them to in 4.x).
6. **GenerationConfig.validate keywords** (:func:`patch_model_class`): ``transformers`` 5's
   ``GenerationConfig.update`` (run by ``from_pretrained``) calls ``self.validate(user_set_attributes=...)``;
   Dream's ``DreamGenerationConfig.validate(self, is_init=False)`` (``generation_utils.py``) takes no such keyword
   (``TypeError``). A generation-config class the model's module holds gets a ``validate`` that accepts and ignores
   the new keywords and runs the old one.
7. **Rotary buffers after loading** (:func:`restore_rotary_buffers`): ``transformers`` 5's ``from_pretrained`` builds
   the model on the meta device, recreates non-persistent buffers with ``torch.empty_like``
   (``_move_missing_keys_from_meta_to_device``) and refills them only through ``_init_weights``. Dream's
   ``DreamPreTrainedModel._init_weights`` (4.x style: ``nn.Linear`` and ``nn.Embedding`` only) replaces the base rule
   that refills ``RotaryEmbedding.inv_freq``, so ``DreamRotaryEmbedding.inv_freq`` is left as uninitialised memory:
   the model loads and runs with garbage rotary frequencies, no error (``benchmarks/remote_code_check.py``
   measured it: logits differed from the same weights loaded by hand). After loading, every module with a
   ``rope_init_fn`` and an ``inv_freq`` buffer (4.x's rotary embeddings) gets its frequencies recomputed by its own
   ``rope_init_fn``, as its ``__init__`` computed them in 4.x.

8. **Token ids no longer defaulted** (:func:`patch_config`): ``transformers`` 4's ``PretrainedConfig`` gave every
   config ``pad_token_id``/``bos_token_id``/``eos_token_id`` (``None`` by default); 5 leaves them to each model's
   config class, so SDAR's ``SDARModel.__init__`` (``self.padding_idx = config.pad_token_id``) dies with an
   ``AttributeError``. The patch sets a missing one from ``config.json`` (else ``None``).

9. **generation_config.json on saving** (:func:`keep_generation_config`): ``transformers`` 5's ``save_pretrained``
   writes it only for a model that ``can_generate()``; Dream's ``DreamModel`` cannot (no ``generate``) but its
   ``from_pretrained`` requires the file, so a fully trained Dream would not load back. It is copied from the source.
10. **is_torch_fx_available** (:func:`ensure_torch_fx_available`): ``transformers`` 5 removed
    ``transformers.utils.import_utils.is_torch_fx_available``; LLaDA2's ``modeling_llada2_moe.py`` imports it at module
    level (``ImportError``) to decide whether to ``torch.fx.wrap`` its mask helper. The patch restores the 4.x
    function (True: ``torch.fx`` ships with every torch dlmrl supports) before any checkpoint code is imported.

11. **Tied matrices the class does not declare** (:func:`declare_tied_parameters`): ``transformers`` 5's
    ``save_pretrained`` drops a matrix shared under two names only when ``_tied_weights_keys`` names the copy
    (``remove_tied_weights_from_state_dict``), else refuses ("shared tensors ... which are not properly defined").
    LLaDA's ``tie_weights`` makes ``transformer.ff_out`` the ``wte`` module when ``weight_tying`` (iLLaDA's
    configuration, tied embedding and head) and declares nothing, so a fully trained iLLaDA would not save. After
    loading, each parameter reachable under several names gets its other names declared as tied to the input
    embedding's (or the first) name, on the instance, where the class declares none; the saved file then holds the
    matrix once, as a tied release does, and loading ties it again. Measured with 5.25.0 by
    ``benchmarks/llada_moe_parity.py`` on NVlabs/Fast-dLLM@24cc59e's ``llada/model/``.

What no patch can fix raises :class:`CheckpointCodeError` saying what is missing.
"""

from __future__ import annotations

import functools
import inspect
import shutil
import sys
from pathlib import Path

import torch
from torch import nn

#: Marks a class :func:`patch_model_class` has patched (so patching twice changes nothing).
_PATCHED = "_dlmrl_transformers5_patched"


class CheckpointCodeError(RuntimeError):
    """A checkpoint's own model code cannot run under the installed ``transformers``, and no patch fixes it."""


def default_rope_parameters(config=None, device=None, seq_len=None, **rope_kwargs) -> tuple[torch.Tensor, float]:
    """Plain RoPE inverse frequencies ``1 / θ^(2i/d)``, ``i = 0..d/2-1``, and attention factor 1.

    The ``"default"`` entry ``transformers`` 4.x kept in ``ROPE_INIT_FUNCTIONS`` (same call signature:
    ``(config, device, seq_len=None, **rope_kwargs)``), for checkpoint code that still looks it up.
    ``θ`` is ``config.rope_theta`` (or ``rope_parameters["rope_theta"]``), ``d`` the head dimension
    (``config.head_dim``, else ``hidden_size // num_attention_heads``) times ``partial_rotary_factor``;
    without a config, ``rope_kwargs`` give ``base`` and ``dim`` (the 4.x fallback).

    Reference: RoPE, Su et al., arXiv 2104.09864, eq. 15 (``θ_i = 10000^{-2(i-1)/d}``, base configurable).
    Returns:
        ``(inv_freq (d/2,) float32, 1.0)``.
    """
    if config is None:
        base, dim = float(rope_kwargs["base"]), int(rope_kwargs["dim"])
    else:
        params = getattr(config, "rope_parameters", None) or {}
        base = getattr(config, "rope_theta", None) or params.get("rope_theta")
        if base is None:
            raise CheckpointCodeError(f"{type(config).__name__} sets no rope_theta for RoPE type 'default'")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dim = int(head_dim * (getattr(config, "partial_rotary_factor", None) or params.get("partial_rotary_factor", 1.0)))
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float32) / dim  # (d/2,)
    return 1.0 / (float(base) ** exponent), 1.0


def ensure_default_rope() -> bool:
    """Register :func:`default_rope_parameters` as ``ROPE_INIT_FUNCTIONS["default"]`` when absent (patch 4).

    Returns:
        whether it was registered now (``False`` when ``transformers`` already has the entry).
    """
    from transformers import modeling_rope_utils

    if "default" in modeling_rope_utils.ROPE_INIT_FUNCTIONS:
        return False
    modeling_rope_utils.ROPE_INIT_FUNCTIONS["default"] = default_rope_parameters
    return True


def ensure_torch_fx_available() -> bool:
    """Give ``transformers.utils.import_utils`` the ``is_torch_fx_available()`` of ``transformers`` 4 when it has none
    (patch 10); True when added now."""
    from transformers.utils import import_utils

    if hasattr(import_utils, "is_torch_fx_available"):
        return False
    import_utils.is_torch_fx_available = lambda: True  # (4.x: torch >= 1.10, which has torch.fx)
    return True


#: Token-id attributes every ``PretrainedConfig`` had in ``transformers`` 4 (default ``None``); 5 sets them only in the
#: configs of its own model classes.
_TOKEN_ID_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id")


def patch_config(config, raw: dict | None = None):
    """Give ``config`` the ``use_cache`` attribute ``transformers`` 5 popped (patch 3), and the token-id attributes
    (``pad_token_id``, ``bos_token_id``, ``eos_token_id``) it no longer defaults to ``None`` (patch 8: SDAR's
    ``SDARModel.__init__`` reads ``config.pad_token_id``, which its ``config.json`` does not set); in place, returns it.

    Args:
        config: a ``PretrainedConfig`` built from the checkpoint's code.
        raw: the checkpoint's ``config.json`` as a dict (its ``use_cache`` wins; default ``False``; its token ids
            win, default ``None``).
    """
    if "use_cache" not in vars(config):
        config.use_cache = bool((raw or {}).get("use_cache", False))
    for field in _TOKEN_ID_FIELDS:
        try:
            getattr(config, field)
        except AttributeError:
            setattr(config, field, (raw or {}).get(field))
    return config


def _tie_weights_takes_keywords(method) -> bool:
    params = inspect.signature(method).parameters.values()
    return any(p.kind is p.VAR_KEYWORD for p in params) or {"missing_keys", "recompute_mapping"} <= {
        p.name for p in params}


def patch_model_class(cls: type) -> type:
    """Patches 1 and 2 on a checkpoint's model class, in place (idempotent); returns ``cls``.

    - ``__init__`` calls ``self.post_init()`` afterwards when the original left no ``all_tied_weights_keys``;
    - a ``tie_weights`` override without ``missing_keys`` / ``recompute_mapping`` is wrapped to accept them;
    - a list ``_tied_weights_keys`` (patch 5) becomes a property giving ``{key: <input embedding weight name>}``.
    """
    if cls.__dict__.get(_PATCHED):
        return cls
    original_init = cls.__init__

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if "all_tied_weights_keys" not in vars(self):
            self.post_init()

    cls.__init__ = __init__
    for klass in cls.__mro__:
        if "tie_weights" in klass.__dict__:  # the override that runs
            if klass.__module__.startswith("transformers.") or _tie_weights_takes_keywords(klass.tie_weights):
                break
            original_tie = klass.tie_weights

            @functools.wraps(original_tie)
            def tie_weights(self, missing_keys=None, recompute_mapping=True, _tie=original_tie):
                return _tie(self)

            cls.tie_weights = tie_weights
            break
    for klass in _checkpoint_generation_configs(cls):
        _patch_validate(klass)
    listed = getattr(cls, "_tied_weights_keys", None)
    if isinstance(listed, list | tuple):
        cls._tied_weights_keys = property(functools.partial(_tied_to_input_embeddings, keys=tuple(listed)))
    setattr(cls, _PATCHED, True)
    return cls


def _checkpoint_generation_configs(cls: type) -> list[type]:
    """The ``GenerationConfig`` subclasses the module of ``cls`` defines or imports from the checkpoint's code."""
    from transformers import GenerationConfig

    module = sys.modules.get(cls.__module__)
    return [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, GenerationConfig)
            and not v.__module__.startswith("transformers.")] if module is not None else []


def _patch_validate(klass: type) -> None:
    """Patch 6: a 4.x ``validate(self, is_init=False)`` override made to accept 5.x's keywords (idempotent)."""
    if "validate" not in klass.__dict__ or klass.__dict__.get(_PATCHED):
        return
    params = inspect.signature(klass.validate).parameters
    if "user_set_attributes" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        original = klass.validate

        @functools.wraps(original)
        def validate(self, *args, strict=False, user_set_attributes=None, _validate=original, **kwargs):
            return _validate(self, *args, **kwargs)

        klass.validate = validate
    setattr(klass, _PATCHED, True)


def _tied_to_input_embeddings(model: nn.Module, keys: tuple[str, ...]) -> dict[str, str]:
    """``{key: name of the input embedding weight}`` for the 4.x list ``keys`` (patch 5)."""
    weight = model.get_input_embeddings().weight
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if p is weight]
    return {k: names[0] for k in keys if names and k != names[0]}


def _dynamic_class(reference: str, path: str) -> type:
    """The class ``reference`` of the checkpoint's code. Importing that code may print to standard output:
    ``transformers``' ``@auto_docstring`` prints an ``[ERROR] ... not documented`` line per undocumented parameter
    (SDAR's ``modeling_sdar.py`` has five). Those lines go to standard error instead, so that a command whose
    standard output is data (``dlmrl eval`` prints JSON) stays parseable."""
    import contextlib

    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    ensure_torch_fx_available()  # (patch 10: checkpoint code may import it at module level)
    with contextlib.redirect_stdout(sys.stderr):
        return get_class_from_dynamic_module(reference, path)


def load_checkpoint_config(path: str, trust_remote_code: bool):
    """The checkpoint's config, :func:`patch_config`-ed: its own ``auto_map["AutoConfig"]`` class when the code is
    trusted (not a class another checkpoint registered under the same ``model_type`` in this process: LLaDA's
    ``configuration_llada.py`` calls ``AutoConfig.register("llada", ...)`` on import), else ``AutoConfig``'s."""
    from transformers import AutoConfig, PretrainedConfig

    raw, _ = PretrainedConfig.get_config_dict(path)
    reference = (raw.get("auto_map") or {}).get("AutoConfig")
    if trust_remote_code and isinstance(reference, str):
        config = _dynamic_class(reference, path).from_pretrained(path)
    else:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    return patch_config(config, raw)


def checkpoint_model_class(config, path: str, auto_class: str = "AutoModel",
                           trust_remote_code: bool = True) -> type:
    """The class ``auto_class`` builds for ``config``: ``auto_map[auto_class]`` of the checkpoint when its code is
    trusted, else ``transformers``' mapping; a class from checkpoint code (``transformers_modules``, also one its
    code registered in the mapping) comes :func:`patch_model_class`-ed."""
    import transformers

    reference = (getattr(config, "auto_map", None) or {}).get(auto_class)
    if trust_remote_code and isinstance(reference, str):
        cls = _dynamic_class(reference, path)
    else:
        cls = getattr(transformers, auto_class)._model_mapping[type(config)]
    return patch_model_class(cls) if cls.__module__.startswith("transformers_modules") else cls


def load_checkpoint_model(path: str, trust_remote_code: bool, dtype: torch.dtype,
                          auto_class: str = "AutoModel", config_overrides: dict | None = None) -> nn.Module:
    """``auto_class.from_pretrained(path)`` with the patches of this module for checkpoint-shipped code.

    The config is :func:`load_checkpoint_config`'s, the class :func:`checkpoint_model_class`'s, and
    :func:`ensure_default_rope` runs before the model is built. Only safetensors weights load; the checkpoint's
    code is used only when ``trust_remote_code`` is set.

    Raises:
        CheckpointCodeError: the checkpoint's code fails in a way none of the patches covers (the message
            names the class, the installed ``transformers`` and the original error).

    ``config_overrides``: attributes set on the loaded config before the model is built (e.g. Nemotron-Labs-Diffusion's
    ``dlm_paradigm``, :mod:`dlmrl.models.nemotron_diffusion`); ``None`` = the checkpoint's own.
    """
    import transformers

    ensure_default_rope()
    config = load_checkpoint_config(path, trust_remote_code)
    for key, value in (config_overrides or {}).items():
        setattr(config, key, value)
    cls = checkpoint_model_class(config, path, auto_class, trust_remote_code)
    remote = cls.__module__.startswith("transformers_modules")
    try:
        model = cls.from_pretrained(path, config=config, dtype=dtype, use_safetensors=True)
    except (AttributeError, KeyError, TypeError) as e:
        if not remote:
            raise
        raise CheckpointCodeError(
            f"{path}: the checkpoint's own model code ({cls.__module__}.{cls.__name__}) does not load under "
            f"transformers {transformers.__version__}, and dlmrl's compatibility patches (dlmrl.models.compat) do not "
            f"cover this failure: {type(e).__name__}: {e}") from e
    if not remote:
        return model
    # What transformers' Auto* classes do for checkpoint code (_BaseAutoModelClass.from_pretrained): register the
    # classes for their auto class, so that save_pretrained writes the code files next to the weights
    # (custom_object_save) and the saved folder loads like the original. Built from the class directly, a fully
    # fine-tuned model would otherwise be saved with an auto_map pointing at files that are not there.
    cls.register_for_auto_class(auto_class)
    if type(config).__module__.startswith("transformers_modules"):
        type(config).register_for_auto_class("AutoConfig")
    return restore_rotary_buffers(declare_tied_parameters(model))


def keep_generation_config(model: nn.Module, path: str | Path) -> None:
    """Patch 9: copy the source checkpoint's ``generation_config.json`` into a saved folder that has none, for
    checkpoint code whose ``from_pretrained`` requires one: Dream's ``DreamModel`` reloads it as its ``DreamGenerationConfig``, but
    has no ``generate`` method, so ``transformers`` 5's ``save_pretrained`` (which writes it only for models that
    ``can_generate()``) leaves it out and the saved folder would not load. Nothing happens when the source has none."""
    if (Path(path) / "generation_config.json").exists() or not type(model).__module__.startswith("transformers_modules"):
        return
    source = getattr(model.config, "_name_or_path", None)
    if not source:
        return
    from transformers.utils import cached_file

    found = cached_file(source, "generation_config.json", _raise_exceptions_for_missing_entries=False,
                        _raise_exceptions_for_connection_errors=False)
    if found:
        shutil.copyfile(found, Path(path) / "generation_config.json")


def declare_tied_parameters(model: nn.Module) -> nn.Module:
    """Patch 11: declare the parameters ``model`` shares under several names (``named_parameters(remove_duplicate=
    False)``) in an instance ``_tied_weights_keys`` ``{copy name: kept name}``, the kept name being the input
    embedding weight's when it is one of them, else the first; only where the class declares no tied keys (a list
    turned into a property by patch 5, or a mapping, is left alone). In place, returns ``model``."""
    if getattr(type(model), "_tied_weights_keys", None):
        return model
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    try:
        embedding = model.get_input_embeddings().weight
    except (AttributeError, NotImplementedError):
        embedding = None
    tied: dict[str, str] = {}
    for param_id, group in names.items():
        if len(group) < 2:
            continue
        keep = group[0]
        if embedding is not None and id(embedding) == param_id:
            keep = next(n for n, p in model.named_parameters(remove_duplicate=False) if p is embedding)
        tied.update({n: keep for n in group if n != keep})
    if tied:
        model._tied_weights_keys = tied
    return model


def restore_rotary_buffers(model: nn.Module) -> nn.Module:
    """Patch 7: recompute the ``inv_freq`` buffer (and ``attention_scaling``, ``original_inv_freq``) of every
    4.x-style rotary embedding (a module with ``rope_init_fn`` and an ``inv_freq`` tensor) with its own
    ``rope_init_fn(config, device, **rope_kwargs)``, as its ``__init__`` does; in place, returns ``model``."""
    with torch.no_grad():
        for module in model.modules():
            inv_freq = getattr(module, "inv_freq", None)
            if callable(getattr(module, "rope_init_fn", None)) and isinstance(inv_freq, torch.Tensor):
                fresh, scaling = module.rope_init_fn(module.config, inv_freq.device,
                                                     **(getattr(module, "rope_kwargs", None) or {}))
                inv_freq.copy_(fresh.to(inv_freq.dtype))
                module.attention_scaling = scaling
                if hasattr(module, "original_inv_freq"):
                    module.original_inv_freq = inv_freq
    return model


__all__ = [
    "CheckpointCodeError",
    "checkpoint_model_class",
    "declare_tied_parameters",
    "default_rope_parameters",
    "ensure_default_rope",
    "ensure_torch_fx_available",
    "keep_generation_config",
    "load_checkpoint_config",
    "load_checkpoint_model",
    "patch_config",
    "patch_model_class",
    "restore_rotary_buffers",
]
