"""Family adapters: how each checkpoint family is loaded and turned into per-position logits.

Every adapter returns ``(B, T, V)`` logits in which position ``i`` predicts token ``i`` of the input
(the masked-diffusion convention the sampler and the estimators use). Families:

- ``llada`` (``GSAI-ML/LLaDA-8B-Instruct``, LLaDA 1.5): ``AutoModel`` with the checkpoint's own code;
  bidirectional, no logit shift, mask id 126336. iLLaDA (``GSAI-ML/iLLaDA-8B-*``) runs LLaDA's code with mask id 5
  (:func:`llada_mask_token_id`).
- ``dream`` (``Dream-org/Dream-v0-Instruct-7B``, Dream-Coder, DiffuCoder): ``AutoModel`` with the
  checkpoint's own code; logits shifted right by one, mask id 151666.
- ``masked_lm``: any ``transformers`` ``*ForMaskedLM`` (BERT, RoBERTa, ModernBERT, ...); the
  tokenizer's mask token.
- ``sdar`` (``JetLM/SDAR-*-Chat``, ``Gen-Verse/TraDo-*``): block diffusion on SDAR's own ``modeling_sdar.py``
  (:mod:`dlmrl.models.sdar`); mask id 151669, block size from ``config.json``, the prompt cut into blocks.
- ``llada2`` (``inclusionAI/LLaDA2.0-mini``, ``-flash``, LLaDA2.1): block diffusion on LLaDA2's own
  ``modeling_llada2_moe.py`` (:mod:`dlmrl.models.llada2`); mask id 156895, block size 32 unless set, the prompt cut
  into blocks.
- ``llada_moe`` (``inclusionAI/LLaDA-MoE-7B-A1B-Base``, ``-Instruct``): masked diffusion on LLaDA-MoE's own
  ``modeling_lladamoe.py`` (:mod:`dlmrl.models.llada_moe`); its ``config.json`` says ``model_type "llada"`` like dense
  LLaDA's, so it is told apart by ``architectures`` / ``auto_map``; the mask id is the tokenizer's ``<|mask|>``.
- ``nemotron_diffusion`` (``nvidia/Nemotron-Labs-Diffusion-3B``, ``-8B``, ``-14B``): block diffusion on the release's
  ``modeling_nemotron_labs_diffusion.py`` (:mod:`dlmrl.models.nemotron_diffusion`); mask id 100 unless the checkpoint
  names one, block size from ``config.json`` (32 unless set), ``dlm_paradigm`` checked against ``model.kind``; the same
  weights run as ``model.kind: ar``.
- ``fast_dllm_v2`` (``Efficient-Large-Model/Fast_dLLM_v2_1.5B``, ``_7B``): block diffusion on Fast-dLLM v2's own
  ``modeling.py`` (:mod:`dlmrl.models.fast_dllm_v2`); mask id 151665 (``|<MASK>|``), block size from ``bd_size`` (32),
  the prompt cut into blocks, logits shifted by one (the AR head kept: a block's first token is predicted by the
  previous block's last position).
- ``tiny``: the shipped default, a Llama with ``is_causal=False`` (``dlmrl.models.tiny``), and any ``transformers``
  ``*ForCausalLM`` whose config sets ``is_causal: false`` (Qwen2, Mistral, ... run bidirectionally).

``FAMILIES`` is a registry: register a :class:`Family` under a new name to add one.
:func:`detect_family` reads the checkpoint's ``config.json`` (``model_type``, ``architectures``,
``auto_map``) without running any checkpoint code.
"""

from __future__ import annotations

