"""Google's DiffusionGemma (``DiffusionGemmaForBlockDiffusion``, ``model_type: diffusion_gemma``) on the class that
transformers itself ships (``transformers/models/diffusion_gemma/``, transformers >= 5.11; read here from 5.25).

No remote code: :func:`load_diffusion_gemma` loads the checkpoint natively. The model is a uniform-noise,
self-conditioned block diffusion LM with one set of weights used two ways:

- **the encoder** (``model.model.encoder``, ``DiffusionGemmaEncoderModel``) runs *causally* over the prompt and the
  finished canvases and writes their keys/values into a KV cache (a ``DynamicCache``);
- **the decoder** (``model.model.decoder``, ``DiffusionGemmaDecoderModel``) runs *bidirectionally* over a canvas of
  ``config.canvas_length`` tokens, reading (never writing) that cache, with a self-conditioning input: the previous
  denoising step's (temperature-scaled) logits, turned into soft embeddings ``softmax(ℓ)·E·√H`` and added through a
  gated MLP (``DiffusionGemmaSelfConditioning``); the first step gets zeros.

The functions below are those two passes as plain calls over the transformers model, with the argument shapes that
``DiffusionGemmaGenerationMixin.generate`` (``generation_diffusion_gemma.py``) uses, so that dlmrl's sampler
(:mod:`dlmrl.models.uniform_sampler`) and a later scorer run exactly the computations ``generate`` runs.
:func:`build_tiny_diffusion_gemma` builds a tiny random checkpoint offline for tests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

#: ``config.json``'s ``model_type`` of DiffusionGemma checkpoints (``DiffusionGemmaConfig.model_type``).
DIFFUSION_GEMMA_MODEL_TYPE = "diffusion_gemma"
#: The architecture name ``config.json`` records (``DiffusionGemmaForBlockDiffusion``).
DIFFUSION_GEMMA_ARCHITECTURE = "DiffusionGemmaForBlockDiffusion"


# --------------------------------------------------------------------------------------------- detection, loading


def is_diffusion_gemma(config: Mapping | object) -> bool:
    """Whether a checkpoint's ``config.json`` (a dict, or a ``PretrainedConfig``) is a DiffusionGemma one:
    ``model_type == "diffusion_gemma"`` (``DiffusionGemmaConfig.model_type`` in
    ``configuration_diffusion_gemma.py``), or, for a config without a model type, ``architectures`` naming
    ``DiffusionGemmaForBlockDiffusion``. The text sub-config's ``diffusion_gemma_text`` is not a checkpoint's type
    and is not matched."""
    def value(key):
        return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)

    model_type = str(value("model_type") or "").lower()
    if model_type:
        return model_type == DIFFUSION_GEMMA_MODEL_TYPE
    return DIFFUSION_GEMMA_ARCHITECTURE in list(value("architectures") or [])


def _resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if isinstance(resolved, torch.dtype):
        return resolved
    raise ValueError(f"dtype: {dtype!r} is not a torch dtype (use e.g. 'bfloat16', 'float32')")


def load_diffusion_gemma(name_or_path: str, dtype: torch.dtype | str = torch.bfloat16) -> nn.Module:
    """``DiffusionGemmaForBlockDiffusion.from_pretrained(name_or_path, dtype=dtype)``: transformers' own class,
    ``trust_remote_code=False`` (DiffusionGemma needs no checkpoint code). The checkpoint's ``generation_config.json``
    (``DiffusionGemmaGenerationConfig``: steps, entropy bound, temperatures, stopping thresholds) is loaded with it
    as ``model.generation_config``. Returned in eval mode, as ``from_pretrained`` leaves it.

    Args:
        name_or_path: a local folder or a hub id with a ``config.json`` of ``model_type: diffusion_gemma``.
        dtype: a ``torch.dtype`` or its name (``"bfloat16"``, ``"float32"``, ...).
    Raises:
        ValueError: ``dtype`` is not a torch dtype; or the checkpoint's ``config.json`` is not a DiffusionGemma one
            (its ``model_type`` is named).
        OSError: no ``config.json`` at ``name_or_path``.
    """
    from transformers import DiffusionGemmaForBlockDiffusion, PretrainedConfig

    torch_dtype = _resolve_dtype(dtype)
    config, _ = PretrainedConfig.get_config_dict(name_or_path)
    if not is_diffusion_gemma(config):
        raise ValueError(f"{name_or_path}: config.json has model_type {config.get('model_type')!r}, not "
                         f"{DIFFUSION_GEMMA_MODEL_TYPE!r} (DiffusionGemmaForBlockDiffusion)")
    return DiffusionGemmaForBlockDiffusion.from_pretrained(name_or_path, dtype=torch_dtype, trust_remote_code=False)


def unwrap_diffusion_gemma(model: nn.Module) -> nn.Module:
    """The ``DiffusionGemmaForBlockDiffusion`` inside ``model`` (a data-parallel wrapper, e.g. DDP's under
    ``accelerate launch``, by its ``module``; a PEFT wrapper with ``get_base_model()``: its LoRA layers sit inside
    the base model, so calling the base runs them). Calling the inner model skips DDP's gradient hooks: the trainer
    averages a DDP run's gradients itself once per update (``dlmrl.training.distributed``).

    Raises:
        TypeError: ``model`` is not (a wrapper of) a ``DiffusionGemmaForBlockDiffusion``.
    """
    from transformers import DiffusionGemmaForBlockDiffusion

    seen = model
    while isinstance(seen, nn.parallel.DistributedDataParallel):
        seen = seen.module
    while not isinstance(seen, DiffusionGemmaForBlockDiffusion) and hasattr(seen, "get_base_model"):
        inner = seen.get_base_model()
        if inner is seen:
            break
        seen = inner
    if not isinstance(seen, DiffusionGemmaForBlockDiffusion):
        raise TypeError(f"expected a DiffusionGemmaForBlockDiffusion (transformers), got {type(model).__name__}")
    return seen


# --------------------------------------------------------------------------------------------- LoRA

#: What ``model.lora_target_modules: all-linear`` adapts on DiffusionGemma: the attention projections and the dense
#: MLP of every text layer, as NeMo AutoModel's DiffusionGemma LoRA recipe does
#: (NVIDIA-NeMo/Automodel, ``examples/dllm_sft/diffusion_gemma_lora.yaml``: ``*self_attn.{q,k,v,o}_proj``,
#: ``*.mlp.{gate,up,down}_proj``; router, experts and the tied head frozen). The MoE experts are 3-D parameters, not
#: ``nn.Linear`` layers (peft does not adapt them), the router's ``proj`` is left out so that routing stays the
#: base's, and the vision tower and the self-conditioning MLP are never adapted.
DEFAULT_LORA_TARGETS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
#: the text layers: the encoder's (``model.encoder.language_model.layers``) and the decoder's, whose weights are
#: the same tensors (``DiffusionGemmaModel._tied_weights_keys``)
_TEXT_LAYERS = r"model\.(?:encoder\.language_model|decoder)\.layers\.\d+\."
_ENCODER_LAYERS = "model.encoder.language_model.layers."
_DECODER_LAYERS = "model.decoder.layers."


def lora_target_pattern(spec: str | list[str]) -> str:
    """peft's ``target_modules`` for DiffusionGemma (a regular expression, which peft full-matches against module
    names): ``"all-linear"`` = :data:`DEFAULT_LORA_TARGETS`; a list of names = those names matched as name suffixes
    (``q_proj`` matches ``self_attn.q_proj``), always inside the text layers of the encoder and the decoder, never in
    the vision tower, the self-conditioning MLP or the head.

    Raises:
        ValueError: an empty name.
    """
    import re

    names = DEFAULT_LORA_TARGETS if spec == "all-linear" else list(spec)
    if not names or any(not str(n).strip() for n in names):
        raise ValueError(f"target modules must be 'all-linear' or a comma list of module names, got {spec!r}")
    return _TEXT_LAYERS + r"(?:[^.]+\.)*?(?:" + "|".join(re.escape(str(n).strip()) for n in names) + ")"


def share_encoder_adapters(model: nn.Module) -> int:
    """Make the decoder's LoRA layers the encoder's own (the same module objects), in place; returns how many.

    DiffusionGemma runs one set of text weights twice: causally in the encoder (prompt and finished canvases into
    the KV cache) and bidirectionally in the decoder (the canvas). transformers keeps two module trees whose weights
    are tied (``DiffusionGemmaModel._tied_weights_keys``), so peft injects two independent adapters per targeted
    layer; without this the two passes would train two adapters, and the cache would not come from the weights the
    canvas sees. After it, each adapter is one set of ``lora_A`` / ``lora_B`` parameters, used (and trained) by both
    passes. peft saves a shared parameter once, under its first name (the encoder's), so a saved adapter holds the
    encoder's names only: :func:`dlmrl.models.uniform_policy.load_uniform_policy` calls this after loading it (a
    plain ``PeftModel.from_pretrained`` leaves the decoder's adapters at their initialisation until this runs).

    Raises:
        ValueError: a decoder LoRA layer without an encoder counterpart on the same (tied) weight.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    inner = unwrap_diffusion_gemma(model)
    modules = dict(inner.named_modules(remove_duplicate=False))
    shared = 0
    for name, module in list(modules.items()):
        if not (name.startswith(_DECODER_LAYERS) and isinstance(module, BaseTunerLayer)):
            continue
        twin = modules.get(_ENCODER_LAYERS + name[len(_DECODER_LAYERS):])
        if twin is module:
            continue
        if not isinstance(twin, BaseTunerLayer) or twin.get_base_layer().weight is not module.get_base_layer().weight:
            raise ValueError(f"{name}: the decoder's adapted layer has no encoder layer on the same tied weight "
                             "(adapt the encoder and decoder text layers together)")
        parent_name, _, child = name.rpartition(".")
        setattr(modules[parent_name], child, twin)
        shared += 1
    return shared


# --------------------------------------------------------------------------------------------- the tiny model


def tiny_generation_config(max_new_tokens: int = 16, max_denoising_steps: int = 8, entropy_bound: float = 1.0,
                           t_min: float = 0.4, t_max: float = 0.8, stability_threshold: int | None = 1,
                           confidence_threshold: float | None = 0.005, eos_token_id: int = 1,
                           pad_token_id: int = 0, bos_token_id: int = 2):
    """A ``DiffusionGemmaGenerationConfig`` sized for :func:`build_tiny_diffusion_gemma` (a few steps, two canvases of
    8). ``t_min``, ``t_max``, ``stability_threshold`` and ``confidence_threshold`` are transformers' global defaults
    (``DiffusionGemmaGenerationConfig._get_default_generation_params``); the entropy bound is 1.0 rather than its
    0.1 so that a random model, whose per-position entropies are large, accepts more than one token per step
    (dlmrl test choice)."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        DiffusionGemmaGenerationConfig,
        EntropyBoundSamplerConfig,
    )

    return DiffusionGemmaGenerationConfig(
        max_new_tokens=max_new_tokens, max_denoising_steps=max_denoising_steps,
        sampler_config=EntropyBoundSamplerConfig(entropy_bound=float(entropy_bound)), t_min=t_min, t_max=t_max,
        stability_threshold=stability_threshold, confidence_threshold=confidence_threshold,
        eos_token_id=eos_token_id, pad_token_id=pad_token_id, bos_token_id=bos_token_id)


def build_tiny_diffusion_gemma(seed: int = 0, vocab_size: int = 128, canvas_length: int = 8, hidden_size: int = 64,
                               num_layers: int = 2, num_heads: int = 2, head_dim: int = 32, num_experts: int = 4,
                               top_k_experts: int = 2, intermediate_size: int = 128,
                               moe_intermediate_size: int = 32, sliding_window: int = 16,
                               embedding_std: float | None = 0.2, generation_config=None,
                               dtype: torch.dtype = torch.float32, global_head_dim: int | None = None) -> nn.Module:
    """A tiny random ``DiffusionGemmaForBlockDiffusion`` built offline from configs (well under a second).

    Text part (``DiffusionGemmaTextConfig``): ``num_layers`` layers of width ``hidden_size``, alternating sliding
    (window ``sliding_window``) and full attention with the last one full (the config forces that), one key/value
    head, a dense MLP of ``intermediate_size`` plus ``num_experts`` experts (top ``top_k_experts``) of
    ``moe_intermediate_size``, as every DiffusionGemma layer has. Vision part: a Gemma-4 vision tower shrunk to one
    layer of width 16 (the class requires one; text-only use never runs it). Token ids: pad 0, eos 1, bos 2, and the
    image tokens (``boi``, ``eoi``, ``image``) at the last three ids of the vocabulary, so a text prompt should use
    ids in ``[3, vocab_size - 3)``. The defaults give 161,880 parameters (the tied embedding / output head counted
    once).

    ``embedding_std`` re-draws the tied embedding / output head from ``N(0, embedding_std²)`` after transformers'
    init. Its std ``initializer_range`` = 0.02 leaves the output distribution nearly uniform (every position at
    entropy ≈ ``log V``: the entropy bound accepts one token per step and early stopping never fires); at 1.0 it is
    so peaked that nearly every position is accepted at the first step. At the default 0.2 the per-position
    entropies spread from ~0.05 to ~2.5 nats (median ~0.8, at ``t`` 0.8 → 0.4), so the acceptance takes ~2 tokens
    per step at γ = 0.1 and ~5 of 8 at γ = 1 (dlmrl test choice); ``None`` keeps transformers' init.

    Args:
        seed: seeds ``torch.manual_seed`` before the initialisation (the global RNG is left advanced).
        vocab_size: ``V`` (≥ 8).
        canvas_length: the canvas (block) length ``L`` of ``DiffusionGemmaConfig.canvas_length``.
        generation_config: the ``DiffusionGemmaGenerationConfig`` set as ``model.generation_config``; default
            :func:`tiny_generation_config` ``()``.
        dtype: the parameters' dtype.
        global_head_dim: the full-attention layers' head dimension (default ``head_dim``; the 26B-A4B's is twice
            its sliding layers').
    Returns:
        ``DiffusionGemmaForBlockDiffusion`` in eval mode, ``attn_implementation="sdpa"``.
    Raises:
        ValueError: ``vocab_size < 8`` (the special and image ids would collide).
    """
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    if vocab_size < 8:
        raise ValueError(f"vocab_size: {vocab_size} is too small (the tiny model reserves ids 0-2 and the last 3)")
    layer_types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
    layer_types[-1] = "full_attention"
    text = {"vocab_size": vocab_size, "hidden_size": hidden_size, "intermediate_size": intermediate_size,
            "num_hidden_layers": num_layers, "num_attention_heads": num_heads, "num_key_value_heads": 1,
            "head_dim": head_dim, "global_head_dim": global_head_dim or head_dim, "num_global_key_value_heads": 1,
            "max_position_embeddings": 4096, "sliding_window": sliding_window, "layer_types": layer_types,
            "num_experts": num_experts, "top_k_experts": top_k_experts,
            "moe_intermediate_size": moe_intermediate_size, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 2, "head_dim": 8, "patch_size": 4, "position_embedding_size": 64,
              "pooling_kernel_size": 1}
    config = DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=canvas_length,
                                  boi_token_id=vocab_size - 3, eoi_token_id=vocab_size - 2,
                                  image_token_id=vocab_size - 1, attn_implementation="sdpa")
    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(config)
    if embedding_std is not None:
        with torch.no_grad():  # tied: encoder and decoder embeddings and lm_head are this one tensor
            model.model.decoder.embed_tokens.weight.normal_(0.0, embedding_std)
    model.generation_config = generation_config if generation_config is not None else tiny_generation_config()
    return model.to(dtype).eval()


# --------------------------------------------------------------------------------------------- the forward pieces


def new_cache(model: nn.Module):
    """An empty ``DynamicCache`` for the encoder's keys/values, as ``generate``'s ``_prepare_cache_for_generation``
    builds it by default (``DynamicCache(config=model.config.get_text_config(decoder=True))``: sliding layers keep
    the last ``sliding_window`` positions)."""
    from transformers import DynamicCache

    return DynamicCache(config=unwrap_diffusion_gemma(model).config.get_text_config(decoder=True))


def repeated_cache(cache, repeats: int):
    """A new cache holding ``cache``'s keys/values repeated ``repeats`` times along the batch (row ``b·repeats + k``
    is row ``b``'s), ``cache`` itself untouched. The decoder only reads the cache, and under gradient checkpointing
    its layers are recomputed in the backward pass from the same cache object: repeating ``cache`` in place and
    cutting it back after the forward would hand the recompute the cut-back tensors; a separate copy keeps what the
    forward read. Costs the repeated tensors, as the in-place repeat does."""
    out = snapshot_cache(cache)  # (each layer's repeat rebinds its own tensors, leaving cache's)
    out.batch_repeat_interleave(int(repeats))
    return out


def snapshot_cache(cache):
    """A view of ``cache`` as it stands: new cache and layer objects sharing its key/value tensors (no copy). The
    next encoder pass extends a layer by rebinding its tensors (``torch.cat``), so the view keeps what a decoder
    pass read; under gradient checkpointing the backward's recompute reads the cache object again, and must see the
    tensors the forward saw, not the extended ones."""
    import copy

    out = copy.copy(cache)
    out.layers = [copy.copy(layer) for layer in cache.layers]
    return out


def detached_cache(cache) -> tuple[object, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A copy of ``cache`` whose keys/values are detached leaves (requiring grad where the originals do), and the
    ``(original, leaf)`` pairs of those that do.

    Lets several decoder passes with their own backward read one encoder pass: each backward stops at the leaves
    and adds to their ``.grad``; one later ``torch.autograd.backward([originals], [leaf grads])`` takes the sum
    through the encoder, so the encoder's graph is back-propagated once, however many passes read it (the chain
    rule; ours, no reference does this). ``cache`` itself is untouched."""
    out, pairs = snapshot_cache(cache), []
    for new in out.layers:
        for name in ("keys", "values"):
            tensor = getattr(new, name, None)
            if isinstance(tensor, torch.Tensor):
                leaf = tensor.detach().requires_grad_(tensor.requires_grad)
                setattr(new, name, leaf)
                if tensor.requires_grad:
                    pairs.append((tensor, leaf))
    return out, pairs


def position_ids(start: int, length: int, device: torch.device | str) -> torch.Tensor:
    """``arange(start, start + length)`` as ``(1, length)`` int32: the positions ``generate`` gives the encoder's
    new tokens (``encoder_position_ids``) and the canvas (``decoder_position_ids``). Shared by every row: a
    left-padded row's pad tokens take positions too (only the attention mask hides them), exactly as in
    ``generate``."""
    return torch.arange(start, start + length, dtype=torch.int32, device=device).unsqueeze(0)


def encode(model: nn.Module, new_ids: torch.Tensor, attention_mask: torch.Tensor, cache, positions: torch.Tensor):
    """The encoder pass: run the shared weights causally over the tokens not yet in ``cache`` and append their
    keys/values to it (in place).

    Mirrors steps 1.a of ``DiffusionGemmaGenerationMixin.generate``: ``_prepare_encoder_inputs`` (the 4D masks from
    ``model.model.encoder.create_masks_for_generate`` over the whole 2D mask so far) then
    ``model.model.encoder(input_ids=..., attention_mask=<mask mapping>, cache=..., position_ids=...)``.

    Args:
        new_ids: ``(B, T_new)`` long: the prompt (first call) or the last finished canvas (later calls).
        attention_mask: ``(B, T_cached + T_new)`` bool: False on left padding, True elsewhere (the finished canvases
            included, also after EOS: ``generate`` pads the mask with True for every canvas).
        cache: the ``DynamicCache`` (:func:`new_cache`), extended in place by ``T_new`` positions.
        positions: ``(1, T_new)`` int32 (:func:`position_ids` ``(T_cached, T_new)``).
    Returns:
        the encoder's ``BaseModelOutputWithPast``: ``last_hidden_state`` ``(B, T_new, H)`` (for the encoder's
        causal-LM loss; the model's dtype) and ``cache``.
    """
    inner = unwrap_diffusion_gemma(model)
    new_ids = new_ids.clone(memory_format=torch.contiguous_format)  # as generate does (stride-stable input)
    dummy = torch.empty((new_ids.shape[0], new_ids.shape[1], 0), dtype=inner.dtype, device=new_ids.device)
    masks = inner.model.encoder.create_masks_for_generate(
        config=inner.config, inputs_embeds=dummy, attention_mask=attention_mask, cache=cache,
        position_ids=positions, mm_token_type_ids=None)
    return inner.model.encoder(input_ids=new_ids, attention_mask=masks, cache=cache, position_ids=positions)


def canvas_attention_masks(model: nn.Module, canvas: torch.Tensor, cache,
                           decoder_attention_mask: torch.Tensor) -> dict:
    """The decoder's attention masks for one canvas: every canvas position attends to every cached position the 2D
    mask keeps and to the whole canvas (bidirectional). Built once per canvas, after its encoder pass.

    Mirrors ``generate``'s ``_prepare_denoiser_inputs``:
    ``model.model.decoder.create_diffusion_decoder_attention_mask(config, inputs_embeds=canvas.unsqueeze(-1),
    cache, decoder_attention_mask)`` (``modeling_diffusion_gemma.py``, ``DiffusionGemmaDecoderModel``).

    Args:
        canvas: ``(B, L)`` long (only its shape, dtype and device are read).
        decoder_attention_mask: ``(B, T_cached + L)`` bool: the encoder's 2D mask padded with ``L`` Trues.
    Returns:
        ``{"full_attention": mask or None, "sliding_attention": mask or None}`` (None when nothing is masked: sdpa
        then attends everywhere).
    """
    inner = unwrap_diffusion_gemma(model)
    return inner.model.decoder.create_diffusion_decoder_attention_mask(
        config=inner.config, inputs_embeds=canvas.unsqueeze(-1), cache=cache,
        decoder_attention_mask=decoder_attention_mask)


def canvas_logits(model: nn.Module, canvas: torch.Tensor, cache, masks: dict, positions: torch.Tensor,
                  self_conditioning_logits: torch.Tensor | None = None,
                  self_conditioning_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The canvas pass: the decoder over a canvas, reading the encoder's cache, with the self-conditioning input;
    returns the softcapped logits (``tanh(ℓ / 30)·30``, ``DiffusionGemmaForBlockDiffusion.forward``).

    Mirrors step 1.c.i of ``generate`` (``_denoising_step``): ``model(decoder_input_ids=canvas,
    self_conditioning_logits=..., decoder_attention_mask=masks, cache=cache, decoder_position_ids=positions)`` with
    no ``input_ids``, so the encoder does not run and the cache is only read. Differentiable when called with grad
    enabled (the decoder layers support gradient checkpointing with the cache).

    Args:
        canvas: ``(B, L)`` long: the noisy canvas ``z``.
        masks: :func:`canvas_attention_masks`'s mapping.
        positions: ``(1, L)`` int32: :func:`position_ids` ``(T_cached, L)``.
        self_conditioning_logits: ``(B, L, V)``, or None at the first step (the decoder then adds a zero signal).
            ``generate`` passes the previous step's *temperature-scaled* logits cast to the embeddings' dtype
            (:func:`self_conditioning_input`); the decoder embeds them as ``softmax(ℓ)·E·√H``.
        self_conditioning_mask: ``(B,)`` bool or None: rows set False get a zero signal (training's per-row coin).
    Returns:
        ``(B, L, V)`` float32 logits (the model casts to float32 before the softcap).
    """
    inner = unwrap_diffusion_gemma(model)
    return inner(decoder_input_ids=canvas, self_conditioning_logits=self_conditioning_logits,
                 self_conditioning_mask=self_conditioning_mask, decoder_attention_mask=masks, cache=cache,
                 decoder_position_ids=positions).logits


def self_conditioning_input(model: nn.Module, processed_logits: torch.Tensor) -> torch.Tensor:
    """The next step's self-conditioning input: the step's processed (temperature-scaled) logits cast to the
    embeddings' dtype (``generate``'s step 1.c.v: ``processed_logits.to(model.model.decoder.embed_tokens.weight.dtype)``;
    in bfloat16 this rounds them, and the next step sees the rounded values)."""
    inner = unwrap_diffusion_gemma(model)
    return processed_logits.to(inner.model.decoder.embed_tokens.weight.dtype)


def num_canvases(max_new_tokens: int, canvas_length: int) -> int:
    """``ceil(max_new_tokens / canvas_length)``: the most canvases ``generate`` writes (its output always holds
    whole canvases, so it can exceed ``max_new_tokens`` by up to ``canvas_length - 1`` tokens)."""
    return math.ceil(max_new_tokens / canvas_length)
