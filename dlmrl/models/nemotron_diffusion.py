"""The ``nemotron_diffusion`` family: NVIDIA's Nemotron-Labs-Diffusion checkpoints on their own published model code.

Nemotron-Labs-Diffusion (``nvidia/Nemotron-Labs-Diffusion-3B``, ``-8B``, ``-14B``, May 2026) is a Ministral-3 decoder
(``encoder``, a ``Ministral3Model``) with one output head (``diffusion_head``) whose one set of weights runs as a
block-diffusion model, as an autoregressive model, or as both (self-speculation). The checkpoints ship
``modeling_nemotron_labs_diffusion.py`` (``model_type: "nemotron_labs_diffusion"``, ``NemotronLabsDiffusionModel``,
loaded with ``AutoModel``), ``configuration_nemotron_labs_diffusion.py`` and ``modeling_ministral.py``; NVIDIA's
internal version of the same model is ``MinistralDiffEncoderModel`` in ``modeling_ministral_dlm.py``.

How dlmrl runs that code (read from the release's ``modeling_nemotron_labs_diffusion.py`` and
``configuration_nemotron_labs_diffusion.py`` as the search index stores them, 36,264 and 8,268 characters, with no
repository or commit named; the 8B's ``config.json`` as public ports of the checkpoint embed it. The hub repository
is not reachable from this project's machines, and no reachable copy holds ``modeling_ministral.py``: what dlmrl
assumes of it is listed below and checked on every load):

- **The paradigm** (``config.json``'s ``dlm_paradigm``, read in ``NemotronLabsDiffusionModel.__init__``):
  ``block_diff`` builds ``NemotronLabsDiffusionFlexAttention`` (compiled flex attention over a ``[noisy | clean]``
  input with its own mask: noisy block-diagonal, noisy to earlier clean blocks, the clean half *fully causal*;
  ``attention_mask`` is ignored), ``bidirectional`` builds ``Ministral3Attention`` with ``diffusion_lm=True``
  (attends both ways; the released 8B's value), ``autoregressive`` the same class with ``diffusion_lm=False``: plain
  causal attention. NVIDIA's RL code (zyzhou5/RL@52a6bd45, a NeMo RL fork:
  ``nemo_rl/models/policy/workers/diffusion_dtensor_policy_worker.py``, ``_validate_attention_paradigm``) refuses the
  last for diffusion training, since it "converges on the wrong objective with no error"; it requires a flex
  paradigm because its training drives the flex class's own mask (``set_attention_mode``), while dlmrl supplies its
  masks itself and needs only a class that honours them (which the load verifies).
  :func:`paradigm_problem` is dlmrl's version of that check, run by the config check (a local ``config.json``;
  :func:`dlmrl.kinds.base.check_nemotron_paradigm`) and at load (any checkpoint): ``model.kind: block`` and ``diffusion`` refuse ``autoregressive`` (and unknown values) naming
  the key, the file and what to set; ``block_diff`` loads with the ``bidirectional`` class (the same parameters: the
  flex class subclasses ``Ministral3Attention``; the config keeps its declared value), because compiled flex attention
  with a mask fixed by the code can take neither dlmrl's block masks nor a key/value cache (and needs a GPU compiler).
- **The forward pass** (:func:`nemotron_block_forward`, the family's block forward): the release's
  ``Ministral3Attention`` hands ``attention_mask=None`` to its attention kernel in diffusion mode (an axolotl
  integration of these checkpoints in the search index, no repository named,
  ``enable_nemotron_explicit_attention_mask``: "The native remote source sends ``None`` to its attention interface
  in diffusion mode"), so no mask argument reaches it. dlmrl therefore runs the
  code's own modules (embedding, projections, RoPE at ``position_ids``, Llama-4 query scaling, MLP, norms, head) and
  registers one attention kernel with ``transformers``' ``AttentionInterface`` (:data:`ATTENTION_NAME`:
  scaled-dot-product attention under the explicit ``(B, 1, T, S + T)`` mask of the pass, which replaces whatever mask
  argument the code passes); the encoder's layers look their kernel up by ``config._attn_implementation``, which dlmrl
  sets on the encoder's config only. Outside dlmrl's passes (no explicit mask set) the kernel is ``sdpa`` with the
  code's own arguments, so the code's ``generate`` and ``ar_generate`` run as published. :func:`check_explicit_mask`
  verifies on every load that a key the mask blocks does not change the logits and one it allows does; a checkpoint
  whose code routes attention elsewhere (``MinistralDiffEncoderModel``'s flex class) is refused there.
- **Logits**: the diffusion logits are unshifted (position ``i`` predicts token ``i``; ``generate``'s
  ``_get_transfer_index`` reads ``logits[i]`` for position ``i``); under causal attention the same head's output at
  ``i`` predicts token ``i + 1`` (``ar_generate`` takes the last position's logits as the next token's).
- **The block layout, dlmrl's default: ``generate``'s default ``causal_context=True``** (the family's
  ``clean_context="causal"``, :attr:`~dlmrl.models.block_policy.BlockDiffusionPolicy.clean_context`).
  ``generate(prompt_ids, max_new_tokens, block_length, threshold=None, causal_context=True)`` prefills the prompt with
  every layer switched to ``diffusion_lm=False`` and ``use_causal_mask=True`` (token-causal attention, an AR model's)
  and takes the argmax of the prompt's last logits (a multinomial draw at ``temperature > 0``) as the first block's
  first token; each block is that token followed by ``block_length − 1`` masks, aligned to the prompt's end, denoised
  by ``self(block, past_key_values=cache, use_cache=False)`` with the layers back in diffusion mode (the block attends
  the whole cache and itself both ways, its logits unshifted: position ``i`` predicts token ``i``) in ``block_length``
  steps over its ``block_length − 1`` masks (``_get_num_transfer_tokens``: one token per step, the most confident
  masked position first), then cached by another causal pass, whose last logits give the next block's first token
  (the AR head: the previous position's output, a one-token shift for that token only). That is the training
  layout's fully causal clean half (``block_diff_mask``'s ``fully_causal`` part) and the ``[noisy | clean]`` layout
  NVIDIA's RL replays (zyzhou5/RL@52a6bd45, ``diffusion_dtensor_policy_worker.py``). dlmrl's block kind does the
  same with ``clean_context="causal"``: the sampler's prompt and cache passes are token-causal, a denoising pass
  attends the cache and its block both ways, and a block's first token comes from the kept last output of the pass
  that stored the context before it, revealed at the block's first step (``generate`` writes it before its steps; at
  one token per step the tokens are the same); the composite likelihood puts the clean half token-causal and scores
  a block's first token at the clean copy of the position before it
  (:func:`~dlmrl.models.block_attention.causal_sources`). Greedy decoding is token-identical to ``generate``, with
  and without dlmrl's cache, and the trajectory likelihood equals the code's calls replayed step by step (tests,
  ``benchmarks/nemotron_diffusion_parity.py``). It is the default because it is the release's and NVIDIA's RL layout;
  ``sampling.causal_context: false`` (a policy with ``clean_context="block"``) runs ``causal_context=False`` instead:
  the prompt prefilled bidirectionally as one clean block, each finished block cached bidirectionally inside, every
  token from the block's own passes; also token-identical to ``generate``.
- **Block size**: ``config.json``'s ``block_size`` (the configuration class's default 32, :data:`NEMOTRON_BLOCK_SIZE`,
  when absent); ``model.block_size`` overrides it.
- **Mask token**: the tokenizer's mask token, else ``config.json``'s ``mask_token_id``, else id 100
  (:data:`NEMOTRON_MASK_TOKEN_ID`; the configuration class's own default is -1, no token).
- **The same weights as ``model.kind: ar``** (:func:`load_nemotron_causal`): the loaded model's ``forward`` runs under
  an explicit causal mask over the cached and new keys (left padding blocked, positions counted over real tokens) and
  its ``generate`` is ``transformers``' ``GenerationMixin.generate`` (the class's own ``generate`` is the block
  decoder above, with another signature); the weights, parameter names and saved files are unchanged, so a LoRA
  adapter or a fully trained copy saves and loads like the checkpoint. Greedy decoding is token-identical to the code's
  own ``ar_generate`` (tests, parity script); :func:`check_causal` verifies causality on every load.
- **transformers 5**: the release's ``modeling_ministral.py`` calls ``create_causal_mask`` with ``transformers`` 4.5x's
  keywords (``input_embeds=``, ``cache_position=``; the axolotl integration translates them the same way), which
  ``transformers`` 5 renamed and dropped; :func:`patch_mask_keywords` wraps the module's mask functions to translate
  them where the installed signature lacks them.

The code's ``generate`` takes its argmax over the whole vocabulary, so where a model's most likely token is the mask
token it "reveals" the mask token and the position stays masked to the end of the block (with ``causal_context=True``
a block's first token drawn as the mask token is then denoised like the others); dlmrl's sampler never writes it (its
argmax excludes the mask token; the confidence is the full softmax's, as the code's). A trained checkpoint gives the
mask token no mass; on the random parity checkpoint it happens (reported there; its ``causal_context=True``
comparison runs on a copy whose head gives the mask token logit 0). At ``temperature > 0`` the code draws a block's
first token by ``multinomial(softmax(logits / T))`` over the whole vocabulary, dlmrl by its Gumbel-max with the mask
token left out (other random numbers; the same distribution otherwise).

Not covered: ``linear_spec_generate`` (self-speculation); the code's threshold rule
(every masked token above it, else the most confident) is not compared token for token (only the fixed schedule,
``threshold=None``); the Llama-4 query scale is the code's own, computed from absolute cache positions (exactly 1 below
``original_max_position_embeddings``, 16384 in the released configs).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import types
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

#: The mask token when neither the tokenizer nor ``config.json`` names one. Source: the released configs'
#: ``mask_token_id: 100`` (issue 36; the configuration class's default is -1).
NEMOTRON_MASK_TOKEN_ID = 100
#: The block size when ``config.json`` records none. Source: ``block_size=32`` in
#: ``NemotronLabsDiffusionConfig.__init__`` (``configuration_nemotron_labs_diffusion.py``).
NEMOTRON_BLOCK_SIZE = 32
#: The ``config.json`` key that picks the attention (``NemotronLabsDiffusionModel.__init__``).
PARADIGM_KEY = "dlm_paradigm"
#: The values the published code accepts (anything else raises ``ValueError`` in its ``__init__``).
PARADIGMS = ("bidirectional", "block_diff", "autoregressive")
#: The configuration class's default when ``config.json`` has no ``dlm_paradigm``.
DEFAULT_PARADIGM = "bidirectional"
#: Model classes of the family (the release's and NVIDIA's internal one).
MODEL_CLASSES = ("NemotronLabsDiffusionModel", "MinistralDiffEncoderModel")
#: Code files of the family, as ``auto_map`` names them.
CODE_MODULES = ("modeling_nemotron_labs_diffusion", "modeling_ministral_dlm")
#: The attention kernel dlmrl registers with ``transformers``' ``AttentionInterface``.
ATTENTION_NAME = "dlmrl_explicit_mask"

_EXPLICIT_MASK: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("dlmrl_explicit_mask",
                                                                                     default=None)


def _value(config, key: str, default=None):
    return config.get(key, default) if isinstance(config, Mapping) else getattr(config, key, default)


def is_nemotron_diffusion(config) -> bool:
    """Whether ``config`` (``config.json`` as a dict, or a ``PretrainedConfig``) is a Nemotron-Labs-Diffusion
    checkpoint's: ``model_type`` ``nemotron_labs_diffusion``, an architecture in :data:`MODEL_CLASSES`, or an
    ``auto_map`` entry in one of :data:`CODE_MODULES`."""
    model_type = str(_value(config, "model_type", "") or "").lower()
    architectures = list(_value(config, "architectures") or [])
    targets = []
    for value in (_value(config, "auto_map") or {}).values():
        targets.extend(v for v in (value if isinstance(value, list | tuple) else [value]) if isinstance(v, str))
    return (model_type == "nemotron_labs_diffusion" or any(a in MODEL_CLASSES for a in architectures)
            or any(t.split(".")[0] in CODE_MODULES for t in targets))


def checkpoint_paradigm(config) -> str:
    """``config.json``'s ``dlm_paradigm`` (:data:`DEFAULT_PARADIGM` when absent, as the configuration class)."""
    value = _value(config, PARADIGM_KEY, None)
    return DEFAULT_PARADIGM if value is None else value