import inspect
import sys
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from dlmrl.models.block_attention import BlockForwardFn, bool_mask_block_forward, hf_block_forward
from dlmrl.models.block_cache import CachedLogitsFn, hf_cached_logits
from dlmrl.models.compat import load_checkpoint_model
from dlmrl.models.fast_dllm_v2 import (
    FAST_DLLM_V2_BLOCK_SIZE,
    FAST_DLLM_V2_MASK_TOKEN_ID,
    fast_dllm_v2_block_forward,
    fast_dllm_v2_mask_token_id,
    fast_dllm_v2_raw_logits,
    is_fast_dllm_v2,
    load_fast_dllm_v2,
)
from dlmrl.models.llada import left_padding, llada_logits
from dlmrl.models.llada2 import (
    LLADA2_BLOCK_SIZE,
    LLADA2_MASK_TOKEN_ID,
    llada2_logits,
    load_llada2,
)
from dlmrl.models.llada_cache import llada_cached_logits
from dlmrl.models.llada_moe import is_llada_moe, llada_moe_logits, llada_moe_mask_token_id, load_llada_moe
from dlmrl.models.nemotron_diffusion import (
    NEMOTRON_BLOCK_SIZE,
    NEMOTRON_MASK_TOKEN_ID,
    is_nemotron_diffusion,
    load_nemotron_diffusion,
    nemotron_block_forward,
    nemotron_logits,
)
from dlmrl.models.sdar import SDAR_MASK_TOKEN_ID, load_sdar, sdar_block_forward, sdar_logits
from dlmrl.models.token_scores import hf_output_head, unwrap_model
from dlmrl.registry import Registry

#: LLaDA's mask token ``<|mdm_mask|>``. Source: LLaDA's ``generate.py`` (``mask_id=126336``, "The token id
#: of [MASK] is 126336") and the ``mask_token_id`` of LLaDA's ``config.json``; the tokenizer declares no
#: mask token, so the id comes from the config or this constant.
LLADA_MASK_TOKEN_ID = 126336
#: iLLaDA's mask token id. Source: ML-GSAI/LLaDA@b7e6c35 ``README.md`` (2026.06.24: "By setting ``mask_id=5``, iLLaDA
#: can directly reuse the existing LLaDA inference code").
ILLADA_MASK_TOKEN_ID = 5
#: The vocabulary (``embedding_size`` / ``vocab_size``) of LLaDA-8B's checkpoints (126,464) and of iLLaDA-8B's
#: (155,136, the architecture table of the ``GSAI-ML/iLLaDA-8B-Base`` model card), which tell the two apart when a
#: checkpoint names its mask id nowhere (:func:`llada_mask_token_id`).
LLADA_VOCAB_SIZE, ILLADA_VOCAB_SIZE = 126464, 155136
#: Dream's mask token ``<|mask|>``. Source: ``DreamConfig(mask_token_id=151666)`` in Dream's
#: ``configuration_dream.py`` and the ``mask_token_id`` Dream's generation config passes to
#: ``diffusion_generate``.
DREAM_MASK_TOKEN_ID = 151666


