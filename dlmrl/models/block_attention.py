"""Block-causal attention for block-diffusion policies: block ids, the two attention layouts, and the forward pass.

A completion of length ``L`` is cut into blocks of ``block_size`` tokens (written ``B`` in the papers and the
config docs; in code ``B`` is the batch letter, so the block size is always spelled ``block_size``). The block index
``β`` of a position:

- prompt positions are block 0 (always clean, attended by every real query; the real prompt tokens attend each
  other bidirectionally), or, with ``prompt_blocks=True`` (the SDAR/TraDo families), the prompt is cut into blocks
  counted back from its end, numbered ``0, -1, -2, ...`` and attended block-causally among themselves
  (:func:`prompt_block_ids`);
- completion position ``i`` (0-based) is block ``1 + i // block_size``; the last block is shorter when
  ``block_size`` does not divide ``L``;
- left padding of the prompt is attended by nobody; a padding *query* attends only itself, so no attention row is
  empty (an all-False row makes scaled-dot-product attention return NaN) and its output, never used, stays finite.

Two layouts (``True`` = query may attend key):

- :func:`block_causal_mask` over ``[prompt | y]``: ``β(j) <= β(i)``, bidirectional inside a block. ``block_size = L``
  is today's full-attention diffusion over the completion with one difference: the prompt does not attend the
  completion (in a bidirectional LLaDA-style model it does, which is why its prompt cache is approximate); without a
  prompt the two are the same model (tested). ``block_size = 1`` makes each completion position a block of its own
  (an autoregressive factorisation in the same model).
- :func:`composite_mask` over ``[prompt | ỹ (noisy, L) | y (clean, L)]``, both halves at the same positions: noisy
  ``i`` attends noisy ``j`` iff ``β(j) = β(i)`` and clean ``j`` iff ``β(j) < β(i)``; clean ``i`` attends clean
  ``j`` iff ``β(j) <= β(i)`` and never a noisy one; every real query attends the real prompt; the prompt attends
  only the prompt. The noisy half's logits are then every block's denoiser output given the clean blocks before it,
  in one pass (BD3-LM's vectorised training).

Layouts of the published checkpoints (read for this module; none of their code is used):

- BD3-LM (arXiv 2503.09573; kuleshov-group/bd3lms ``models/dit.py``: ``block_diff_mask``): input ``[x_t | x_0]``
  (noisy first), the same three sub-masks as :func:`composite_mask` (block diagonal, offset block-causal,
  block-causal); no prompt (unconditional), blocks aligned to position 0, rotary positions shared by both halves, no
  logit shift; the sampler attends a key/value cache with no mask at all.
- SDAR / TraDo (arXiv 2510.06303, 2509.06949; JetAstra/SDAR ``generate.py``; Gen-Verse/dLLM-RL
  ``train/rl_sdar.py``: ``make_basic_block_attention``, ``process_pad``): the *prompt is chunked into blocks too*.
  SDAR's sampler aligns blocks to absolute position 0, so the block holding the prompt's tail is completed by the
  first generated tokens; TraceRL's training mask aligns completion blocks to the completion's start and chunks the
  prompt block-causally from its end. Its composite input puts the clean half first, ``[prompt | y | ỹ]``; padding
  keys are dropped and padding queries attend themselves (as here); log-probs at T = 1 over the whole vocabulary;
  no logit shift.
- Fast-dLLM v2 (arXiv 2509.26328; the ``Fast_dLLM_QwenForCausalLM`` checkpoint code, read from a public copy,
  Satgoy152/DualDiffusion ``FastDLLM_inferencing/Fast_dLLM_v2_7B/modeling.py``): BD3-LM's mask over
  ``[x_t | x_0]`` of the *whole* sequence (prompt included, never noised), blocks aligned to position 0, and a
  **token shift**: position ``i`` is predicted by the output at ``i − 1`` (an AR model's head kept), so a block's
  first token comes from the previous block's last clean position.
- Nemotron-Labs-Diffusion (``modeling_nemotron_labs_diffusion.py`` of the release: ``generate(causal_context=True)``,
  ``block_diff_mask``): the prompt and the clean blocks attended *token-causally* (an AR model's attention; the
  training mask's ``fully_causal`` clean half), a noisy block attending them and itself both ways, its logits
  unshifted except its first token, which the AR head predicts from the position before it
  (``clean_context="causal"``: :func:`composite_mask`, :func:`causal_sources`; :mod:`dlmrl.models.nemotron_diffusion`).

This module implements the dlmrl layout above (prompt = one clean block 0, completion blocks aligned to the
completion's start, no shift) for the ``tiny`` family; a checkpoint family with another layout needs its own ids and
a parity script against its forward (dlmrl interpretation of how the layouts map). A family whose outputs are shifted
by one (Fast-dLLM v2, ``logit_shift = 1``) reads each position's logits at :func:`shifted_sources`: the position
before it, and for a block's first token the previous block's last *clean* position, as that family's sampler does
(its SFT loss reads the noisy one; :mod:`dlmrl.models.fast_dllm_v2`).

The mask reaches a ``transformers`` model as a 4-D ``attention_mask``: ``masking_utils`` returns a 4-D mask as it is
(``_preprocess_mask_arguments``: "If the mask is already 4D, simply return as-is"), whatever ``config.is_causal`` says,
and SDPA then runs with ``is_causal=False``; a boolean mask is right for SDPA, but the eager kernel *adds* the mask to
the scores, so it gets an additive float mask (:func:`model_attention_mask`).

Reference: BD3-LM arXiv 2503.09573 §3 (block-causal and vectorised training masks); SDAR arXiv 2510.06303.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlmrl.models.policy import position_ids_from_mask

#: per layer, ``(keys, values)`` each ``(B, H, S, D)`` (the layout of :mod:`dlmrl.models.block_cache`)
KeyValues = list[tuple[torch.Tensor, torch.Tensor]]

#: ``(model, input_ids (B, T) long, mask4d (B, 1, T, S + T) bool, position_ids (B, T) long, past KeyValues | None,
#: use_cache bool) -> (logits (B, T, V), KeyValues of the S + T positions, past first, or None without use_cache)``
BlockForwardFn = Callable[..., "tuple[torch.Tensor, KeyValues | None]"]


def check_block_size(length: int, block_size: int) -> int:
    """The number of completion blocks, ``n_blocks = ⌈length / block_size⌉`` (``K`` in the papers; in dlmrl ``K`` counts
    Monte Carlo samples).

    Raises:
        ValueError: if ``length < 1`` or ``block_size < 1`` (or either is not an ``int``).
    """
    for name, value in (("completion length", length), ("block_size", block_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return -(-length // block_size)


def block_bounds(length: int, block_size: int) -> list[tuple[int, int]]:
    """``[(lo, hi), ...]``: the completion positions ``[lo, hi)`` of each block, left to right (the last may be
    shorter)."""
    check_block_size(length, block_size)
    return [(lo, min(lo + block_size, length)) for lo in range(0, length, block_size)]


def completion_block_ids(length: int, block_size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``(L,)`` long: ``β(i) = 1 + i // block_size`` of each completion position (block 0 is the prompt)."""
    check_block_size(length, block_size)
    return 1 + torch.arange(length, device=device) // block_size