def paradigm_problem(paradigm, kind: str, where: str = "config.json") -> str | None:
    """Why ``model.kind`` ``kind`` cannot run a checkpoint whose ``where`` declares ``dlm_paradigm = paradigm``, with
    what to set; ``None`` when it can.

    ``block`` / ``diffusion``: ``autoregressive`` is refused (the code builds plain causal attention: NVIDIA's check);
    ``ar``: any known paradigm runs (dlmrl runs the weights causally itself). Unknown values are refused for every kind
    (the code's ``__init__`` raises on them).
    """
    if paradigm not in PARADIGMS:
        return (f"{where} declares {PARADIGM_KEY} {paradigm!r}, which Nemotron-Labs-Diffusion's released code does "
                f"not know (its modeling_ministral_dlm.py accepts {', '.join(map(repr, PARADIGMS))} and raises on "
                f"anything else; dlmrl runs the released paradigms only): set {PARADIGM_KEY} in that file to one of "
                "them")
    if kind in ("block", "diffusion") and paradigm == "autoregressive":
        return (f"{where} declares {PARADIGM_KEY} 'autoregressive': Nemotron-Labs-Diffusion's code then builds plain "
                "causal attention (Ministral3Attention with diffusion_lm False), next-token prediction's, and a "
                "masked-diffusion objective trained on that declaration 'converges on the wrong objective with no "
                f"error' (NVIDIA's RL code refuses it too). If these weights were trained as a diffusion model, set "
                f"{PARADIGM_KEY} to 'bidirectional' in that file (the released 8B's value; 'block_diff' loads the same "
                f"way here); to train them left to right, set model.kind ar")
    return None