@dataclass(frozen=True)
class Family:
    """One checkpoint family.

    Attributes:
        load: ``(path, trust_remote_code, dtype) -> nn.Module``.
        logits: ``(model, input_ids (B,T) long, attention_mask (B,T) bool, position_ids (B,T) long)
            -> (B,T,V)``; position ``i`` of the result predicts token ``i`` (any shift undone). Left
            padding is marked False in ``attention_mask``; ``position_ids`` count real tokens only.
        detect: ``(config) -> bool``, True when ``family="auto"`` should choose this family;
            ``config`` is the checkpoint's ``config.json`` as a dict (or a ``PretrainedConfig``).
        default_mask_token_id: used when neither the tokenizer nor the config names a mask token (nor
            ``checkpoint_mask_token_id`` finds one).
        cached_logits: a :data:`dlmrl.models.block_cache.CachedLogitsFn` (a forward pass that takes and returns
            keys and values), or ``None`` when the family cannot serve the sampler's block cache
            (``sampling.cache``).
        no_cache_reason: why not, for the error :func:`cached_logits_of` raises (``cached_logits`` ``None``).
        activation_checkpointing: ``(model) -> None`` turning on the checkpoint code's own activation
            checkpointing, for classes that do not support ``transformers``' ``gradient_checkpointing_enable``
            (``None``: use that).
        block_forward: a :data:`dlmrl.models.block_attention.BlockForwardFn` (a pass under an explicit 4-D mask with
            an optional key/value cache) for ``model.kind: block``, or ``None`` when the family's model code cannot run
            block-causally.
        prompt_blocks: under ``model.kind: block``, the prompt is cut into blocks too, as the family's checkpoints
            were trained (:func:`dlmrl.models.block_attention.prompt_block_ids`); False = one clean prompt block.
        default_block_size: the block size of ``model.kind: block`` when neither ``model.block_size`` nor the
            checkpoint's ``config.json`` gives one (LLaDA2's configs record none; its sampler's default is 32).
        output_head: ``(model) -> nn.Module | None``, the module whose output the model's forward returns as its
            logits, unchanged (``lm_head``), for scoring chosen tokens from the final hidden states in chunks
            (``estimator.logits_chunk``, :mod:`dlmrl.models.token_scores`); ``None`` (or a function returning
            ``None`` for a model) = no such split: scoring takes the full logits.
        logit_shift: how far the model's outputs sit before the token they predict (Dream: 1, the output at
            ``i − 1`` predicts token ``i``; :func:`shift_logits_right`), 0 for the others.
        checkpoint_mask_token_id: ``(tokenizer | None, config) -> int | None``, the family's own reading of the mask
            id from the checkpoint when neither the tokenizer's ``mask_token`` nor ``config.json``'s ``mask_token_id``
            names one (a named token in the tokenizer's vocabulary, ...); tried before ``default_mask_token_id``.
        clean_context: how ``model.kind: block`` attends the prompt and the finished blocks
            (:attr:`dlmrl.models.block_policy.BlockDiffusionPolicy.clean_context`): ``"block"`` (block-causally) or
            ``"causal"`` (token-causally, a block's first token from the output before it: Nemotron-Labs-Diffusion).
        trained_blockwise: the family's checkpoints are block-diffusion models, trained with block-causal attention
            (SDAR/TraDo, LLaDA2, Fast-dLLM v2, Nemotron-Labs-Diffusion): ``model.kind: diffusion`` warns that it runs
            them with full bidirectional attention, a layout they never saw.
    """

    load: Callable[[str, bool, torch.dtype], nn.Module]
    logits: Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    detect: Callable[[object], bool]
    default_mask_token_id: int | None = None
    cached_logits: CachedLogitsFn | None = None
    no_cache_reason: str = ""
    activation_checkpointing: Callable[[nn.Module], None] | None = None
    block_forward: BlockForwardFn | None = None
    prompt_blocks: bool = False
    default_block_size: int | None = None
    output_head: Callable[[nn.Module], nn.Module | None] | None = None
    logit_shift: int = 0
    checkpoint_mask_token_id: Callable[[object, object], int | None] | None = None
    clean_context: str = "block"
    trained_blockwise: bool = False

    def fallback_mask_token_id(self, tokenizer, config) -> int | None:
        """The mask id when neither the tokenizer's ``mask_token`` nor ``config.json``'s ``mask_token_id`` names one:
        ``checkpoint_mask_token_id(tokenizer, config)`` if it finds one, else ``default_mask_token_id``
        (``tokenizer`` may be ``None``: a plan made without loading it)."""
        found = self.checkpoint_mask_token_id(tokenizer, config) if self.checkpoint_mask_token_id else None
        return found if found is not None else self.default_mask_token_id


FAMILIES: Registry[Family] = Registry("model family")


def config_value(config: object, key: str, default=None):
    """``config[key]`` for a ``config.json`` dict, ``getattr(config, key)`` for a ``PretrainedConfig``."""
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def _architectures(config: object) -> list[str]:
    return list(config_value(config, "architectures") or [])


def _auto_map_targets(config: object) -> list[str]:
    """The ``module.Class`` references of ``auto_map`` (a value may be a list, e.g. for tokenizers)."""
    targets: list[str] = []
    for value in (config_value(config, "auto_map") or {}).values():
        targets.extend(v for v in (value if isinstance(value, list | tuple) else [value]) if isinstance(v, str))
    return targets


def _model_type(config: object) -> str:
    return str(config_value(config, "model_type", "") or "").lower()


# --------------------------------------------------------------------------------------------- loading


def _from_pretrained(auto_class: str, path: str, trust_remote_code: bool, dtype: torch.dtype) -> nn.Module:
    import transformers

    cls = getattr(transformers, auto_class)
    return cls.from_pretrained(path, trust_remote_code=trust_remote_code, dtype=dtype, use_safetensors=True)


def _load_causal_lm(path: str, trust_remote_code: bool, dtype: torch.dtype) -> nn.Module:
    return _from_pretrained("AutoModelForCausalLM", path, trust_remote_code, dtype)


def _load_masked_lm(path: str, trust_remote_code: bool, dtype: torch.dtype) -> nn.Module:
    return _from_pretrained("AutoModelForMaskedLM", path, trust_remote_code, dtype)