#: block index of prompt padding (attended by nobody); below every real block index
PAD_BLOCK = -(2**62)


def prompt_block_ids(prompt_mask: torch.Tensor, block_size: int, prompt_blocks: bool = False) -> torch.Tensor:
    """``(B, P)`` long block index of the prompt positions: :data:`PAD_BLOCK` on left padding; on real tokens ``0``
    (``prompt_blocks=False``: the prompt is one clean block) or, with ``prompt_blocks=True``, the prompt cut into
    blocks of ``block_size`` counted back from its end, ``0, -1, -2, ...`` (the last ``block_size`` real tokens are
    block 0, the ones before block ``-1``; the first may be shorter).

    ``prompt_blocks=True`` is the layout of TraceRL's training mask (Gen-Verse/dLLM-RL ``train/rl_sdar.py``,
    ``make_basic_block_attention``: prompt rows attend the prompt up to the end of their own block, blocks counted
    from the prompt's end). When the real prompt length is a multiple of ``block_size`` it is also the layout of
    SDAR's own sampler (JetAstra/SDAR ``generate.py``, blocks aligned to position 0, full prompt blocks prefilled
    block-causally); for other lengths SDAR's sampler puts the prompt's tail in one block with the first generated
    tokens, which dlmrl does not reproduce (dlmrl interpretation: the completion's blocks start at the completion).

    Raises:
        ValueError: on ``block_size`` below 1.
    """
    check_block_size(1, block_size)
    pm = prompt_mask.bool()
    if not prompt_blocks:
        return torch.where(pm, 0, PAD_BLOCK)
    p = pm.shape[1]
    after = (p - 1 - torch.arange(p, device=pm.device)).expand_as(pm)  # (B, P): tokens after this one (left padding)
    return torch.where(pm, -(after // block_size), PAD_BLOCK)


def block_ids(prompt_mask: torch.Tensor, length: int, block_size: int, prompt_blocks: bool = False) -> torch.Tensor:
    """``(B, P + L)`` long block index of every position of ``[prompt | completion]``: the prompt's from
    :func:`prompt_block_ids` (``0`` on a whole prompt, ``<= 0`` on a prompt cut into blocks, :data:`PAD_BLOCK` on
    padding), ``1 + i // block_size`` on completion position ``i``.

    Args:
        prompt_mask: ``(B, P)`` bool, True on real prompt tokens (left padding False).
        length: completion length ``L``. block_size: tokens per block.
        prompt_blocks: cut the prompt into blocks too (:func:`prompt_block_ids`).
    """
    pm = prompt_mask.bool()
    comp = completion_block_ids(length, block_size, pm.device).expand(pm.shape[0], length)  # (B, L)
    return torch.cat([prompt_block_ids(pm, block_size, prompt_blocks), comp], dim=1)


def shifted_sources(prompt_mask: torch.Tensor, length: int, block_size: int, composite: bool = False) -> torch.Tensor:
    """``(B, L)`` long: for each completion position ``i``, the input position whose output predicts token ``i`` under a
    one-position logit shift (a family whose outputs sit one position before the token they predict, ``logit_shift =
    1``: Fast-dLLM v2, :mod:`dlmrl.models.fast_dllm_v2`).

    Over ``[prompt (P) | canvas (L)]`` (``composite=False``): ``P + i − 1``. Over the composite input ``[prompt |
    noisy (L) | clean (L)]``: ``P + i − 1`` (the noisy half) inside a block, and for the first position of block
    ``b > 1`` the *clean* copy of block ``b − 1``'s last position, ``P + L + i − 1``: the output that predicts a block's
    first token is the previous block's last one, which the sampler computes on the finished (clean) block (dlmrl
    interpretation of the sampler's layout; see :mod:`dlmrl.models.fast_dllm_v2`). Completion position 0 is predicted
    by the prompt's last position ``P − 1`` when it holds a real token (prompts are left-padded, so it does unless a
    row has no prompt), else by its own output (``P``), as :func:`dlmrl.models.families.shift_logits_right` keeps a
    row's first position.

    Args:
        prompt_mask: ``(B, P)`` bool, True on real tokens. length: ``L``. block_size: tokens per block.
        composite: the composite layout, else ``[prompt | canvas]``.
    Raises:
        ValueError: on ``length`` or ``block_size`` below 1.
    """
    check_block_size(length, block_size)
    pm = prompt_mask.bool()
    batch, p = pm.shape
    i = torch.arange(length, device=pm.device)
    src = p + i - 1  # (L,)
    if composite:
        src = torch.where((i % block_size == 0) & (i > 0), p + length + i - 1, src)
    src = src.expand(batch, length).clone()  # (B, L)
    prompt_last = pm[:, -1] if p > 0 else torch.zeros(batch, dtype=torch.bool, device=pm.device)  # (B,)
    src[:, 0] = torch.where(prompt_last, p - 1, p)
    return src


def gather_positions(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``logits[b, index[b, i]]``: ``(B, T, V)`` and ``(B, L)`` long -> ``(B, L, V)``."""
    rows = torch.arange(logits.shape[0], device=logits.device)[:, None]
    return logits[rows, index.to(logits.device)]


def check_logit_shift(logit_shift: int) -> int:
    """``logit_shift`` if it is 0 or 1 (the shifts block-diffusion families have), else ``ValueError``."""
    if isinstance(logit_shift, bool) or logit_shift not in (0, 1):
        raise ValueError(f"logit_shift must be 0 or 1 for a block-diffusion policy, got {logit_shift!r}")
    return logit_shift


#: How a block-diffusion policy attends its clean context (the prompt and the finished blocks): ``"block"`` (dlmrl's
#: default: the prompt one block, or its blocks, and each finished block bidirectional inside) or ``"causal"`` (token
#: by token, as an autoregressive model; a block's first token then comes from the previous position's output:
#: Nemotron-Labs-Diffusion's ``generate(causal_context=True)``, :mod:`dlmrl.models.nemotron_diffusion`).
CLEAN_CONTEXTS = ("block", "causal")


def check_clean_context(clean_context: str) -> str:
    """``clean_context`` if it is one of :data:`CLEAN_CONTEXTS`, else ``ValueError``."""
    if clean_context not in CLEAN_CONTEXTS:
        raise ValueError(f"clean_context must be one of {CLEAN_CONTEXTS}, got {clean_context!r}")
    return clean_context


def causal_sources(prompt_mask: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """``(B, L)`` long: for each completion position ``i``, the position of the composite input ``[prompt (P) | noisy
    (L) | clean (L)]`` whose output predicts token ``i`` under ``clean_context="causal"``: a block's first token
    (``i % block_size == 0``) is predicted by the output one position before it on the token-causal clean context (the
    previous block's last *clean* position ``P + L + i − 1``, for ``i = 0`` the prompt's last ``P − 1``, or position
    ``P`` itself when a row has no prompt token there: :func:`shifted_sources`); every other position by its own noisy
    output ``P + i`` (no shift). Nemotron-Labs-Diffusion's ``generate(causal_context=True)`` writes a block's first
    token from the last logits of the causal pass that cached the prompt or the previous block, and reads the others'
    logits unshifted from the block's passes.

    Raises:
        ValueError: on ``length`` or ``block_size`` below 1.
    """
    shifted = shifted_sources(prompt_mask, length, block_size, composite=True)  # (B, L)
    i = torch.arange(length, device=shifted.device)
    return torch.where(i % block_size == 0, shifted, prompt_mask.shape[1] + i)


def causal_prompt_mask(prompt_mask: torch.Tensor) -> torch.Tensor:
    """``(B, 1, P, P)`` bool: real prompt query ``i`` attends real prompt keys ``j <= i``; a padding query attends only
    itself (the prompt pass of ``clean_context="causal"``)."""
    pm = prompt_mask.bool()
    p = pm.shape[1]
    causal = torch.ones(p, p, dtype=torch.bool, device=pm.device).tril()
    return _with_self(causal[None] & pm[:, None, :] & pm[:, :, None])[:, None]


def _with_self(allowed: torch.Tensor) -> torch.Tensor:
    """``allowed (B, T, T)`` with the diagonal set: every query attends at least itself (no empty row)."""
    eye = torch.eye(allowed.shape[-1], dtype=torch.bool, device=allowed.device)
    return allowed | eye


def block_causal_mask(prompt_mask: torch.Tensor, length: int, block_size: int,
                      prompt_blocks: bool = False) -> torch.Tensor:
    """The block-causal mask of ``[prompt | completion]``: query ``i`` may attend key ``j`` iff ``j`` is real and
    ``β(j) <= β(i)`` (padding queries attend themselves only).

    Args:
        prompt_mask: ``(B, P)`` bool. length: ``L``. block_size: tokens per block.
        prompt_blocks: the prompt cut into blocks too (:func:`prompt_block_ids`), else one block.
    Returns:
        ``(B, 1, P + L, P + L)`` bool, True = may attend.
    Raises:
        ValueError: on ``length`` or ``block_size`` below 1.
    Reference: BD3-LM arXiv 2503.09573 §3.1 (block-causal attention); SDAR arXiv 2510.06303.
    """
    beta = block_ids(prompt_mask, length, block_size, prompt_blocks)  # (B, T)
    real_key = beta[:, None, :] != PAD_BLOCK  # (B, 1, T)
    allowed = real_key & (beta[:, None, :] <= beta[:, :, None])  # (B, T, T)
    return _with_self(allowed)[:, None]


def composite_mask(prompt_mask: torch.Tensor, length: int, block_size: int,
                   prompt_blocks: bool = False, clean_context: str = "block") -> torch.Tensor:
    """The mask of the composite input ``[prompt (P) | noisy ỹ (L) | clean y (L)]`` (see the module docstring).

    Args:
        prompt_mask: ``(B, P)`` bool. length: ``L``. block_size: tokens per block.
        prompt_blocks: the prompt cut into blocks (:func:`prompt_block_ids`): a prompt query attends the prompt keys
            of its own and earlier prompt blocks; every completion query still attends the whole real prompt.
        clean_context: ``"block"`` (default) as above; ``"causal"`` (:data:`CLEAN_CONTEXTS`): the prompt and the clean
            half attend token-causally (a real prompt query attends the real prompt keys up to itself, clean ``i``
            the real prompt and clean ``j <= i``), the noisy half as above: Nemotron-Labs-Diffusion's
            ``causal_context`` layout (:func:`causal_sources`).
    Returns:
        ``(B, 1, P + 2L, P + 2L)`` bool, True = may attend.
    Raises:
        ValueError: on ``length`` or ``block_size`` below 1.
    Reference: BD3-LM arXiv 2503.09573 §3.2 (vectorised training: block-diagonal, offset block-causal and
    block-causal masks; kuleshov-group/bd3lms ``models/dit.py``, ``block_diff_mask``), with a prompt block added
    (dlmrl interpretation).
    """
    pm = prompt_mask.bool()
    batch, p = pm.shape
    comp = completion_block_ids(length, block_size, pm.device)  # (L,)
    beta = torch.cat([prompt_block_ids(pm, block_size, prompt_blocks), comp.expand(batch, length),
                      comp.expand(batch, length)], dim=1)
    part = torch.cat([torch.zeros(p, dtype=torch.long), torch.ones(length, dtype=torch.long),
                      torch.full((length,), 2, dtype=torch.long)]).to(pm.device)  # (T,): 0 prompt, 1 noisy, 2 clean
    bq, bk = beta[:, :, None], beta[:, None, :]  # (B, T, 1), (B, 1, T)
    q_part, k_part = part[None, :, None], part[None, None, :]
    prompt_key = (k_part == 0) & (bk != PAD_BLOCK) & (bk <= bq)  # real prompt keys of this or an earlier block
    noisy_q, clean_q, real_q = q_part == 1, q_part == 2, bq != PAD_BLOCK
    if check_clean_context(clean_context) == "causal":  # (token-causal prompt and clean half; the noisy half as is)
        idx = torch.arange(part.shape[0], device=pm.device)
        causal = (idx[None, :] <= idx[:, None])[None]  # (1, T, T): key index <= query index
        prompt_key = (k_part == 0) & (bk != PAD_BLOCK) & ((q_part != 0) | causal)
        clean_block = clean_q & (k_part == 2) & causal
    else:
        clean_block = clean_q & (k_part == 2) & (bk <= bq)
    allowed = (real_q & prompt_key) \
        | (noisy_q & (k_part == 1) & (bk == bq)) \
        | (noisy_q & (k_part == 2) & (bk < bq)) \
        | clean_block  # (B, T, T)
    return _with_self(allowed)[:, None]


def block_position_ids(prompt_mask: torch.Tensor, length: int) -> torch.Tensor:
    """``(B, P + L)`` long positions of ``[prompt | completion]``, counted over real tokens (padding clamped to 0), as
    :class:`~dlmrl.models.policy.MaskedDiffusionPolicy` counts them."""
    pm = prompt_mask.bool()
    return position_ids_from_mask(torch.cat([pm, pm.new_ones(pm.shape[0], length)], dim=1))


def composite_position_ids(prompt_mask: torch.Tensor, length: int) -> torch.Tensor:
    """``(B, P + 2L)`` long positions of ``[prompt | noisy | clean]``: both halves carry the completion's positions."""
    pos = block_position_ids(prompt_mask, length)  # (B, P + L)
    return torch.cat([pos, pos[:, prompt_mask.shape[1]:]], dim=1)


def model_attention_mask(model: torch.nn.Module, mask4d: torch.Tensor) -> torch.Tensor:
    """The 4-D mask in the form the model's attention kernel honours exactly.

    ``sdpa``: the boolean mask itself (``scaled_dot_product_attention`` reads True = attend). ``eager``: an additive
    float mask in the model's dtype (0 where allowed, the dtype's most negative finite value elsewhere), because the
    eager kernel adds ``attention_mask`` to the scores (a boolean would add 0/1).

    Args:
        model: a ``transformers`` model (or a peft wrapper of one) with ``config._attn_implementation``.
        mask4d: ``(B, 1, T, S + T)`` bool (queries, then cached and new keys).
    Raises:
        ValueError: for an attention implementation that cannot take an arbitrary dense mask (flash attention,
            flex attention: not supported here).
    """
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model  # (DDP: no config)
    impl = getattr(getattr(inner, "config", None), "_attn_implementation", "sdpa") or "sdpa"
    if impl == "sdpa":
        return mask4d
    if impl == "eager":
        dtype = next(model.parameters()).dtype
        return torch.zeros(mask4d.shape, dtype=dtype, device=mask4d.device).masked_fill(
            ~mask4d, torch.finfo(dtype).min)
    raise ValueError(f"block attention needs an attention implementation that takes a dense 4-D mask ('sdpa' or "
                     f"'eager'); the model uses {impl!r}")


def hf_block_forward(model, input_ids, mask4d, position_ids, past=None, use_cache=False):
    """:data:`BlockForwardFn` for ``transformers`` decoder classes (Llama, Qwen2, ...; the ``tiny`` family).

    ``past`` (keys stored after the rotary embedding) goes in as a fresh ``DynamicCache`` built from the tensors,
    which the pass extends by concatenation, so the caller's ``past`` is never changed (a denoising step leaves the
    cache as it was; keeping the returned key/values is how a finished block extends it).

    Args:
        model: the model. input_ids: ``(B, T)`` long. mask4d: ``(B, 1, T, S + T)`` bool over the ``S`` cached then
            the ``T`` new positions. position_ids: ``(B, T)`` long. past: :data:`KeyValues` of ``S`` positions or
            ``None``. use_cache: return the key/values of the ``S + T`` positions.
    Returns:
        ``(logits (B, T, V), KeyValues | None)``; logits float32 (float64 for a float64 model), position ``i``
        predicts token ``i``.
    Raises:
        TypeError: if ``use_cache`` and the model returns no cache.
    """
    from transformers import DynamicCache

    from dlmrl.models.block_cache import _cache_keyword

    kwargs = {}
    if past is not None:
        kwargs[_cache_keyword(model)] = DynamicCache(ddp_cache_data=past)
    out = model(input_ids=input_ids, attention_mask=model_attention_mask(model, mask4d), position_ids=position_ids,
                use_cache=use_cache or past is not None, **kwargs)
    logits = out.logits if out.logits.dtype == torch.float64 else out.logits.float()
    if not use_cache:
        return logits, None
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    if cache is None or not hasattr(cache, "layers"):
        raise TypeError(f"{type(model).__name__}.forward returned no key/value cache")
    return logits, [(layer.keys, layer.values) for layer in cache.layers]


def bool_mask_block_forward(model, input_ids, mask4d, position_ids, past=None, use_cache=False,
                            cache_kwargs: dict | None = None):
    """:data:`BlockForwardFn` for checkpoint code that takes the boolean 4-D mask itself, as its own samplers pass it
    (SDAR's ``generate.py``; LLaDA2's code turns a boolean mask into its additive form): ``attention_mask`` the
    ``(B, 1, T, S + T)`` bool mask, explicit ``position_ids``, and a ``DynamicCache`` built afresh from ``past`` on
    every call (so a denoising step never changes the caller's cache).

    Args:
        model, input_ids, mask4d, position_ids, past, use_cache: as :func:`hf_block_forward`.
        cache_kwargs: extra keywords for a pass that uses a cache (SDAR: ``store_kv=True``).
    Returns:
        ``(logits (B, T, V) float32 (float64 for a float64 model), KeyValues of the S + T positions or None)``.
    Raises:
        TypeError: if ``use_cache`` and the model returns no cache.
    """
    from dlmrl.models.block_cache import _cache_keyword

    def call(cache):
        kwargs = {} if cache is None else {_cache_keyword(model): cache, "use_cache": True, **(cache_kwargs or {})}
        return model(input_ids=input_ids, attention_mask=mask4d.bool(), position_ids=position_ids, **kwargs)

    return fresh_cache_call(model, past, use_cache, call)


def fresh_cache_call(model, past, use_cache: bool, call):
    """One forward through ``call(cache)`` with a ``DynamicCache`` built afresh from ``past`` (``None``: an empty one
    when ``use_cache``, else no cache), so a denoising step never changes the caller's cache: the tail every
    :data:`BlockForwardFn` on checkpoint code shares.

    Returns:
        ``(logits (B, T, V) float32 (float64 for a float64 model), KeyValues of the S + T positions or None)``.
    Raises:
        TypeError: if ``use_cache`` and the model returns no cache.
    """
    from transformers import DynamicCache

    cache = DynamicCache(ddp_cache_data=past) if past is not None else (DynamicCache() if use_cache else None)
    out = call(cache)
    logits = out.logits if out.logits.dtype == torch.float64 else out.logits.float()
    if not use_cache:
        return logits, None
    kept = getattr(out, "past_key_values", None) or cache
    if kept is None or not hasattr(kept, "layers"):
        raise TypeError(f"{type(model).__name__}.forward returned no key/value cache")
    return logits, [(layer.keys, layer.values) for layer in kept.layers]


def full_attention_logits(block_forward: BlockForwardFn, model, input_ids, attention_mask, position_ids):
    """Full-diffusion logits (``model.kind: diffusion``) of a block-diffusion checkpoint: one pass of
    ``block_forward`` in which every real token attends every real token (block size = the whole sequence), left
    padding blocked as keys; ``(B, T, V)``, no shift."""
    b, t = input_ids.shape
    keys = attention_mask.bool()[:, None, None, :].expand(b, 1, t, t)
    keys = keys | torch.eye(t, dtype=torch.bool, device=input_ids.device)  # (no empty row for a padding query)
    return block_forward(model, input_ids, keys, position_ids)[0]


def block_logits(model, input_ids: torch.Tensor, mask4d: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Logits of one pass under an explicit 4-D mask and explicit positions (no cache): ``(B, T, V)`` float32.

    Args:
        model: a ``transformers`` decoder (the ``tiny`` family). input_ids: ``(B, T)`` long.
        mask4d: ``(B, 1, T, T)`` bool (:func:`block_causal_mask`, :func:`composite_mask`).
        position_ids: ``(B, T)`` long (:func:`block_position_ids`, :func:`composite_position_ids`).
    """
    return hf_block_forward(model, input_ids, mask4d, position_ids)[0]


class BlockCausalPolicy:
    """A masked-diffusion policy run block-causally: ``(input_ids (B, P + L), attention_mask) -> (B, P + L, V)``.

    The uncached reference of block diffusion as an ordinary policy: the first ``P = T − L`` positions are the
    prompt (``attention_mask`` marks its padding), the last ``length`` the completion, attended with
    :func:`block_causal_mask`. Any code that takes a policy (``generate``, ``score``, the ``trajectory`` estimator)
    then runs block-causally, one full pass per call.

    Args:
        policy: a :class:`~dlmrl.models.policy.MaskedDiffusionPolicy` of the ``tiny`` family (``model``,
            ``mask_token_id``).
        length: completion length ``L``. block_size: tokens per block.
        prompt_blocks: the prompt cut into blocks too (:func:`prompt_block_ids`).
    Raises:
        ValueError (on call): when the input is shorter than ``length`` or the completion holds padding.
    """

    def __init__(self, policy, length: int, block_size: int, prompt_blocks: bool = False):
        check_block_size(length, block_size)
        self.policy, self.length, self.block_size = policy, length, block_size
        self.prompt_blocks = prompt_blocks
        self.model, self.mask_token_id = policy.model, policy.mask_token_id
        self.family = "block_causal"  # (no approximate block cache: the sampler refuses cache modes by family)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        t = input_ids.shape[1]
        if t < self.length:
            raise ValueError(f"input of {t} positions is shorter than the completion length {self.length}")
        mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        if not bool(mask[:, t - self.length:].all()):
            raise ValueError("the completion part of a block-causal input must hold no padding")
        prompt_mask = mask[:, : t - self.length]
        mask4d = block_causal_mask(prompt_mask, self.length, self.block_size, self.prompt_blocks)
        return block_logits(self.model, input_ids, mask4d, block_position_ids(prompt_mask, self.length))

    def parameters(self):
        return self.policy.parameters()


__all__ = [
    "CLEAN_CONTEXTS",
    "PAD_BLOCK",
    "BlockCausalPolicy",
    "BlockForwardFn",
    "KeyValues",
    "block_bounds",
    "block_causal_mask",
    "block_ids",
    "block_logits",
    "block_position_ids",
    "bool_mask_block_forward",
    "causal_prompt_mask",
    "causal_sources",
    "check_block_size",
    "check_clean_context",
    "check_logit_shift",
    "completion_block_ids",
    "composite_mask",
    "composite_position_ids",
    "full_attention_logits",
    "gather_positions",
    "hf_block_forward",
    "model_attention_mask",
    "prompt_block_ids",
    "shifted_sources",
]