def paradigm_note(paradigm, kind: str) -> str | None:
    """What dlmrl does differently from the code's own forward for this paradigm and kind (a warning), or ``None``."""
    if kind in ("block", "diffusion") and paradigm == "block_diff":
        return (f"{PARADIGM_KEY} 'block_diff': the code would build compiled flex attention with its own "
                "[noisy | clean] mask, which takes no block mask and no key/value cache; dlmrl builds the same "
                "weights with the 'bidirectional' attention class and runs its block masks through it")
    if kind == "ar" and paradigm in ("bidirectional", "block_diff"):
        return (f"{PARADIGM_KEY} {paradigm!r}: the code's own forward attends both ways; model.kind ar runs the same "
                "weights under a causal mask (as the code's ar_generate does), the head's output at i predicting "
                "token i + 1")
    return None


def _where(name_or_path: str) -> str:
    path = Path(name_or_path)
    return str(path / "config.json") if path.is_dir() else f"the config.json of {name_or_path}"


def read_config(name_or_path: str) -> dict:
    """``config.json`` as a plain dict, read without running checkpoint code (a hub id is fetched like any config).

    Raises:
        OSError: no ``config.json`` there.
    """
    from transformers import PretrainedConfig

    return PretrainedConfig.get_config_dict(name_or_path)[0]