def _load_auto_model(path: str, trust_remote_code: bool, dtype: torch.dtype) -> nn.Module:
    # LLaDA and Dream register their LM classes under AutoModel (their model cards load them with
    # AutoModel.from_pretrained(..., trust_remote_code=True)); their code is written for transformers 4, so it
    # loads with dlmrl.models.compat's patches.
    return load_checkpoint_model(path, trust_remote_code, dtype, "AutoModel")


def llada_activation_checkpointing(model: nn.Module) -> None:
    """Turn on LLaDA's own activation checkpointing: ``model.model.set_activation_checkpointing("whole_layer")``.

    LLaDA's ``LLaDAModelLM`` (OLMo's code) does not set ``supports_gradient_checkpointing``, so ``transformers``'
    ``gradient_checkpointing_enable`` refuses it; its ``LLaDAModel`` recomputes every block in the backward pass
    (``torch.utils.checkpoint``, non-reentrant) once the strategy is ``whole_layer``
    (``ActivationCheckpointingStrategy`` in ``configuration_llada.py``; ``LLaDAModel.forward``).

    Raises:
        ValueError: the model has no ``model.set_activation_checkpointing``.
    """
    inner = getattr(model, "model", None)
    if not hasattr(inner, "set_activation_checkpointing"):
        raise ValueError(f"{type(model).__name__} has neither transformers' gradient checkpointing nor LLaDA's "
                         "model.set_activation_checkpointing")
    strategies = getattr(sys.modules.get(type(inner).__module__), "ActivationCheckpointingStrategy", None)
    inner.set_activation_checkpointing(getattr(strategies, "whole_layer", "whole_layer"))


# ---------------------------------------------------------------------------------------------- logits


def _tiny_logits(model, input_ids, attention_mask, position_ids):
    out = model(input_ids=input_ids, attention_mask=attention_mask.long(), position_ids=position_ids)
    return out.logits


# Per-model facts of masked LMs, computed once: (position offset, whether forward takes position_ids).
_MASKED_LM_FACTS: weakref.WeakKeyDictionary[nn.Module, tuple[int, bool]] = weakref.WeakKeyDictionary()


def _masked_lm_facts(model: nn.Module) -> tuple[int, bool]:
    """``(offset, takes_position_ids)`` for a ``*ForMaskedLM``.

    RoBERTa-style embeddings (RoBERTa, XLM-R, CamemBERT, ...) number real tokens from
    ``padding_idx + 1`` (``create_position_ids_from_input_ids`` in transformers' ``modeling_roberta``),
    BERT and ModernBERT from 0; a model whose ``forward`` has no ``position_ids`` (DistilBERT) gets none.
    """
    facts = _MASKED_LM_FACTS.get(model)
    if facts is None:
        offset = 0
        for module in model.modules():
            if hasattr(module, "create_position_ids_from_input_ids") and getattr(module, "padding_idx", None) is not None:
                offset = int(module.padding_idx) + 1
                break
        params = inspect.signature(model.forward).parameters
        takes = "position_ids" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        facts = _MASKED_LM_FACTS[model] = (offset, takes)
    return facts


def _masked_lm_logits(model, input_ids, attention_mask, position_ids):
    # Positions counted over real tokens, so left padding does not shift a prompt's positions.
    offset, takes_positions = _masked_lm_facts(model)
    kwargs = {"position_ids": position_ids + offset} if takes_positions else {}
    return model(input_ids=input_ids, attention_mask=attention_mask.long(), **kwargs).logits


def llada_output_head(model: nn.Module) -> nn.Module | None:
    """LLaDA's output head ``model.transformer.ff_out`` (``LLaDAModel.forward``: ``logits =
    self.transformer.ff_out(x)``), or ``None`` when the config ties it to the input embedding (the code then calls
    ``F.linear`` on ``wte.weight``, no module) or scales the logits after it (``scale_logits``)."""
    inner = unwrap_model(model)
    config = getattr(inner, "config", None)
    if config_value(config, "weight_tying", False) or config_value(config, "scale_logits", False):
        return None
    head = getattr(getattr(getattr(inner, "model", None), "transformer", None), "ff_out", None)
    return head if isinstance(head, nn.Module) else None


def shift_logits_right(logits: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Undo an autoregressive-style head: the logits for position ``i`` are the outputs at ``i − 1``.

    ``torch.cat([logits[:, :1], logits[:, :-1]], 1)`` (Dream's ``generation_utils.py``, ``_sample``): the
    first position keeps its own output, which carries no prediction (Dream asserts it is never masked).
    With left padding the same rule is applied per row: each row's first real token keeps its own
    output instead of a padding position's, so a row's logits do not depend on its padding.

    Args:
        logits: ``(B, T, V)`` raw outputs.
        attention_mask: ``(B, T)`` bool, True on real tokens (left padding); ``None`` = all real.
    Returns:
        ``(B, T, V)``, same dtype.
    """
    shifted = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # (B, T, V)
    if attention_mask is None or bool(attention_mask.all()):
        return shifted
    mask = attention_mask.bool()
    previous_real = torch.cat([torch.zeros_like(mask[:, :1]), mask[:, :-1]], dim=1)  # (B, T)
    first_real = mask & ~previous_real  # (B, T)
    return torch.where(first_real[..., None], logits, shifted)


def dream_logits(model, input_ids, attention_mask, position_ids):
    """Dream logits, shifted right by one (:func:`shift_logits_right`); ``(B, T, V)``.

    Called as Dream's ``generation_utils.py`` calls the model, ``model(x, attention_mask, tok_idx)``:
    an unpadded batch gets ``attention_mask="full"`` and no position ids; a left-padded batch gets a
    ``(B, 1, T, T)`` bool mask (True = may attend) and position ids counted over real tokens. Dream
    builds its mask as ``pad[:, None, :, None] & pad[:, None, None, :]``, which also blanks the rows
    of padding queries; here only padding *keys* are blocked, so no query row is empty (an all-False
    row makes scaled-dot-product attention return NaN on older torch). Rows of real tokens, the only
    ones used, are identical either way.
    """
    if bool(attention_mask.all()):
        raw = model(input_ids=input_ids, attention_mask="full", position_ids=None).logits
    else:
        b, t = input_ids.shape
        keys = attention_mask.bool()[:, None, None, :].expand(b, 1, t, t)  # (B, 1, T, T)
        raw = model(input_ids=input_ids, attention_mask=keys, position_ids=position_ids).logits
    return shift_logits_right(raw, attention_mask)


# ------------------------------------------------------------------------------------------- detection


def _is_llada(config) -> bool:
    # LLaDA's config.json: model_type "llada", architectures ["LLaDAModelLM"],
    # auto_map {"AutoModel": "modeling_llada.LLaDAModelLM", ...}. LLaDA2 uses another type; LLaDA-MoE's release
    # says "llada" too, so its configs (told apart by architectures / auto_map) are left to the llada_moe family.
    return (
        _model_type(config) == "llada"
        or "LLaDAModelLM" in _architectures(config)
        or any(t.endswith("modeling_llada.LLaDAModelLM") for t in _auto_map_targets(config))
    ) and not is_llada_moe(config)


def is_illada(config) -> bool:
    """Whether a ``llada``-family config is iLLaDA's (``GSAI-ML/iLLaDA-8B-Base`` / ``-Instruct``): LLaDA's code with
    iLLaDA's vocabulary of 155,136 (``embedding_size`` or ``vocab_size``). Our reading: iLLaDA's ``config.json`` is not
    reachable from here; its model card loads it with ``AutoModel`` + ``trust_remote_code`` and points to LLaDA's
    inference code, and its architecture table gives the vocabulary (LLaDA-8B: 126,464)."""
    sizes = {config_value(config, "embedding_size"), config_value(config, "vocab_size")}
    return _is_llada(config) and ILLADA_VOCAB_SIZE in sizes


def llada_mask_token_id(tokenizer, config) -> int | None:
    """The ``llada`` family's mask id when neither the tokenizer's ``mask_token`` nor ``config.json``'s
    ``mask_token_id`` names one (LLaDA's and, we expect, iLLaDA's ``config.json`` do): LLaDA's ``<|mdm_mask|>`` in the
    tokenizer's vocabulary; else by the checkpoint's vocabulary, 5 for iLLaDA's (:func:`is_illada`,
    :data:`ILLADA_MASK_TOKEN_ID`) and 126336 for LLaDA-8B's (:data:`LLADA_MASK_TOKEN_ID`); else ``None`` (the loader
    then asks for ``mask_token_id`` in ``config.json``), never LLaDA's id on another vocabulary."""
    named = tokenizer.get_vocab().get("<|mdm_mask|>") if tokenizer is not None else None
    if named is not None:
        return int(named)
    if is_illada(config):
        return ILLADA_MASK_TOKEN_ID
    sizes = {config_value(config, "embedding_size"), config_value(config, "vocab_size")}
    return LLADA_MASK_TOKEN_ID if LLADA_VOCAB_SIZE in sizes else None