# ------------------------------------------------------------------------------------------ the attention kernel


def _explicit_mask_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                             is_causal=None, **kwargs):
    """The registered kernel: ``sdpa`` under the explicit mask of the pass (``(B, 1, T, S + T)`` bool, True = attend)
    when one is set, else ``sdpa`` with the code's own arguments.

    Raises:
        ValueError: the explicit mask's shape does not match the pass's queries and keys.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    explicit = _EXPLICIT_MASK.get()
    if explicit is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if explicit.shape[-2] != query.shape[2] or explicit.shape[-1] != key.shape[2]:
        raise ValueError(f"the explicit attention mask is {tuple(explicit.shape)} but the pass has {query.shape[2]} "
                         f"queries over {key.shape[2]} keys")
    kwargs.pop("sliding_window", None)
    return sdpa_attention_forward(module, query, key, value, explicit, dropout=dropout, scaling=scaling,
                                  is_causal=False, **kwargs)


def register_attention() -> None:
    """Register :data:`ATTENTION_NAME` with ``transformers``' ``AttentionInterface`` (and ``sdpa``'s mask builder with
    ``AttentionMaskInterface``, so the code's own ``create_causal_mask`` calls build ``sdpa`` masks); idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, _explicit_mask_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


@contextlib.contextmanager
def explicit_mask(mask4d: torch.Tensor):
    """Within the block, the registered kernel attends under ``mask4d`` ``(B, 1, T, S + T)`` bool."""
    token = _EXPLICIT_MASK.set(mask4d.bool())
    try:
        yield
    finally:
        _EXPLICIT_MASK.reset(token)


def patch_mask_keywords(module) -> bool:
    """Translate ``transformers`` 4.5x's ``create_causal_mask`` keywords (``input_embeds=`` -> ``inputs_embeds=``,
    ``past_key_values=`` -> ``cache=``; ``cache_position=`` dropped) in the checkpoint code's ``module`` when the
    installed function has no such parameters; returns whether anything was patched."""
    import inspect

    patched = False
    for name in ("create_causal_mask", "create_sliding_window_causal_mask"):
        fn = getattr(module, name, None)
        if fn is None or getattr(fn, "_dlmrl_translates", False):
            continue
        params = inspect.signature(fn).parameters
        if "input_embeds" in params and "cache_position" in params:
            continue

        def translated(*args, _fn=fn, _params=params, **kwargs):
            if "input_embeds" in kwargs and "input_embeds" not in _params:
                kwargs["inputs_embeds"] = kwargs.pop("input_embeds")
            if "cache_position" not in _params:
                kwargs.pop("cache_position", None)
            if "past_key_values" in kwargs and "cache" in _params:  # (5.x's name; the old one is deprecated)
                kwargs["cache"] = kwargs.pop("past_key_values")
            return _fn(*args, **kwargs)

        translated._dlmrl_translates = True
        setattr(module, name, translated)
        patched = True
    return patched


def _checkpoint_contexts():
    """``torch.utils.checkpoint``'s ``context_fn``: the recomputation of a checkpointed layer (in the backward pass,
    after :func:`explicit_mask` has exited) runs under the explicit mask its forward ran under."""
    mask = _EXPLICIT_MASK.get()
    return contextlib.nullcontext(), (contextlib.nullcontext() if mask is None else explicit_mask(mask))


def _checkpointing_with_mask(self, activation_checkpointing_kwargs=None, *args, **kwargs):
    """The model's ``activation_checkpointing_enable`` with :func:`_checkpoint_contexts` as ``context_fn``
    (non-reentrant checkpointing, transformers' default)."""
    merged = {"use_reentrant": False, **(activation_checkpointing_kwargs or {})}
    merged.setdefault("context_fn", _checkpoint_contexts)
    return type(self).activation_checkpointing_enable(self, merged, *args, **kwargs)


def _encoder(model: nn.Module) -> nn.Module:
    from dlmrl.models.token_scores import unwrap_model

    inner = unwrap_model(model)
    encoder = getattr(inner, "encoder", None)
    if encoder is None or not hasattr(encoder, "layers"):
        raise TypeError(f"{type(inner).__name__} has no encoder.layers: not Nemotron-Labs-Diffusion's layout")
    return encoder