def _is_dream(config) -> bool:
    # Dream's config.json: model_type "Dream", architectures ["DreamModel"],
    # auto_map {"AutoModel": "modeling_dream.DreamModel", ...}.
    return (
        _model_type(config) == "dream"
        or "DreamModel" in _architectures(config)
        or any(t.endswith("modeling_dream.DreamModel") for t in _auto_map_targets(config))
    )


def _is_sdar(config) -> bool:
    # SDAR's and TraDo's config.json: model_type "sdar", architectures ["SDARForCausalLM"],
    # auto_map {"AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM", ...}. SDAR's MoE models use "sdar_moe".
    return (_model_type(config) == "sdar" or "SDARForCausalLM" in _architectures(config)
            or any(t.endswith("modeling_sdar.SDARForCausalLM") for t in _auto_map_targets(config)))


def _is_llada2(config) -> bool:
    # LLaDA2.0's config.json: model_type "llada2_moe", architectures ["LLaDA2MoeModelLM"],
    # auto_map {"AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM", ...}.
    return (_model_type(config) == "llada2_moe" or "LLaDA2MoeModelLM" in _architectures(config)
            or any(t.startswith("modeling_llada2_moe.") for t in _auto_map_targets(config)))


def _is_masked_lm(config) -> bool:
    return any(a.endswith("ForMaskedLM") for a in _architectures(config))


def _is_tiny(config) -> bool:
    # The tiny default is a Llama with bidirectional attention (config.is_causal = False); any transformers
    # decoder class run that way (Qwen2, Mistral, ...) takes the same adapter.
    return config_value(config, "is_causal", True) is False and (
        _model_type(config) == "llama" or any(a.endswith("ForCausalLM") for a in _architectures(config)))


FAMILIES.register("tiny")(
    Family(load=_load_causal_lm, logits=_tiny_logits, detect=_is_tiny, cached_logits=hf_cached_logits,
           block_forward=hf_block_forward, output_head=hf_output_head)
)
FAMILIES.register("masked_lm")(
    Family(load=_load_masked_lm, logits=_masked_lm_logits, detect=_is_masked_lm,
           no_cache_reason="encoder-only masked LMs (BERT, RoBERTa, ModernBERT) take no key/value cache")
)
FAMILIES.register("llada")(
    Family(load=_load_auto_model, logits=llada_logits, detect=_is_llada, checkpoint_mask_token_id=llada_mask_token_id,
           activation_checkpointing=llada_activation_checkpointing, output_head=llada_output_head,
           cached_logits=llada_cached_logits)
)
FAMILIES.register("dream")(
    Family(load=_load_auto_model, logits=dream_logits, detect=_is_dream, default_mask_token_id=DREAM_MASK_TOKEN_ID,
           output_head=hf_output_head, logit_shift=1,
           no_cache_reason="dlmrl has no cache adapter for Dream's checkpoint code (modeling_dream.py; Fast-dLLM "
                           "ships a modified copy for block caching)")
)

FAMILIES.register("sdar")(
    Family(load=load_sdar, logits=sdar_logits, detect=_is_sdar, default_mask_token_id=SDAR_MASK_TOKEN_ID,
           block_forward=sdar_block_forward, prompt_blocks=True, output_head=hf_output_head,
           trained_blockwise=True,
           no_cache_reason="SDAR and TraDo are block-diffusion checkpoints: run them with model.kind block, "
                           "whose key/value cache is exact")
)
FAMILIES.register("llada2")(
    Family(load=load_llada2, logits=llada2_logits, detect=_is_llada2, default_mask_token_id=LLADA2_MASK_TOKEN_ID,
           block_forward=bool_mask_block_forward, prompt_blocks=True, default_block_size=LLADA2_BLOCK_SIZE,
           output_head=hf_output_head, trained_blockwise=True,
           no_cache_reason="LLaDA2 checkpoints are block-diffusion models: run them with model.kind block, whose "
                           "key/value cache is exact")
)