def adapt_model(model: nn.Module) -> nn.Module:
    """Make the loaded model take dlmrl's explicit masks: the mask-keyword patch on its ``modeling_ministral`` module,
    :data:`ATTENTION_NAME` registered and set on the encoder's config (and every attention module's, where each
    holds its own), and activation checkpointing that recomputes a layer under the mask its forward ran under
    (``context_fn``; without it the backward's recomputation, which runs after the pass's :func:`explicit_mask` has
    exited, attends without the mask: torch's checkpoint refuses it when the recomputation saves other tensors, as
    on the test stand-in, and the gradients would be wrong where it does not notice). Returns ``model``."""
    register_attention()
    encoder = _encoder(model)
    patch_mask_keywords(sys.modules[type(encoder).__module__])
    configs = {id(encoder.config): encoder.config}
    for layer in encoder.layers:
        config = getattr(getattr(layer, "self_attn", None), "config", None)
        if config is not None:
            configs[id(config)] = config
    for config in configs.values():
        config._attn_implementation = ATTENTION_NAME
    from dlmrl.models.token_scores import unwrap_model

    inner = unwrap_model(model)
    if hasattr(type(inner), "activation_checkpointing_enable"):  # (the mask must hold in the backward's recompute)
        # (transformers' deprecated gradient_checkpointing_enable calls self.activation_checkpointing_enable)
        inner.activation_checkpointing_enable = types.MethodType(_checkpointing_with_mask, inner)
    return model


# -------------------------------------------------------------------------------------------------- forwards


def nemotron_block_forward(model, input_ids, mask4d, position_ids, past=None, use_cache=False):
    """:data:`~dlmrl.models.block_attention.BlockForwardFn` for Nemotron-Labs-Diffusion: ``model(input_ids,
    position_ids, past_key_values=<DynamicCache built from past>, use_cache)`` with every attention layer under
    ``mask4d`` (:func:`explicit_mask`).

    Args:
        model: a model :func:`adapt_model` prepared (or a peft / DDP wrapper of one). input_ids: ``(B, T)`` long.
        mask4d: ``(B, 1, T, S + T)`` bool over the ``S`` cached then the ``T`` new positions. position_ids:
            ``(B, T)`` long. past: per layer ``(keys, values)`` of ``S`` positions, or ``None``. use_cache: return the
            key/values of the ``S + T`` positions.
    Returns:
        ``(logits (B, T, V) float32 (float64 for a float64 model), key/values or None)``; position ``i`` predicts
        token ``i``.
    Raises:
        TypeError: if ``use_cache`` and the model returns no cache.
    """
    from dlmrl.models.block_attention import fresh_cache_call

    def call(cache):
        with explicit_mask(mask4d):
            return model(input_ids=input_ids, position_ids=position_ids, past_key_values=cache, use_cache=use_cache)

    return fresh_cache_call(model, past, use_cache, call)


def nemotron_logits(model, input_ids, attention_mask, position_ids):
    """Full-diffusion logits (``model.kind: diffusion``): every real token attends every real token; ``(B, T, V)``."""
    from dlmrl.models.block_attention import full_attention_logits

    return full_attention_logits(nemotron_block_forward, model, input_ids, attention_mask, position_ids)


def _probe_ids(model: nn.Module, length: int = 6) -> torch.Tensor:
    vocab = int(getattr(_encoder(model).config, "vocab_size", 2) or 2)
    gen = torch.Generator().manual_seed(0)
    device = next(model.parameters()).device
    return torch.randint(0, vocab, (1, length), generator=gen).to(device)


@torch.no_grad()
def check_explicit_mask(model: nn.Module, label: str = "the checkpoint") -> None:
    """Verify that the model's attention follows dlmrl's explicit mask: with the last key blocked for every other
    query, changing its token leaves the other positions' logits unchanged (bitwise); with it allowed, they change.

    Raises:
        ValueError: naming ``label`` when either fails (the code routes attention past the registered kernel).
    """
    ids = _probe_ids(model)
    t = ids.shape[1]
    other = ids.clone()
    other[0, -1] = (ids[0, -1] + 1) % int(_encoder(model).config.vocab_size)
    pos = torch.arange(t, device=ids.device)[None]
    full = torch.ones(1, 1, t, t, dtype=torch.bool, device=ids.device)
    blocked = full.clone()
    blocked[..., :-1, -1] = False
    was = model.training
    model.eval()
    try:
        a = nemotron_block_forward(model, ids, blocked, pos)[0][:, :-1]
        b = nemotron_block_forward(model, other, blocked, pos)[0][:, :-1]
        c = nemotron_block_forward(model, other, full, pos)[0][:, :-1]
    finally:
        model.train(was)
    if not torch.equal(a, b) or torch.equal(b, c):
        raise ValueError(f"{label}: its attention does not follow an explicit mask (a blocked key changed the logits, "
                         "or an allowed one did not): the code routes attention past transformers' attention "
                         f"interface ({type(_encoder(model).layers[0].self_attn).__name__}), so dlmrl cannot run it "
                         "block-causally; load it with dlm_paradigm 'bidirectional' code (NemotronLabsDiffusionModel)")


# ------------------------------------------------------------------------------------------------ loading


def _read_paradigm(path: str) -> tuple[dict, str]:
    config = read_config(path)
    return config, checkpoint_paradigm(config)


def _load(path: str, trust_remote_code: bool, dtype: torch.dtype, kind: str) -> nn.Module:
    from dlmrl.models.compat import load_checkpoint_model

    _, paradigm = _read_paradigm(path)
    problem = paradigm_problem(paradigm, kind, _where(path))
    if problem:
        raise ValueError(f"model.kind {'block or diffusion' if kind == 'block' else kind}: {problem}")
    overrides = {PARADIGM_KEY: "bidirectional"} if paradigm == "block_diff" else None
    model = load_checkpoint_model(path, trust_remote_code, dtype, "AutoModel", config_overrides=overrides)
    if overrides:
        setattr(model.config, PARADIGM_KEY, paradigm)  # (the attention is built; a saved config keeps its value)
    return adapt_model(model)


def load_nemotron_diffusion(path: str, trust_remote_code: bool, dtype: torch.dtype) -> nn.Module:
    """The family's ``load`` (``model.kind: block`` and ``diffusion``): ``AutoModel`` from the checkpoint's own code
    with :mod:`dlmrl.models.compat`'s patches, ``block_diff`` built with the ``bidirectional`` class,
    :func:`adapt_model`,
    then :func:`check_explicit_mask`.

    Raises:
        ValueError: a ``dlm_paradigm`` the diffusion kinds cannot run (:func:`paradigm_problem`, naming the key and the
            file), or attention that does not follow dlmrl's mask.
        CheckpointCodeError: the code fails in a way no patch covers.
    """
    model = _load(path, trust_remote_code, dtype, "block")
    check_explicit_mask(model, path)
    return model


def _causal_mask(attention_mask: torch.Tensor | None, batch: int, new: int, past: int,
                 device: torch.device) -> torch.Tensor:
    """``(B, 1, T, S + T)`` bool: query ``S + i`` attends real keys ``<= S + i`` (and itself, so no row is empty)."""
    total = past + new
    real = (torch.ones(batch, total, dtype=torch.bool, device=device) if attention_mask is None
            else attention_mask.bool()[:, -total:])
    q = past + torch.arange(new, device=device)
    k = torch.arange(total, device=device)
    allowed = (k[None, :] <= q[:, None])[None] & real[:, None, :]  # (B, T, S + T)
    allowed = allowed | (k[None, :] == q[:, None])[None]
    return allowed[:, None]