FAMILIES.register("llada_moe")(
    Family(load=load_llada_moe, logits=llada_moe_logits, detect=is_llada_moe,
           checkpoint_mask_token_id=llada_moe_mask_token_id, output_head=hf_output_head,
           no_cache_reason="LLaDA-MoE's modeling_lladamoe.py refuses a key/value cache (its forward asserts use_cache "
                           "is off), and dlmrl's block-by-block LLaDA cache (dlmrl/models/llada_cache.py) is written "
                           "for dense LLaDA's modules, not tested on its mixture-of-experts blocks")
)
FAMILIES.register("nemotron_diffusion")(
    Family(load=load_nemotron_diffusion, logits=nemotron_logits, detect=is_nemotron_diffusion,
           default_mask_token_id=NEMOTRON_MASK_TOKEN_ID, block_forward=nemotron_block_forward,
           default_block_size=NEMOTRON_BLOCK_SIZE, output_head=hf_output_head, clean_context="causal",
           trained_blockwise=True,
           no_cache_reason="Nemotron-Labs-Diffusion checkpoints are block-diffusion models: run them with model.kind "
                           "block, whose key/value cache is exact (or model.kind ar, the same weights left to right)")
)

FAMILIES.register("fast_dllm_v2")(
    Family(load=load_fast_dllm_v2, detect=is_fast_dllm_v2,  # (logits: the full pass shifted right, as Dream's)
           logits=lambda model, ids, mask, pos: shift_logits_right(fast_dllm_v2_raw_logits(model, ids, mask, pos),
                                                                   mask),
           default_mask_token_id=FAST_DLLM_V2_MASK_TOKEN_ID, checkpoint_mask_token_id=fast_dllm_v2_mask_token_id,
           block_forward=fast_dllm_v2_block_forward, prompt_blocks=True, default_block_size=FAST_DLLM_V2_BLOCK_SIZE,
           output_head=hf_output_head, logit_shift=1, trained_blockwise=True,
           no_cache_reason="Fast-dLLM v2 checkpoints are block-diffusion models: run them with model.kind block, whose "
                           "key/value cache is exact")
)


def cached_logits_of(family: str | None, mode: str) -> CachedLogitsFn:
    """The block-cache forward of the registered ``family``, for ``sampling.cache = mode``.

    Raises:
        ValueError: naming the family and why when it has none (unregistered families included).
    """
    fam = FAMILIES.get(family) if family in FAMILIES else None
    if fam is not None and fam.cached_logits is not None:
        return fam.cached_logits
    able = [n for n in FAMILIES if FAMILIES.get(n).cached_logits is not None]
    why = fam.no_cache_reason if fam is not None and fam.no_cache_reason else (
        "it registers no cached_logits" if fam is not None else "it is not a registered family")
    raise ValueError(f"sampling.cache={mode!r} is not available for model family {family!r}: {why}. Families with a "
                     f"block cache: {able} (transformers decoder classes run with is_causal=False, e.g. Llama or "
                     "Qwen2, load as 'tiny'); set sampling.cache=none")


def detect_family(config) -> str:
    """Name of the registered family whose ``detect`` accepts ``config``.

    Args:
        config: the checkpoint's ``config.json`` as a dict, or a ``PretrainedConfig``.
    Raises:
        ValueError: if no family, or more than one, recognises the config (set ``model.family``).
    """
    found = [name for name in FAMILIES if FAMILIES.get(name).detect(config)]
    if len(found) == 1:
        return found[0]
    what = f"model_type {config_value(config, 'model_type')!r}, architectures {_architectures(config)}"
    if not found:
        raise ValueError(
            f"cannot detect the model family of this checkpoint ({what}); "
            f"set model.family to one of {FAMILIES.names()}"
            + ("; if it is an autoregressive (causal) LM, set model.kind=ar (and, for Sudoku, "
               "task.answer_mode=full)" if any("CausalLM" in a for a in _architectures(config)) else "")
        )
    raise ValueError(f"several model families match this checkpoint ({what}): {found}; set model.family")


__all__ = [
    "DREAM_MASK_TOKEN_ID",
    "FAMILIES",
    "ILLADA_MASK_TOKEN_ID",
    "LLADA_MASK_TOKEN_ID",
    "Family",
    "cached_logits_of",
    "config_value",
    "detect_family",
    "dream_logits",
    "is_illada",
    "left_padding",
    "llada_activation_checkpointing",
    "llada_logits",
    "llada_mask_token_id",
    "llada_output_head",
    "shift_logits_right",
]