def _causal_forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                    use_cache=None, **kwargs):
    """The AR kind's forward of a Nemotron-Labs-Diffusion model: the class's own forward under an explicit causal mask
    (:func:`_causal_mask`); positions counted over real tokens when not given; the cache as ``past_key_values`` or
    (``transformers`` 5's ``generate``) ``cache``. Returns ``CausalLMOutputWithPast`` (``logits`` at ``i`` predicting
    token ``i + 1``, the cache as ``cache``)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    from dlmrl.models.policy import position_ids_from_mask

    if past_key_values is None:  # (transformers 5's generate passes the cache as ``cache``)
        past_key_values = kwargs.get("cache")
    b, t = input_ids.shape
    past = past_key_values.get_seq_length() if past_key_values is not None else 0
    mask = _causal_mask(attention_mask, b, t, past, input_ids.device)
    if position_ids is None:
        full = (torch.ones(b, past + t, dtype=torch.bool, device=input_ids.device) if attention_mask is None
                else attention_mask.bool()[:, -(past + t):])
        position_ids = position_ids_from_mask(full)[:, -t:]
    with explicit_mask(mask):
        out = type(self).forward(self, input_ids=input_ids, position_ids=position_ids,
                                 past_key_values=past_key_values, use_cache=bool(use_cache))
    return CausalLMOutputWithPast(logits=out.logits, cache=getattr(out, "past_key_values", None))


@torch.no_grad()
def check_causal(model: nn.Module, label: str = "the checkpoint") -> None:
    """Verify the AR kind's forward is causal: changing the last token leaves every earlier position's logits unchanged
    (bitwise), and the first position's logits differ from a bidirectional pass's.

    Raises:
        ValueError: naming ``label`` when the forward sees later tokens.
    """
    ids = _probe_ids(model)
    other = ids.clone()
    other[0, -1] = (ids[0, -1] + 1) % int(_encoder(model).config.vocab_size)
    was = model.training
    model.eval()
    try:
        a, b = model(input_ids=ids).logits[:, :-1], model(input_ids=other).logits[:, :-1]
    finally:
        model.train(was)
    if not torch.equal(a, b):
        raise ValueError(f"{label}: model.kind ar's forward of this Nemotron-Labs-Diffusion checkpoint sees later "
                         "tokens (its attention does not follow dlmrl's causal mask); it cannot be trained left to "
                         "right here")


def make_causal(model: nn.Module) -> nn.Module:
    """Give a loaded (and :func:`adapt_model`-ed) model the AR kind's forward (:func:`_causal_forward`) and
    ``transformers``' ``generate``, on this instance only (the class, its weights and its saved files are unchanged;
    the class's own block ``generate`` stays reachable as ``type(model).generate``). Returns ``model``."""
    from transformers.generation import GenerationMixin

    model.forward = types.MethodType(_causal_forward, model)
    model.generate = types.MethodType(GenerationMixin.generate, model)
    return model


def load_nemotron_causal(path: str, trust_remote_code: bool, dtype: torch.dtype) -> nn.Module:
    """The same weights as ``model.kind: ar`` (:func:`make_causal` on the family's load), causality checked
    (:func:`check_causal`).

    Raises:
        ValueError: an unknown ``dlm_paradigm`` (naming the key and the file), or a forward that is not causal.
        CheckpointCodeError: the code fails in a way no patch covers.
    """
    model = make_causal(_load(path, trust_remote_code, dtype, "ar"))
    check_causal(model, path)
    return model


def nemotron_config(name_or_path: str) -> dict | None:
    """``config.json`` of ``name_or_path`` when it is a Nemotron-Labs-Diffusion checkpoint, else ``None`` (unreadable
    configs included)."""
    try:
        config = read_config(name_or_path)
    except (OSError, ValueError):
        return None
    return config if is_nemotron_diffusion(config) else None


__all__ = [
    "ATTENTION_NAME",
    "DEFAULT_PARADIGM",
    "NEMOTRON_BLOCK_SIZE",
    "NEMOTRON_MASK_TOKEN_ID",
    "PARADIGMS",
    "PARADIGM_KEY",
    "adapt_model",
    "check_causal",
    "check_explicit_mask",
    "checkpoint_paradigm",
    "explicit_mask",
    "is_nemotron_diffusion",
    "load_nemotron_causal",
    "load_nemotron_diffusion",
    "make_causal",
    "nemotron_block_forward",
    "nemotron_config",
    "nemotron_logits",
    "paradigm_note",
    "paradigm_problem",
    "patch_mask_keywords",
    "read_config",
    "register_attention",
]
