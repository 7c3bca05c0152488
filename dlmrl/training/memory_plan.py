"""A memory plan in bytes, per process: what a training run holds at its peak, term by term.

:func:`plan_memory` is a pure function of explicit numbers: an :class:`Architecture` (hidden size, layers, heads,
key/value heads, head dimension, MLP width, vocabulary, experts) and the run's :class:`MemorySettings` (weight
dtype, LoRA or full parameters, master weights, processes and sharding, canvases and positions per forward with
grad, gradient checkpointing, log-prob chunking, rollout rows and lengths). It returns a :class:`MemoryPlan`: each
term in bytes and the peak, the largest of the run's phases (the forward/backward with grad, the end of the
backward with the optimizer step, a rollout's sampling call) on top of what lives through all of them (weights,
master copy, optimizer state).

Where the numbers come from: :func:`architecture_from_config` reads a checkpoint's ``config.json`` (transformers'
Llama/Qwen2/Qwen3/SDAR keys, LLaDA's ``d_model``/``n_layers``/... keys, LLaDA2's mixture-of-experts keys). The glue
between a config and the plan is in :mod:`dlmrl.training.memory_config`: ``architecture_for`` finds the
architecture for a config (a local folder's ``config.json``, else the numbers a recipe records under
``model.architecture`` for its hub model), ``settings_from_config`` derives the run's numbers from a validated
config, ``memory_section`` is the ``memory`` section of ``dlmrl train --dry-run`` and ``check_memory_config`` the
config check of ``model.architecture`` and ``train.memory_budget``.

How the terms are counted (our reading of the code paths dlmrl runs; ``benchmarks/memory_plan_check.py``
compares the plan with the peak resident memory of real training steps on CPU):

- Saved activations follow the method of Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models" (arXiv 2205.05198, §4.1, eq. 1: the bytes of every tensor a layer keeps for its backward,
  ``sbh(34 + 5as/h)`` for GPT with 16-bit activations, dropout and the attention matrix), counted again for the
  layer dlmrl runs: transformers' Llama decoder layer (RMSNorm, SwiGLU MLP, no dropout) under an SDPA kernel that
  keeps no ``T x T`` matrix (flash / memory-efficient; on CPU ``_scaled_dot_product_flash_attention_for_cpu``),
  with autograd's rule that a linear layer keeps its input only when its weight is trained
  (:func:`layer_activation_bytes_per_token`). With activation checkpointing each layer keeps its input
  (Korthikanti §4.2, "full recomputation": ``2sbhL``) and one layer's activations are rebuilt at a time.
- Logits: the language-model head's output over every position of a canvas in the weights' dtype, a float32 copy
  (dlmrl's policies return float32 logits), the float32 ``log_softmax`` the scorer keeps for its backward, and
  the gradients of those in the backward (:func:`logits_peak_bytes`).
- Optimizer: AdamW's two moments (``exp_avg``, ``exp_avg_sq``) in the dtype of the weights it updates (Loshchilov
  & Hutter, arXiv 1711.05101; ``torch.optim.AdamW`` allocates them with ``zeros_like(param)``); an fp32 master copy
  of bfloat16/float16 weights trained in full (mixed-precision training, Micikevicius et al., arXiv 1710.03740).
- Sharding: ZeRO (Rajbhandari et al., arXiv 1910.02054): stage 2 shards gradients and optimizer state (with its
  master copy) over the processes, stage 3 / FSDP also the weights; FSDP gathers one wrapped layer's full weights
  at a time (Zhao et al., arXiv 2304.11277, "PyTorch FSDP").
- Key/value cache: ``2 x kv_heads x head_dim x dtype bytes`` per cached token and layer (keys and values of every
  layer, each with its own shape).

Units: bytes throughout; ``dlmrl.training.memory_config.format_bytes`` prints GB (10^9 bytes).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

#: bytes per element of the dtypes a run names (``model.dtype``)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}

#: sharding modes: ``none`` (one process, or each process a full copy without a gradient bucket), ``ddp``
#: (replicated weights; DDP's reducer keeps a flat bucket copy of the gradients), ``zero1`` (optimizer state and
#: master copy sharded), ``zero2`` (gradients too), ``fsdp`` (ZeRO-3 / FSDP FULL_SHARD: weights too)
SHARDING = ("none", "ddp", "zero1", "zero2", "fsdp")
#: the samplers whose step tensors :func:`rollout_logits_bytes` knows (``MemorySettings.rollout_sampler``)
ROLLOUT_SAMPLERS = ("gumbel", "entropy_bound")

#: module-name layouts :class:`Architecture` knows: transformers' Llama/Qwen/SDAR names, LLaDA's own, LLaDA2's MoE,
#: DiffusionGemma's (Gemma 4's MoE text layers: a dense MLP and routed experts side by side in every layer)
LAYOUTS = ("llama", "llada", "llada2", "diffusion_gemma")
#: the module-name prefix of DiffusionGemma's routed experts, which are 3-D parameters (``experts.gate_up_proj``,
#: ``experts.down_proj``), not ``nn.Linear`` layers: never adapted by LoRA
EXPERTS = "experts."

#: prompt tokens assumed for a text task's memory plan: ``--dry-run`` reads no data and loads no tokenizer, and
#: a prompt's length is the data's (d1's GSM8K/MATH prompts with LLaDA's chat template run about 100-250 tokens)
ASSUMED_PROMPT_TOKENS = 256


# ------------------------------------------------------------------------------------------------ architecture


@dataclass(frozen=True)
class Architecture:
    """A transformer's shape, as a checkpoint's ``config.json`` gives it.

    Attributes:
        hidden_size: ``H``. num_layers: ``L`` decoder layers. num_heads: query heads. num_kv_heads: key/value
            heads (grouped-query attention; = ``num_heads`` without it). head_dim: per head (``H / num_heads``
            unless the config says otherwise, e.g. Qwen3's 128).
        intermediate_size: the dense MLP's width ``I`` (SwiGLU: gate, up and down projections).
        vocab_size: ``V``, the logits' width. embedding_rows: rows of the embedding and output matrices (LLaDA's
            ``embedding_size`` pads the vocabulary; default ``vocab_size``).
        tie_embeddings: the output head shares the embedding matrix.
        num_experts: routed experts per mixture-of-experts layer (0: dense). experts_per_token: routed experts a
            token visits. moe_intermediate_size: one expert's MLP width. shared_experts: always-on experts (their
            MLP is ``shared_experts x moe_intermediate_size`` wide). dense_layers: leading dense layers of an MoE
            model (LLaDA2's ``first_k_dense_replace``).
        attention_bias: q/k/v (and output) projections carry biases (LLaDA's ``include_bias`` sets every linear's).
        mlp_bias: MLP projections carry biases.
        qk_norm: RMSNorm on each head's queries and keys (Qwen3/SDAR, LLaDA2).
        layout: module names (:data:`LAYOUTS`), for matching ``model.lora_target_modules``. ``diffusion_gemma``:
            every layer holds the dense MLP (``intermediate_size``) *and* ``num_experts`` routed experts (of which
            ``experts_per_token`` run per token), plus the decoder's self-conditioning MLP (``3 H I``) once.
        kv_shared_layers: layers whose keys are their values, without a ``v_proj`` (DiffusionGemma's full-attention
            layers, transformers' ``DiffusionGemmaTextAttention``).
        attention_overrides: ``(layer index, head_dim, kv_heads)`` of the layers whose attention is shaped otherwise
            (DiffusionGemma's global layers: ``global_head_dim``, ``num_global_key_value_heads``); the query heads
            stay ``num_heads``.
        source: where the numbers came from (for the plan's reader).
    """

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    embedding_rows: int | None = None
    tie_embeddings: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_experts: int = 0
    dense_layers: int = 0
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    layout: str = "llama"
    kv_shared_layers: tuple[int, ...] = ()
    attention_overrides: tuple[tuple[int, int, int], ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                     "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"architecture {name} must be an integer >= 1, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"architecture num_kv_heads {self.num_kv_heads} must divide num_heads {self.num_heads}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"architecture layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.num_experts and (self.experts_per_token < 1 or self.moe_intermediate_size < 1):
            raise ValueError("an MoE architecture needs experts_per_token >= 1 and moe_intermediate_size >= 1")

    @property
    def rows(self) -> int:
        """Rows of the embedding (and untied output) matrix."""
        return self.embedding_rows or self.vocab_size

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` (0-based) routes its tokens to experts."""
        return self.num_experts > 0 and index >= self.dense_layers

    def attention_shape(self, index: int | None = None) -> tuple[int, int, int]:
        """``(query heads, key/value heads, head dim)`` of decoder layer ``index`` (``None``: the common shape)."""
        for layer, head_dim, kv_heads in self.attention_overrides:
            if layer == index:
                return self.num_heads, kv_heads, head_dim
        return self.num_heads, self.num_kv_heads, self.head_dim

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    def linear_modules(self, moe: bool) -> list[tuple[str, int, int, int]]:
        """``(name, in_features, out_features, count)`` of one decoder layer's ``nn.Linear`` modules (``moe``: an
        expert layer's), by the module names of :attr:`layout` (what ``model.lora_target_modules`` matches)."""
        return [(name, fan_in, fan_out, count) for name, fan_in, fan_out, count, _ in self._linears(moe)]

    def layer_linears(self, index: int) -> list[tuple[str, int, int, int, str]]:
        """:meth:`_linears` of decoder layer ``index`` (0-based): an expert layer's or a dense one's, without
        ``v_proj`` in a :attr:`kv_shared_layers` layer."""
        entries = self._linears(self.is_moe_layer(index), index)
        return [e for e in entries if e[0] != "v_proj"] if index in self.kv_shared_layers else entries

    def _linears(self, moe: bool, index: int | None = None) -> list[tuple[str, int, int, int, str]]:
        """:meth:`linear_modules` with each module's path inside a decoder layer (``*`` standing for an expert's
        index), the names the published model code gives them: transformers' Llama / Qwen / SDAR / DiffusionGemma
        (``self_attn.q_proj``, ``mlp.gate_proj``; LLaDA-MoE's ``modeling_lladamoe.py`` the same, its experts
        ``mlp.experts.<i>.gate_proj``), LLaDA's ``modeling_llada.py`` (the block's own ``q_proj`` ... ``ff_out``),
        LLaDA2's ``modeling_llada2_moe.py`` (``attention.query_key_value``, ``attention.dense``,
        ``mlp.experts.<i>.gate_proj``, ``mlp.shared_experts.gate_proj``); ``index``: that layer's attention shape
        (:meth:`attention_shape`)."""
        h, (nh, kv, hd) = self.hidden_size, self.attention_shape(index)
        if self.layout == "llada2":
            attn = [("query_key_value", h, (nh + 2 * kv) * hd, 1, "attention.query_key_value"),
                    ("dense", nh * hd, h, 1, "attention.dense")]
        elif self.layout == "llada":
            attn = [("q_proj", h, nh * hd, 1, "q_proj"), ("k_proj", h, kv * hd, 1, "k_proj"),
                    ("v_proj", h, kv * hd, 1, "v_proj"), ("attn_out", nh * hd, h, 1, "attn_out")]
        else:
            attn = [("q_proj", h, nh * hd, 1, "self_attn.q_proj"), ("k_proj", h, kv * hd, 1, "self_attn.k_proj"),
                    ("v_proj", h, kv * hd, 1, "self_attn.v_proj"), ("o_proj", nh * hd, h, 1, "self_attn.o_proj")]
        llada = self.layout == "llada"
        gate, up, down = ("ff_proj", "up_proj", "ff_out") if llada else ("gate_proj", "up_proj", "down_proj")
        mlp = "" if llada else "mlp."

        def swiglu(width: int, count: int, where: str) -> list[tuple[str, int, int, int, str]]:
            return [(gate, h, width, count, where + gate), (up, h, width, count, where + up),
                    (down, width, h, count, where + down)]

        if not moe or self.layout == "diffusion_gemma":
            dense = attn + swiglu(self.intermediate_size, 1, mlp)
            if not moe:
                return dense
            mi, e = self.moe_intermediate_size, self.num_experts  # (gate_up_proj holds gate and up: two entries)
            return dense + [(EXPERTS + gate, h, mi, e, "mlp.experts.gate_up_proj"),
                            (EXPERTS + up, h, mi, e, "mlp.experts.gate_up_proj"),
                            (EXPERTS + down, mi, h, e, "mlp.experts.down_proj")]
        mi, e, s = self.moe_intermediate_size, self.num_experts, self.shared_experts
        experts = swiglu(mi, e, mlp + "experts.*.")
        if s:
            # (LLaDA2's name; Qwen2-MoE's for the Llama layout: LLaDA-MoE's released checkpoints have no shared expert)
            experts += swiglu(mi * s, 1, mlp + ("shared_experts." if self.layout == "llada2" else "shared_expert."))
        return attn + experts

    def layer_parameters(self, index: int) -> int:
        """Parameters of decoder layer ``index``: its linear weights (and biases), its two RMSNorm weights, QK-norm
        weights, an MoE layer's router ``(num_experts, H)``."""
        moe = self.is_moe_layer(index)
        n = 0
        for name, fan_in, fan_out, count, _ in self.layer_linears(index):
            attn = name in ("q_proj", "k_proj", "v_proj", "o_proj", "attn_out", "query_key_value", "dense")
            bias = self.attention_bias if attn else self.mlp_bias
            n += count * (fan_in * fan_out + (fan_out if bias else 0))
        n += 2 * self.hidden_size + (2 * self.attention_shape(index)[2] if self.qk_norm else 0)
        if moe:
            n += self.num_experts * self.hidden_size
        if self.layout == "diffusion_gemma":  # (Gemma 4's five more norms, the router's scale and per-expert scale)
            n += 6 * self.hidden_size + self.num_experts
        return n

    def parameter_count(self) -> int:
        """Every parameter: the embedding ``rows x H``, the decoder layers (:meth:`layer_parameters`), the final
        norm ``H``, and the output head ``rows x H`` unless tied. (Equals ``sum(p.numel())`` of transformers'
        ``LlamaForCausalLM`` built from the same config; ``tests/training/test_memory_plan.py``.)"""
        h = self.hidden_size
        embed = self.rows * h
        # (DiffusionGemma's self-conditioning MLP: its RMSNorm, then gate, up, down at the dense width)
        extra = 3 * h * self.intermediate_size + h if self.layout == "diffusion_gemma" else 0
        return (embed + sum(self.layer_parameters(i) for i in range(self.num_layers)) + h + extra
                + (0 if self.tie_embeddings else embed))

    def largest_layer_parameters(self) -> int:
        """The most parameters one decoder layer holds (FSDP's unit when each decoder layer is wrapped)."""
        return max(self.layer_parameters(i) for i in range(self.num_layers))

    def lora_parameters(self, r: int, target_modules: str) -> int:
        """Trainable LoRA parameters: ``r x (in + out)`` per adapted ``nn.Linear`` (or ``nn.Embedding``; Hu et al.,
        arXiv 2106.09685). ``target_modules`` as peft reads it (:func:`lora_modules`): ``all-linear`` or a comma
        list of names, each adapting the modules whose full name ends with it."""
        return r * sum(fan_in + fan_out for _, _, fan_in, fan_out, _ in lora_modules(self, target_modules)[0])

    def lora_targets(self, target_modules: str, moe: bool | None = None, index: int | None = None) -> set[str]:
        """The per-layer module names (:meth:`linear_modules`' names) ``target_modules`` adapts: in layer ``index``
        when given, else in some layer of the kind ``moe`` says (an expert layer ``True``, a dense one ``False``,
        either ``None``)."""
        return {name for _, name, _, _, layer in lora_modules(self, target_modules)[0]
                if layer is not None and (layer == index if index is not None
                                          else moe is None or self.is_moe_layer(layer) == moe)}

    def unmatched_lora_targets(self, target_modules: str) -> list[str]:
        """The names of a comma list that match no module :func:`lora_modules` knows: the run refuses them
        (:func:`dlmrl.models.lora.apply_lora`), and the plan counts no adapter for them."""
        return list(lora_modules(self, target_modules)[1])

    @property
    def head_path(self) -> str | None:
        """The output head's module name as peft sees it (LLaDA's ``model.transformer.ff_out``, else
        ``lm_head``); ``None`` for DiffusionGemma, whose adapters stay in the text layers."""
        return {"llada": "model.transformer.ff_out", "diffusion_gemma": None}.get(self.layout, "lm_head")

    def kv_cache_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes one cached token costs: ``2 x kv_heads x head_dim x dtype bytes`` summed over the layers (keys and
        values of every layer, each layer's own shape: :meth:`attention_shape`)."""
        return sum(2 * kv * hd for _, kv, hd in map(self.attention_shape, range(self.num_layers))) * dtype_bytes


#: where each layout's decoder layers sit (``<prefix>.<index>.<path inside the layer>``), its input embedding, and
#: its routers when they are ``nn.Linear`` (LLaDA-MoE's ``mlp.gate``, DiffusionGemma's ``router.proj``; LLaDA2's
#: gate is a bare parameter). DiffusionGemma: none, its kind matches names inside the text layers only
#: (:func:`dlmrl.models.diffusion_gemma.lora_target_pattern`), which the empty prefix gives.
_LAYER_PREFIX = {"llama": "model.layers.", "llada": "model.transformer.blocks.", "llada2": "model.layers.",
                 "diffusion_gemma": ""}
_EMBEDDING_PATH = {"llama": "model.embed_tokens", "llada": "model.transformer.wte", "llada2": "model.word_embeddings"}
_ROUTER_PATH = {"llama": "mlp.gate", "diffusion_gemma": "router.proj"}
#: what ``all-linear`` means for DiffusionGemma's kind (:data:`dlmrl.models.diffusion_gemma.DEFAULT_LORA_TARGETS`;
#: a test keeps the two equal): the attention projections and the dense MLP
DIFFUSION_GEMMA_ALL_LINEAR = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def _names(target_modules: str) -> list[str]:
    return [n.strip() for n in target_modules.split(",") if n.strip()]


@functools.cache
def lora_modules(arch: Architecture, target_modules: str) -> tuple[tuple[tuple[str, str, int, int, int | None], ...],
                                                                   tuple[str, ...]]:
    """The modules a LoRA adapter with peft's ``target_modules`` puts itself on, and the names that match none.

    Every module peft can adapt is listed by its full name (transformers' and the checkpoints' own code: Llama /
    Qwen / SDAR / LLaDA-MoE ``model.layers.<i>.self_attn.q_proj``, LLaDA ``model.transformer.blocks.<i>.q_proj``,
    LLaDA2 ``model.layers.<i>.attention.query_key_value``; one entry per expert, ``mlp.experts.<j>.gate_proj``;
    the routers that are ``nn.Linear``; the input embedding; the output head), and a name adapts the modules whose
    full name equals it or ends with ``"." + name`` (peft's ``check_target_module_exists``): ``q_proj``,
    ``self_attn.q_proj``, ``layers.0.self_attn.q_proj`` (layer 0 only), ``experts.3.gate_proj`` (one expert).
    ``all-linear``: every ``nn.Linear`` but the output head (peft's rule); DiffusionGemma's kind:
    :data:`DIFFUSION_GEMMA_ALL_LINEAR`, and names matched inside its text layers only (never its head or
    embedding, nor a layer's index). Its routed experts are 3-D parameters, which no adapter takes.

    Returns:
        ``((full name, per-layer name, in_features, out_features, layer index or None), ...)`` of the adapted
        modules, and the names of the list that match no module (empty for ``all-linear``).
    """
    h, layout = arch.hidden_size, arch.layout
    modules: list[tuple[str, str, int, int, int | None, bool]] = []  # (..., whether all-linear takes it)
    prefix, router = _LAYER_PREFIX[layout], _ROUTER_PATH.get(layout)
    for i in range(arch.num_layers):
        where = f"{prefix}{i}." if prefix else ""
        for name, fan_in, fan_out, count, path in arch.layer_linears(i):
            if name.startswith(EXPERTS):
                continue
            for j in range(count) if "*" in path else (None,):
                modules.append((where + (path if j is None else path.replace("*", str(j))), name, fan_in, fan_out, i,
                                layout != "diffusion_gemma" or path in DIFFUSION_GEMMA_ALL_LINEAR))
        if router and arch.is_moe_layer(i):
            modules.append((where + router, "router", h, arch.num_experts, i, layout == "llama"))
    if layout in _EMBEDDING_PATH:
        modules.append((_EMBEDDING_PATH[layout], "embedding", arch.rows, h, None, False))
    if arch.head_path:
        modules.append((arch.head_path, "head", h, arch.rows, None, False))
    if target_modules.strip() == "all-linear":
        return tuple(m[:5] for m in modules if m[5]), ()
    names = _names(target_modules)
    hit = [m[:5] for m in modules if any(m[0] == t or m[0].endswith("." + t) for t in names)]
    unmatched = [t for t in names if not any(m[0] == t or m[0].endswith("." + t) for m in modules)]
    return tuple(hit), tuple(unmatched)


def _int(config: Mapping, key: str, default=None):
    value = config.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    return int(value)


def _required(config: Mapping, keys: tuple[str, ...], what: str) -> int:
    for key in keys:
        if config.get(key) is not None:
            return _int(config, key)
    raise ValueError(f"{what}: none of {', '.join(keys)} is set")


def architecture_from_config(config: Mapping, source: str = "") -> Architecture:
    """The :class:`Architecture` of a checkpoint's ``config.json`` (a dict; no model code runs).

    Families and keys:

    - LLaDA (``model_type`` ``llada``; OLMo's config keys): ``d_model``, ``n_layers``, ``n_heads``, ``n_kv_heads``
      (default ``n_heads``), ``mlp_hidden_size`` (default ``mlp_ratio x d_model``, ``mlp_ratio`` 4), ``vocab_size``,
      ``embedding_size``, ``weight_tying``, ``include_bias``.
    - LLaDA-MoE (``architectures`` ``LLaDAMoEModelLM``, its ``model_type`` being LLaDA's ``llada``):
      :func:`_llada_moe_architecture`.
    - LLaDA2 (``llada2_moe``): transformers' keys below plus ``num_experts``, ``num_experts_per_tok``,
      ``moe_intermediate_size``, ``num_shared_experts``, ``first_k_dense_replace``, ``use_qkv_bias``,
      ``use_qk_norm``.
    - everything else (Llama, Qwen2 / Dream, Qwen3 / SDAR, Mistral, the tiny default): ``hidden_size``,
      ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim`` (default
      ``hidden_size / num_attention_heads``), ``intermediate_size``, ``vocab_size``, ``tie_word_embeddings``
      (default false), ``attention_bias``, ``mlp_bias``; Qwen3 and SDAR add QK-norm.

    Raises:
        ValueError: a required key missing or not an integer (naming it).
    """
    model_type = str(config.get("model_type") or "").lower()
    archs = [str(a) for a in (config.get("architectures") or [])]
    if model_type == "diffusion_gemma" or "DiffusionGemmaForBlockDiffusion" in archs:
        return _diffusion_gemma_architecture(config, source)
    from dlmrl.models.llada_moe import is_llada_moe

    if is_llada_moe(config):  # (before LLaDA's: LLaDA-MoE's release says model_type "llada" too)
        return _llada_moe_architecture(config, source)
    if model_type == "llada" or "LLaDAModelLM" in archs:
        d = _required(config, ("d_model",), "LLaDA config")
        heads = _required(config, ("n_heads",), "LLaDA config")
        mlp = _int(config, "mlp_hidden_size") or int((_int(config, "mlp_ratio") or 4) * d)
        vocab = _required(config, ("vocab_size",), "LLaDA config")
        bias = bool(config.get("include_bias", False))
        return Architecture(hidden_size=d, num_layers=_required(config, ("n_layers",), "LLaDA config"),
                            num_heads=heads, num_kv_heads=_int(config, "n_kv_heads") or heads, head_dim=d // heads,
                            intermediate_size=mlp, vocab_size=vocab,
                            embedding_rows=max(vocab, _int(config, "embedding_size") or vocab),
                            tie_embeddings=bool(config.get("weight_tying", False)), attention_bias=bias,
                            mlp_bias=bias, layout="llada", source=source)
    h = _required(config, ("hidden_size", "d_model", "n_embd"), "config.json")
    heads = _required(config, ("num_attention_heads", "n_heads"), "config.json")
    kv = _int(config, "num_key_value_heads") or heads
    common = {"hidden_size": h, "num_layers": _required(config, ("num_hidden_layers", "n_layers"), "config.json"),
              "num_heads": heads, "num_kv_heads": kv, "head_dim": _int(config, "head_dim") or h // heads,
              "intermediate_size": _required(config, ("intermediate_size",), "config.json"),
              "vocab_size": _required(config, ("vocab_size",), "config.json"),
              "tie_embeddings": bool(config.get("tie_word_embeddings", False)), "source": source}
    if model_type == "llada2_moe" or "LLaDA2MoeModelLM" in archs:
        return Architecture(**common, num_experts=_int(config, "num_experts") or 0,
                            experts_per_token=_int(config, "num_experts_per_tok") or 0,
                            moe_intermediate_size=_int(config, "moe_intermediate_size") or 0,
                            shared_experts=_int(config, "num_shared_experts") or 0,
                            dense_layers=_int(config, "first_k_dense_replace") or 0,
                            attention_bias=bool(config.get("use_qkv_bias", False)),
                            qk_norm=bool(config.get("use_qk_norm", True)), layout="llada2")
    qk_norm = model_type in ("qwen3", "sdar", "qwen3_moe", "sdar_moe") or "SDARForCausalLM" in archs
    return Architecture(**common, attention_bias=bool(config.get("attention_bias", False)),
                        mlp_bias=bool(config.get("mlp_bias", False)), qk_norm=qk_norm)


def _llada_moe_architecture(config: Mapping, source: str) -> Architecture:
    """LLaDA-MoE (``architectures`` ``LLaDAMoEModelLM``; ``modeling_lladamoe.py``): ``hidden_size``,
    ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``dense_intermediate_size`` (a dense
    layer's MLP), ``expert_intermediate_size``, ``num_experts``, ``num_experts_per_tok``,
    ``shared_expert_intermediate_size`` (one shared expert of that width, or none), ``moe_layer_freq`` (1 = an expert
    layer; its leading 0 entries are the dense layers), ``qk_layernorm``, ``attention_bias``, ``vocab_size``,
    ``tie_word_embeddings``; Llama's module names (``q_proj`` ... ``o_proj``, ``gate_proj`` / ``up_proj`` /
    ``down_proj``).

    Raises:
        ValueError: a required key missing, or dense layers that do not all come first in ``moe_layer_freq``.
    """
    h = _required(config, ("hidden_size",), "LLaDA-MoE config")
    heads = _required(config, ("num_attention_heads",), "LLaDA-MoE config")
    layers = _required(config, ("num_hidden_layers",), "LLaDA-MoE config")
    freq = list(config.get("moe_layer_freq") or [1] * layers)
    dense = next((i for i, f in enumerate(freq) if f), len(freq))
    if any(not f for f in freq[dense:]):
        raise ValueError(f"LLaDA-MoE config: moe_layer_freq {freq} has dense layers after expert layers, which the "
                         "memory plan does not model")
    expert = _required(config, ("expert_intermediate_size",), "LLaDA-MoE config")
    shared = _int(config, "shared_expert_intermediate_size") or 0
    if shared % expert:
        raise ValueError(f"LLaDA-MoE config: shared_expert_intermediate_size {shared} is not a multiple of "
                         f"expert_intermediate_size {expert}")
    return Architecture(hidden_size=h, num_layers=layers, num_heads=heads,
                        num_kv_heads=_int(config, "num_key_value_heads") or heads, head_dim=h // heads,
                        intermediate_size=_int(config, "dense_intermediate_size") or expert,
                        vocab_size=_required(config, ("vocab_size",), "LLaDA-MoE config"),
                        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
                        num_experts=_required(config, ("num_experts",), "LLaDA-MoE config"),
                        experts_per_token=_required(config, ("num_experts_per_tok",), "LLaDA-MoE config"),
                        moe_intermediate_size=expert, shared_experts=shared // expert, dense_layers=dense,
                        attention_bias=bool(config.get("attention_bias", False)),
                        qk_norm=bool(config.get("qk_layernorm", False)), source=source)


def _diffusion_gemma_architecture(config: Mapping, source: str) -> Architecture:
    """DiffusionGemma (``model_type`` ``diffusion_gemma``): the text model's keys sit under ``text_config``
    (``DiffusionGemmaTextConfig``): ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
    ``num_key_value_heads``, ``head_dim``, ``intermediate_size`` (the dense MLP), ``num_experts``, ``top_k_experts``,
    ``moe_intermediate_size``, ``vocab_size``, ``layer_types`` (the full-attention layers have no ``v_proj``:
    :attr:`Architecture.kv_shared_layers`), and the full-attention layers' own shape (``per_layer_config``, else
    ``global_head_dim`` and ``num_global_key_value_heads``: :attr:`Architecture.attention_overrides`; 5 of 30
    layers in the 26B-A4B, 2 key/value heads of 512); the head is tied (``tie_word_embeddings``, default true); the
    vision tower is not counted (text training never runs it, but its weights are loaded)."""
    text = config.get("text_config")
    if not isinstance(text, Mapping):
        raise ValueError("DiffusionGemma config: text_config (the text model's keys) is missing")  # noqa: TRY004 (a config error: ValueError as every key here)
    what = "DiffusionGemma text_config"
    h = _required(text, ("hidden_size",), what)
    heads = _required(text, ("num_attention_heads",), what)
    experts = _int(text, "num_experts") or 0
    full_attention = _full_attention_layers(text)
    return Architecture(hidden_size=h, num_layers=_required(text, ("num_hidden_layers",), what), num_heads=heads,
                        num_kv_heads=_int(text, "num_key_value_heads") or heads,
                        head_dim=_int(text, "head_dim") or h // heads,
                        intermediate_size=_required(text, ("intermediate_size",), what),
                        vocab_size=_required(text, ("vocab_size",), what),
                        tie_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", True))),
                        num_experts=experts, experts_per_token=(_int(text, "top_k_experts") or 0) if experts else 0,
                        moe_intermediate_size=(_int(text, "moe_intermediate_size") or 0) if experts else 0,
                        attention_bias=bool(text.get("attention_bias", False)), qk_norm=True,
                        layout="diffusion_gemma", kv_shared_layers=full_attention,
                        attention_overrides=_global_attention(text, full_attention), source=source)


def _full_attention_layers(text: Mapping) -> tuple[int, ...]:
    """The indices of DiffusionGemma's full-attention layers, whose keys are their values (no ``v_proj``):
    ``text_config.layer_types``, else transformers' default (``DiffusionGemmaTextConfig``: every sixth layer), the
    last layer always one."""
    layers = _required(text, ("num_hidden_layers",), "DiffusionGemma text_config")
    types = list(text.get("layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention"
                                             for i in range(layers)])
    if types:
        types[-1] = "full_attention"
    return tuple(i for i, kind in enumerate(types) if kind == "full_attention")


def _global_attention(text: Mapping, full_attention: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    """``(layer, head_dim, kv_heads)`` of DiffusionGemma's layers shaped otherwise, as transformers'
    ``DiffusionGemmaTextConfig`` reads them: ``per_layer_config`` when the config has one (layer index, as a string in
    JSON, to ``head_dim`` / ``num_key_value_heads``), else every full-attention layer at ``global_head_dim``
    (transformers' default 512) with ``num_global_key_value_heads`` key/value heads when it is set (DiffusionGemma's
    config declares no ``attention_k_eq_v``, so transformers' gate on it always passes: the key is ignored)."""
    head_dim = _int(text, "head_dim") or _int(text, "hidden_size") // _int(text, "num_attention_heads")
    kv = _int(text, "num_key_value_heads") or _int(text, "num_attention_heads")
    if isinstance(text.get("per_layer_config"), Mapping):
        layers = {int(i): dict(o or {}) for i, o in text["per_layer_config"].items()}
    else:
        override = {"head_dim": _int(text, "global_head_dim") or 512}
        if _int(text, "num_global_key_value_heads"):
            override["num_key_value_heads"] = _int(text, "num_global_key_value_heads")
        layers = dict.fromkeys(full_attention, override)
    out = []
    for i, o in sorted(layers.items()):
        shape = (_int(o, "head_dim") or head_dim, _int(o, "num_key_value_heads") or kv)
        if shape != (head_dim, kv):
            out.append((i, *shape))
    return tuple(out)


# ------------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class MemorySettings:
    """A run's numbers that decide its memory, per process.

    Attributes:
        weight_dtype: the weights' (and the forward's) dtype, a key of :data:`DTYPE_BYTES`.
        lora_r: LoRA rank, ``None`` = every weight trained. lora_targets: ``model.lora_target_modules``.
            lora_dropout: > 0 makes each adapted layer keep its own dropped-out input.
        master_weights: an fp32 master copy of the trained weights (and fp32 AdamW moments); ``None`` = present
            when the weights are bfloat16/float16 and trained in full.
        processes: data-parallel processes. sharding: one of :data:`SHARDING`.
        canvases_per_forward: canvases (rows) in one forward with grad. positions: tokens each canvas runs
            through the model (prompt + canvas; ``prompt + 2L`` for a block model's composite pass).
            head_positions: positions the output head scores per canvas (``None`` = all ``positions``; an AR
            scorer keeps ``L + 1``). scored_positions: positions whose full-vocabulary log-probs are taken (the
            canvas ``L``; the noisy half of a composite pass). float_copy_all: the float32 copy of the logits
            covers every head position (dlmrl's diffusion and block forwards convert the model's whole output)
            rather than only the scored ones (the AR scorer slices first).
        grads_during_forward: gradients already held while a forward runs (``estimator.micro_batch`` chunks add
            theirs up over several backward passes).
        gradient_checkpointing: each decoder layer keeps only its input; one is recomputed at a time.
        logprob_chunk: positions whose full-vocabulary logits exist at once (chunked log-probs); ``None`` = all.
        dense_mask: the forward takes a ``(rows, 1, T, T)`` mask that SDPA converts to the compute dtype and keeps,
            per layer (block-causal masks; a padded batch of the tiny family).
        foreach_optimizer: AdamW's multi-tensor path (the default on GPU), whose step allocates a moment-sized
            temporary for all weights at once; ``False`` (CPU): one weight's at a time.
        reference_model: a frozen second copy of the weights (a KL toward the initial model without LoRA).
        rollout_rows: rows in one sampling call. rollout_tokens: tokens each row's key/value cache holds at the
            end of sampling (prompt + completion), 0 = no cache (full diffusion without ``sampling.cache``).
            rollout_kv_copies: copies of that cache alive at the sampler's peak (1: the exact caches; a masked
            model's block cache: 2, the kept keys/values and a cached pass's own concatenation of them with the
            block's, 3 with threshold decoding, whose rows still decoding keep their own selection).
            rollout_forward_positions: positions one sampling forward runs per row (the whole sequence without a
            cache; one block with one). rollout_scored_positions: positions a sampling step draws from (one block).
            rollout_prefill_positions: positions of the pass that fills the cache with the prompt, whose head
            output is computed too (the block kind's exact cache; 0 where the head keeps only the last position,
            as transformers' ``generate`` does).
        rollout_sampler: which sampler's step tensors :func:`rollout_logits_bytes` counts: ``"gumbel"`` (the
            masked and block samplers' Gumbel-max draw) or ``"entropy_bound"`` (DiffusionGemma's step: a draw at
            every position and the entropies the acceptance sorts).
        rollout_gathers_weights: sharded weights are gathered whole for the rollout (``train.sharding: fsdp2``,
            :mod:`dlmrl.training.sharding`: once per rollout, since processes sample different numbers of passes).
        soft_inputs: each head position of a forward with grad also reads a vocabulary-sized input in the weights'
            dtype, held (detached) through the forward and the backward: DiffusionGemma's self-conditioning input,
            the previous step's logits (:func:`soft_input_bytes`). rollout_soft_inputs: the same in each sampling
            step (:func:`rollout_soft_input_bytes`).
        uncheckpointed_positions: of each canvas's ``positions``, those whose layers gradient checkpointing does not
            cover, kept in full with it on (DiffusionGemma: transformers checkpoints the decoder layers, not the
            encoder's, whose positions the uniform kind shares out over the step canvases).
        kv_copy_positions: key/value positions of which each canvas of a forward with grad holds its own copy,
            kept until the backward (DiffusionGemma's trajectory pass repeats the row's encoder cache, ``P + C·L``
            positions, along the step canvases: ``repeated_cache``).
        reference_adapter: a LoRA run's KL reference is a second adapter (``train.sync_ref_model``), counted in
            ``reference_model``'s term (:func:`reference_bytes`).
    """

    weight_dtype: str = "float32"
    lora_r: int | None = None
    lora_targets: str = "all-linear"
    lora_dropout: float = 0.0
    master_weights: bool | None = None
    processes: int = 1
    sharding: str = "none"
    canvases_per_forward: int = 1
    positions: int = 1
    head_positions: int | None = None
    scored_positions: int = 1
    float_copy_all: bool = True
    grads_during_forward: bool = False
    gradient_checkpointing: bool = False
    logprob_chunk: int | None = None
    dense_mask: bool = False
    foreach_optimizer: bool = False
    reference_model: bool = False
    rollout_rows: int = 0
    rollout_tokens: int = 0
    rollout_kv_copies: int = 1
    rollout_forward_positions: int = 0
    rollout_scored_positions: int = 0
    rollout_prefill_positions: int = 0
    rollout_sampler: str = "gumbel"
    rollout_gathers_weights: bool = False
    soft_inputs: bool = False
    rollout_soft_inputs: bool = False
    reference_adapter: bool = False
    uncheckpointed_positions: int = 0
    kv_copy_positions: int = 0

    def __post_init__(self) -> None:
        if self.weight_dtype not in DTYPE_BYTES:
            raise ValueError(f"weight_dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.weight_dtype!r}")
        if self.sharding not in SHARDING:
            raise ValueError(f"sharding must be one of {', '.join(SHARDING)}, got {self.sharding!r}")
        if self.processes < 1:
            raise ValueError(f"processes must be >= 1, got {self.processes}")
        if self.rollout_sampler not in ROLLOUT_SAMPLERS:
            raise ValueError(f"rollout_sampler must be one of {', '.join(ROLLOUT_SAMPLERS)}, "
                             f"got {self.rollout_sampler!r}")
        if self.logprob_chunk is not None and self.logprob_chunk < 1:
            raise ValueError(f"logprob_chunk must be >= 1 or None, got {self.logprob_chunk}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.weight_dtype]

    @property
    def full(self) -> bool:
        """Every weight trained (no LoRA)."""
        return self.lora_r is None

    @property
    def has_master(self) -> bool:
        if self.master_weights is not None:
            return self.master_weights
        return self.full and self.weight_dtype in ("bfloat16", "float16")


# ------------------------------------------------------------------------------------------------ the terms


def trainable_parameters(arch: Architecture, s: MemorySettings) -> int:
    """Parameters the optimizer updates: all of them, or the LoRA matrices (:meth:`Architecture.lora_parameters`)."""
    return arch.parameter_count() if s.full else arch.lora_parameters(s.lora_r, s.lora_targets)


def _trainable_bytes(s: MemorySettings) -> int:
    """Bytes per element of the trained weights (and their gradients): float32 for a LoRA adapter (peft keeps
    adapters float32 on a bfloat16 base, ``autocast_adapter_dtype``) and for fp32 master weights (the gradients
    land on the float32 weights, :mod:`dlmrl.training.precision`), else the weights' dtype."""
    return 4 if (not s.full or s.has_master) else s.dtype_bytes


def _shard(s: MemorySettings, level: str) -> int:
    """The divisor of a term sharded from ``level`` on (``zero1``: optimizer state and master copy; ``zero2``:
    gradients too; ``fsdp``: weights too), 1 when the run's sharding does not reach it. ZeRO, arXiv 1910.02054
    §5 (P_os, P_os+g, P_os+g+p)."""
    order = {"optimizer": 1, "gradients": 2, "parameters": 3}
    reach = {"none": 0, "ddp": 0, "zero1": 1, "zero2": 2, "fsdp": 3}[s.sharding]
    return s.processes if reach >= order[level] else 1


def parameter_bytes(arch: Architecture, s: MemorySettings) -> int:
    """Weights held by one process in the compute dtype: ``N x dtype bytes`` (a LoRA run: the frozen base in its
    dtype plus the float32 adapter), divided over the processes under FSDP / ZeRO-3. With fp32 master weights
    (:func:`master_bytes`) these are the bfloat16 copies the forward computes with (``torch.autocast`` casts each
    weight once per forward and keeps the cast for the backward); under FSDP with master weights they exist only
    for the gathered layer (FSDP2's ``MixedPrecisionPolicy`` all-gathers in bfloat16, :func:`gathered_layer_bytes`),
    so the term is 0."""
    if s.has_master and _shard(s, "parameters") > 1:
        return 0
    n = arch.parameter_count() * s.dtype_bytes
    if not s.full:
        n += trainable_parameters(arch, s) * 4
    return -(-n // _shard(s, "parameters"))


def gathered_layer_bytes(arch: Architecture, s: MemorySettings) -> int:
    """FSDP / ZeRO-3: the full weights of the largest decoder layer, gathered for its forward and backward (FSDP
    unshards one wrapped unit at a time; Zhao et al., arXiv 2304.11277 §3.2; prefetching the next unit can hold a
    second). 0 without parameter sharding."""
    if _shard(s, "parameters") == 1:
        return 0
    return arch.largest_layer_parameters() * s.dtype_bytes


def master_bytes(arch: Architecture, s: MemorySettings) -> int:
    """The fp32 master copy of bfloat16/float16 weights trained in full: ``4 x N_trained`` (Micikevicius et al.,
    arXiv 1710.03740 §3.1), sharded with the optimizer state under ZeRO / FSDP."""
    if not s.has_master:
        return 0
    return -(-4 * trainable_parameters(arch, s) // _shard(s, "optimizer"))


def gradient_bytes(arch: Architecture, s: MemorySettings) -> int:
    """One gradient per trained weight in its dtype (``.grad``), sharded under ZeRO-2 / FSDP."""
    return -(-trainable_parameters(arch, s) * _trainable_bytes(s) // _shard(s, "gradients"))


def ddp_bucket_bytes(arch: Architecture, s: MemorySettings) -> int:
    """DDP's reducer copies the gradients into flat communication buckets allocated at wrap time (one gradient-
    sized set without ``gradient_as_bucket_view``, which accelerate leaves off): ``N_trained x grad bytes``."""
    if s.sharding != "ddp" or s.processes == 1:
        return 0
    return trainable_parameters(arch, s) * _trainable_bytes(s)


def optimizer_bytes(arch: Architecture, s: MemorySettings) -> int:
    """AdamW's two moments per trained weight (Loshchilov & Hutter, arXiv 1711.05101; ``torch.optim.AdamW``'s
    ``exp_avg``, ``exp_avg_sq``): ``2 x N_trained x b``, ``b`` = 4 on fp32 master weights or a float32 adapter,
    else the weights' dtype (``zeros_like(param)``); sharded under ZeRO / FSDP."""
    b = 4 if s.has_master else _trainable_bytes(s)
    return -(-2 * trainable_parameters(arch, s) * b // _shard(s, "optimizer"))


def optimizer_step_bytes(arch: Architecture, s: MemorySettings) -> int:
    """The optimizer step's own temporary: AdamW computes ``sqrt(exp_avg_sq) / bias_correction + eps`` into a new
    tensor, for one weight at a time (``_single_tensor_adamw``, the CPU default: the largest weight, the embedding
    ``rows x H``) or for all of them at once (``_multi_tensor_adamw``'s ``_foreach_sqrt``, the GPU default)."""
    b = 4 if s.has_master else _trainable_bytes(s)
    if s.foreach_optimizer:
        return -(-trainable_parameters(arch, s) * b // _shard(s, "optimizer"))
    if not s.full:  # (the largest adapter matrix: r x the widest layer)
        widest = max(max(fi, fo) for moe in (False, True) for _, fi, fo, _ in arch.linear_modules(moe))
        return s.lora_r * widest * b
    return max(arch.rows * arch.hidden_size, arch.hidden_size * max(arch.intermediate_size,
                                                                    arch.moe_intermediate_size)) * b


def reference_bytes(arch: Architecture, s: MemorySettings) -> int:
    """A frozen second copy of the weights for a KL toward the initial model (no LoRA to disable): ``N x dtype``,
    divided over the processes where the weights are sharded (dlmrl's FSDP2 shards the reference as the policy);
    a LoRA run whose reference follows the policy (``reference_adapter``): a second adapter, ``N_LoRA x 4``
    (float32, as peft keeps adapters)."""
    if s.reference_adapter and not s.full:
        return arch.lora_parameters(s.lora_r, s.lora_targets) * 4
    return arch.parameter_count() * s.dtype_bytes // _shard(s, "parameters") if s.reference_model else 0


def scoring_weight_bytes(arch: Architecture, s: MemorySettings) -> int:
    """Sharded weights gathered whole for the old-policy and reference scores (no grad; ``rollout_gathers_weights``:
    dlmrl's FSDP2 gathers the policy, and a frozen reference next to it, once for all their passes):
    ``N x dtype bytes`` per model gathered, 0 otherwise."""
    return rollout_weight_bytes(arch, s) * (2 if s.reference_model else 1)


def layer_activation_bytes_per_token(arch: Architecture, s: MemorySettings, moe: bool = False,
                                     index: int | None = None) -> int:
    """Bytes one decoder layer keeps for its backward, per token (Korthikanti et al., arXiv 2205.05198, §4.1: the
    count behind eq. 1, redone for the layer dlmrl runs).

    Our reading of transformers' ``LlamaDecoderLayer`` (the tiny family; LLaDA's and SDAR's code compute the
    same tensors) under autograd, ``d`` the compute dtype's bytes, per token:

    - each RMSNorm (two): its input cast to float32 (``4H``; in float32 the input itself) for ``pow`` and the
      multiply by ``rsqrt``, and the normalised value in ``d`` (``dH``) when its weight is trained;
    - linear inputs, kept only for trained weights (autograd saves a matmul's input to form the weight's
      gradient): the first norm's output ``dH`` (q, k, v), the second's ``dH`` (gate, up), the SwiGLU product
      ``dI`` (down); the output projection's input is the attention output below (one tensor);
    - attention (SDPA, flash-type kernel: no ``T x T`` matrix): rotated queries ``d nh hd``, keys and values
      ``2 d kv hd`` (``2 d nh hd`` when a mask makes transformers repeat them for grouped-query attention), the
      output ``d nh hd`` and the log-sum-exp ``4 nh``; QK-norm (Qwen3/SDAR, LLaDA2) adds a norm's ``(4 + d)`` on
      ``(nh + kv) hd``;
    - the SwiGLU MLP: the gate's output ``dI`` (for SiLU), SiLU's output and the up projection's ``2dI`` (the
      product);
    - a LoRA adapter on a layer whose base is frozen: its input cast to float32 (a new tensor on a bfloat16 base;
      with dropout, the dropped-out copy ``4 fan_in`` and its mask ``fan_in``) and ``A x``'s ``4r``.

    An MoE layer (LLaDA2; not measured here): the router's float32 logits and scores ``8E``, each of the
    ``k`` routed copies of a token with its expert MLP ``k (H + 4 I_e) d`` (``3 I_e`` with frozen experts), the
    shared experts' MLP ``4 S I_e d`` (likewise). DiffusionGemma's layer has its own count
    (:func:`_diffusion_gemma_layer_bytes`). Masks are per row, not per token (:func:`mask_bytes`). ``index``: that
    layer's attention shape (:meth:`Architecture.attention_shape`; ``None``: the common one).
    """
    (nh, kv, hd), h, d = arch.attention_shape(index), arch.hidden_size, s.dtype_bytes
    full = s.full
    kvh = nh if s.dense_mask and kv != nh else kv  # (transformers repeats k, v when a mask is passed with GQA)
    attention = d * nh * hd + 2 * d * kvh * hd + d * nh * hd + 4 * nh  # (q, k, v, attention output, log-sum-exp)
    if arch.layout == "diffusion_gemma":
        total = attention + _diffusion_gemma_layer_bytes(arch, s, index)
    else:
        total = 2 * (4 * h + (d * h if full else 0)) + attention  # (the two RMSNorms)
        if arch.qk_norm:
            total += (4 + (d if full else 0)) * (nh + kv) * hd
        if moe:
            e, k, mi, sh = arch.num_experts, arch.experts_per_token, arch.moe_intermediate_size, arch.shared_experts
            total += 8 * e + k * (h + (3 + full) * mi) * d + (3 + full) * sh * mi * d
        else:
            total += (3 + full) * d * arch.intermediate_size  # (gate out, SiLU out, up out; the product for down)
    if full:
        return total + 2 * d * h  # (the two norms' outputs, q/k/v's and gate/up's input)
    # LoRA on frozen base weights: the inputs of the adapted layers, grouped by the tensor they read
    targets = arch.lora_targets(s.lora_targets, moe, index)
    qkv = ("query_key_value",) if arch.layout == "llada2" else ("q_proj", "k_proj", "v_proj")
    out_name = {"llada2": "dense", "llada": "attn_out"}.get(arch.layout, "o_proj")
    gate, up, down = ("ff_proj", "up_proj", "ff_out") if arch.layout == "llada" else ("gate_proj", "up_proj",
                                                                                        "down_proj")
    dense = not moe or arch.layout == "diffusion_gemma"  # (DiffusionGemma's adapted MLP is its dense one)
    width = arch.intermediate_size if dense else arch.moe_intermediate_size
    visits = 1 if dense else arch.experts_per_token + (1 if arch.shared_experts else 0)
    groups = ((qkv, h, False, 1), ((out_name,), nh * hd, True, 1), ((gate, up), h, False, visits),
              ((down,), width, False, visits))
    for members, size, kept, times in groups:
        adapted = [n for n in members if n in targets]
        if not adapted:
            continue
        if d == 4 and s.lora_dropout == 0:  # (the adapter reads the input itself: kept once)
            total += 0 if kept else times * d * size
        else:  # (each adapter casts its own float32 copy, or drops out its own)
            total += times * len(adapted) * (4 * size + (size if s.lora_dropout > 0 else 0))
        total += times * len(adapted) * 4 * s.lora_r  # (A x, float32)
    return total


def _each_layer_bytes(arch: Architecture, s: MemorySettings) -> list[int]:
    """:func:`layer_activation_bytes_per_token` of every decoder layer, each with its own kind and attention shape."""
    return [layer_activation_bytes_per_token(arch, s, arch.is_moe_layer(i), i) for i in range(arch.num_layers)]


def _diffusion_gemma_layer_bytes(arch: Architecture, s: MemorySettings, index: int | None = None) -> int:
    """What a DiffusionGemma decoder layer keeps for its backward per token besides SDPA's tensors and the linear
    inputs :func:`layer_activation_bytes_per_token` counts for every layout (``d`` the weights' dtype bytes).

    Our reading of transformers' ``DiffusionGemmaDecoderTextLayer`` (the encoder layer computes the same), checked
    tensor by tensor with ``torch.autograd.graph.saved_tensors_hooks`` on a tiny layer in float32 and bfloat16, full
    and LoRA (all-linear), with transformers' default ``grouped_mm`` experts (within 1%):

    - eight RMSNorms over ``H`` (input, post-attention, pre-/post-feed-forward, the dense MLP's post-norm, the
      experts' pre- and post-norms, the router's unscaled norm): each computes in float32, so keeps a float32 input
      (``4H``; in float32 the input itself, which the residual's three norms share: six distinct inputs) and two
      per-token scalars (``8``), and with its scale trained the normalised value (``4H``, seven scaled norms);
    - the head norms ``q_norm``, ``k_norm`` and the unscaled ``v_norm``: float32 inputs ``4 (nh + 2 kv) hd``, the
      scalars ``8 (nh + 2 kv)``, and with trained scales the normalised ``q``, ``k`` (``4 (nh + kv) hd``);
    - the dense GELU MLP beside the experts: gate out, GELU out, up out (``3 d I``) and, with ``down_proj``
      trained, the product it reads (``d I``; a LoRA adapter's input is counted with the adapters);
    - the router: float32 probabilities, top-k indices and weights (``4E + 20k + 4``) and, trained, the scaled
      norm's output for ``scale`` and ``proj`` (``2 d H``);
    - the experts (``grouped_mm``): the routing permutations (``24k``) and weights (``4k``), and per routed copy the
      gate/up output, GELU output (``3 d I_e``) and the expert output that the routing weight multiplies
      (``d H``); trained experts also keep their two matmuls' inputs (``d (H + I_e)``).

    ``index``: the layer whose attention shape the head norms take (:meth:`Architecture.attention_shape`); in a
    layer whose keys are its values (:attr:`Architecture.kv_shared_layers`) ``v_norm`` reads ``k_proj``'s output,
    which in float32 is the tensor ``k_norm`` keeps.
    """
    (nh, kv, hd), h, d = arch.attention_shape(index), arch.hidden_size, s.dtype_bytes
    full = s.full
    e, k, mi = arch.num_experts, arch.experts_per_token, arch.moe_intermediate_size
    total = (6 if d == 4 else 8) * 4 * h + 8 * 8 + (7 * 4 * h if full else 0)  # (the eight norms over H)
    total += 4 * (nh + 2 * kv) * hd + 8 * (nh + 2 * kv) + (4 * (nh + kv) * hd if full else 0)  # (q/k/v norms)
    if index in arch.kv_shared_layers and d == 4:  # (keys as values: k_norm and v_norm read one float32 tensor)
        total -= 4 * kv * hd
    total += (3 + full) * d * arch.intermediate_size  # (the dense MLP; trained: the product, down_proj's input)
    total += 4 * e + 20 * k + 4 + (2 * d * h if full else 0)  # (the router)
    if e:
        total += 28 * k + k * d * (h + 3 * mi) + (k * d * (h + mi) if full else 0)  # (the experts)
    return total


def model_activation_bytes_per_token(arch: Architecture, s: MemorySettings) -> int:
    """Bytes per token kept outside the decoder layers: the token ids (8), rotary ``cos``/``sin`` shared by the
    layers (``2 d hd``), the final RMSNorm (``4H`` + ``dH`` when trained) and, when the output head is trained,
    its input (``dH``)."""
    h, d = arch.hidden_size, s.dtype_bytes
    return 8 + 2 * d * arch.head_dim + 4 * h + (2 * d * h if s.full else 0)


def mask_bytes(arch: Architecture, s: MemorySettings, rows: int) -> int:
    """A dense ``(rows, 1, T, T)`` attention mask: the boolean mask once, and per layer the copy SDPA converts to
    the compute dtype and keeps for its backward (measured on CPU: one ``T x T`` float tensor per layer and row).
    0 for a forward without a mask."""
    if not s.dense_mask:
        return 0
    t2 = s.positions * s.positions
    return rows * t2 * (1 + arch.num_layers * s.dtype_bytes)


def kept_activation_bytes(arch: Architecture, s: MemorySettings, checkpointing: bool | None = None) -> int:
    """What the forward with grad keeps for the backward, for ``canvases_per_forward x positions`` tokens, while
    the logits are formed and undone (no layer recomputed yet).

    Without checkpointing: the sum of :func:`layer_activation_bytes_per_token` over the layers, plus
    :func:`model_activation_bytes_per_token` and the mask (:func:`mask_bytes`). With it (``checkpointing`` True,
    default ``s.gradient_checkpointing``): each layer keeps only its input ``dH`` per token (Korthikanti et al.
    §4.2, full recomputation: ``2sbhL`` bytes in 16 bits), plus the same model-level tensors and mask. With LoRA the
    residual stream needs no gradient before the first adapter: the first layer's first RMSNorm keeps nothing
    (anything else of that layer before its first adapted module is still counted, a slight over-count when the
    adapters sit late in the layer). Positions checkpointing does not cover (``s.uncheckpointed_positions``) keep
    every layer's activations with it on too; each canvas's own key/value copy (``s.kv_copy_positions``) is kept
    either way."""
    ckpt = s.gradient_checkpointing if checkpointing is None else checkpointing
    tokens = s.canvases_per_forward * s.positions
    outside = model_activation_bytes_per_token(arch, s)
    full_layers = sum(_each_layer_bytes(arch, s))
    if not s.full:  # (frozen embeddings: the first layer's first norm reads a stream that needs no gradient)
        full_layers -= 4 * arch.hidden_size
    kv_copies = s.canvases_per_forward * s.kv_copy_positions * arch.kv_cache_bytes_per_token(s.dtype_bytes)
    if ckpt:
        inputs_only = arch.num_layers * arch.hidden_size * s.dtype_bytes
        uncovered = s.canvases_per_forward * min(s.uncheckpointed_positions, s.positions)
        layers = (tokens - uncovered) * inputs_only + uncovered * full_layers
    else:
        layers = tokens * full_layers
    return int(layers + tokens * outside + kv_copies + mask_bytes(arch, s, s.canvases_per_forward))


def layer_backward_bytes(arch: Architecture, s: MemorySettings, checkpointing: bool | None = None) -> int:
    """What a decoder layer's backward adds on top of the kept activations, at its largest: with checkpointing the
    layer's activations rebuilt by its recomputation (the largest layer's :func:`layer_activation_bytes_per_token`),
    and in any case the gradients in flight. Our reading of the SwiGLU MLP's backward (its largest moment): the
    product's backward holds the incoming gradient and those of its two factors (three ``I``-wide tensors, one in
    place of the freed input of the down projection: ``2 I d`` more), next to the residual stream's gradient and
    the one being formed (``2 H d``); an MoE layer's ``I`` is ``k x`` the expert width."""
    ckpt = s.gradient_checkpointing if checkpointing is None else checkpointing
    tokens = s.canvases_per_forward * s.positions
    width = max(arch.intermediate_size, arch.experts_per_token * arch.moe_intermediate_size + arch.shared_experts
                * arch.moe_intermediate_size)
    in_flight = (2 * width + 2 * arch.hidden_size) * s.dtype_bytes
    rebuilt = max(_each_layer_bytes(arch, s)) if ckpt else 0
    return int(tokens * (rebuilt + in_flight))


def activation_bytes(arch: Architecture, s: MemorySettings, checkpointing: bool | None = None) -> int:
    """The activations' own peak in a forward with grad: the kept tensors (:func:`kept_activation_bytes`) and,
    with checkpointing, one layer rebuilt for its backward (:func:`layer_backward_bytes` without the gradients in
    flight)."""
    ckpt = s.gradient_checkpointing if checkpointing is None else checkpointing
    kept = kept_activation_bytes(arch, s, ckpt)
    if not ckpt:
        return kept
    tokens = s.canvases_per_forward * s.positions
    return kept + int(tokens * max(_each_layer_bytes(arch, s)))


def logits_peak_bytes(arch: Architecture, s: MemorySettings) -> int:
    """The most bytes the full-vocabulary logits and their gradients hold at once in a forward with grad.

    ``n`` canvases, ``T`` positions each (all of which the head scores), ``S`` scored positions, ``V`` vocabulary,
    ``d`` the weights' bytes. Our reading of dlmrl's scorer (:func:`dlmrl.estimators.scoring.score`): the head's
    output ``nTVd``; the policy's float32 copy (of all ``T`` positions for dlmrl's diffusion and block forwards, of
    the ``S`` scored ones for the AR scorer, which slices first; none in float32, where the output is already
    float32); the contiguous copy ``log_softmax`` makes of the scored slice (``nSV4``, measured with
    ``torch.profiler``'s memory timeline) and its output ``nSV4``, kept for the backward. In the backward, the gather's gradient and the log-softmax's
    gradient (``nSV4`` each, next to the kept output), then the slice's gradient over all ``T`` positions (``4``
    or ``d`` bytes, as the copy it undoes), then the head's weight gradient ``V H g`` when the head is trained.
    The peak is the largest of these moments. DiffusionGemma (``layout`` ``diffusion_gemma``) softcaps its float32
    logits (``tanh(ℓ / 30) · 30``, ``DiffusionGemmaForBlockDiffusion.forward``): the ``tanh``'s output ``nTV4`` is
    kept for its backward and held through every moment (:func:`_softcap_bytes`). With ``logprob_chunk``
    (``estimator.logits_chunk``): :func:`chunked_logits_bytes`."""
    v, d = arch.vocab_size, s.dtype_bytes
    t = _head_positions(s)  # (positions the head scores)
    n_s = s.canvases_per_forward * s.scored_positions  # (positions whose log-softmax is taken)
    if s.logprob_chunk is not None:
        return chunked_logits_bytes(arch, s)
    tv, sv = t * v, n_s * v
    # (log_softmax of a slice that leaves positions out, e.g. the prompt, first makes it contiguous: a copy)
    sliced = sv * 4 if n_s < t else 0
    if d == 4:  # (float32 weights: the head's output is the float32 logits; no copy)
        forward = tv * 4 + sliced + sv * 4
        undo = sv * 4 + tv * 4  # (the slice's gradient next to the log-softmax's)
    elif s.float_copy_all:  # (dlmrl's diffusion and block forwards convert the whole output, then slice)
        forward = max(tv * (d + 4), tv * 4 + sliced + sv * 4)
        undo = max(sv * 4 + tv * 4, tv * 4 + tv * d)  # (slice, then the float32 conversion, undone)
    else:  # (the scored positions are sliced first, then converted: a contiguous float32 copy)
        forward = tv * d + 2 * sv * 4
        undo = max(sv * 4 + sv * d, sv * d + tv * d)  # (the conversion, then the slice, undone)
    log_softmax = 3 * sv * 4  # (kept output, the gather's gradient, the log-softmax's gradient)
    head_grad = v * arch.hidden_size * _trainable_bytes(s) if s.full else 0
    head = tv * d + head_grad + t * arch.hidden_size * d  # (the head's backward: its weight's and input's gradients)
    capped = _softcap_bytes(arch, s)
    return int(max(forward + capped, log_softmax + capped, undo + capped, head))


def _head_positions(s: MemorySettings) -> int:
    """The positions the head runs over in one forward with grad, over all its canvases."""
    return s.canvases_per_forward * (s.head_positions or s.positions)


def _softcap_bytes(arch: Architecture, s: MemorySettings) -> int:
    """DiffusionGemma's softcapped logits: the float32 ``tanh`` output over the head's positions, kept for the
    backward (``n T V x 4``); 0 for the other layouts."""
    if arch.layout != "diffusion_gemma":
        return 0
    return _head_positions(s) * arch.vocab_size * 4


def chunked_logits_bytes(arch: Architecture, s: MemorySettings) -> int:
    """The logits' peak with chunked log-probs (``estimator.logits_chunk`` ``c``,
    :func:`dlmrl.models.token_scores.chunked_token_logprobs`): only the scored positions' final hidden states go
    through the head, ``c`` at a time, each chunk under non-reentrant checkpointing, so at most one chunk's
    full-vocabulary tensors exist: in the backward's recomputation the head's output ``cVd``, its float32 copy
    (``cV4`` when ``d != 4``), and the gradients of the float32 logits from ``logsumexp`` and from the chosen
    token's gather (``2 cV4``), with the gradient in ``d`` being formed (``cVd`` when ``d != 4``). Kept across the
    forward: the scored hidden states (:func:`kept_logits_bytes`)."""
    v, d = arch.vocab_size, s.dtype_bytes
    c = min(s.logprob_chunk, s.canvases_per_forward * s.scored_positions)
    return c * v * (d + (4 + d if d != 4 else 0) + 2 * 4)


def kept_logits_bytes(arch: Architecture, s: MemorySettings) -> int:
    """The part of the logits' bytes autograd keeps from the forward to the backward: the float32 ``log_softmax``
    of the scored positions, ``n S V x 4`` (DiffusionGemma: and the softcap's ``tanh``, :func:`_softcap_bytes`);
    with chunked log-probs only the scored positions' final hidden states (``n S H d``, gathered for the head)."""
    n_s = s.canvases_per_forward * s.scored_positions
    if s.logprob_chunk is not None:
        return n_s * arch.hidden_size * s.dtype_bytes
    return n_s * arch.vocab_size * 4 + _softcap_bytes(arch, s)


def rollout_weight_bytes(arch: Architecture, s: MemorySettings) -> int:
    """Sharded weights gathered whole for the rollout (``rollout_gathers_weights``): ``N x dtype bytes`` (the
    compute dtype: FSDP2's mixed-precision policy gathers bfloat16), 0 otherwise."""
    if not s.rollout_gathers_weights or _shard(s, "parameters") == 1:
        return 0
    return arch.parameter_count() * s.dtype_bytes


def kv_cache_bytes(arch: Architecture, s: MemorySettings) -> int:
    """The rollout's key/value cache at the sampler's peak: ``copies x rows x tokens x`` :meth:`Architecture.
    kv_cache_bytes_per_token` (0 without a cache; ``copies``: ``s.rollout_kv_copies``)."""
    return s.rollout_kv_copies * s.rollout_rows * s.rollout_tokens * arch.kv_cache_bytes_per_token(s.dtype_bytes)


def soft_input_bytes(arch: Architecture, s: MemorySettings) -> int:
    """The vocabulary-sized inputs of one forward with grad (``s.soft_inputs``): ``canvases x head positions x V``
    values in the weights' dtype (DiffusionGemma's detached self-conditioning logits, one per scored position)
    and, when the (tied) embedding is trained, as many again: the decoder's soft embeddings multiply the
    embedding by the inputs' softmax cast to that dtype, which the matmul keeps for the embedding's gradient
    (``DiffusionGemmaDecoderModel.forward``)."""
    if not s.soft_inputs:
        return 0
    copies = 2 if s.full else 1
    return copies * _head_positions(s) * arch.vocab_size * s.dtype_bytes


def rollout_soft_input_bytes(arch: Architecture, s: MemorySettings) -> int:
    """A sampling step's vocabulary-sized input (``s.soft_inputs``): ``rows x forward positions x V`` values in the
    weights' dtype (DiffusionGemma's self-conditioning input, the previous step's logits cast to the embeddings'
    dtype, ``generate``'s ``_denoising_step``)."""
    if not s.rollout_soft_inputs:
        return 0
    return s.rollout_rows * s.rollout_forward_positions * arch.vocab_size * s.dtype_bytes


#: float32 ``(rows, L, V)`` tensors alive at the peak of an entropy-bounded sampling step (DiffusionGemma,
#: :func:`dlmrl.models.uniform_sampler.sample_diffusion_gemma`): the head's logits (float32 whatever the weights'
#: dtype), the tempered copy ``ℓ/τ``, and, in ``Categorical(logits=ℓ/τ).entropy()``, the normalised logits, their
#: probabilities, the clamped logits and ``p · log p``
ENTROPY_BOUND_STEP_FLOAT32 = 6


def rollout_logits_bytes(arch: Architecture, s: MemorySettings) -> int:
    """One sampling step's full-vocabulary tensors (no grad), ``rows x V x`` bytes per position.

    ``rollout_sampler="gumbel"`` (masked and block samplers): the head's output over the positions the forward runs
    (``d``) and its float32 copy (``4``, when ``d != 4``), and over the block being drawn two more float32 tensors
    (the copy with the mask token removed, the confidence's) and five float64 ones, the Gumbel-max draw's uniforms,
    their logarithms and the noised logits (:func:`dlmrl.models.gumbel.add_gumbel_noise`; counted with
    ``torch.profiler``'s memory timeline at the sampler's peak, ``benchmarks/memory_plan_check.py``'s rollout
    case); or, when larger, the prompt's pass that fills the cache (its head output and float32 copy over
    ``rollout_prefill_positions``).

    ``rollout_sampler="entropy_bound"`` (DiffusionGemma): over the canvas, the head's output in the weights' dtype
    when that is not float32 (``d``) and :data:`ENTROPY_BOUND_STEP_FLOAT32` float32 tensors (the sampler's step
    1.c.ii-iii); the self-conditioning input the step reads is :func:`rollout_soft_input_bytes`. Checked against the
    measured peak of sampling calls in ``benchmarks/memory_plan_check.py``'s uniform rollout cases."""
    v, d = arch.vocab_size, s.dtype_bytes
    head = d + (4 if d != 4 else 0)  # (the head's output and its float32 copy)
    if s.rollout_sampler == "entropy_bound":  # (the float32 copy is the first of the step's float32 tensors)
        per_row = s.rollout_scored_positions * (head - 4 + ENTROPY_BOUND_STEP_FLOAT32 * 4)
    else:
        per_row = s.rollout_forward_positions * head + s.rollout_scored_positions * (2 * 4 + 5 * 8)
    return s.rollout_rows * v * max(per_row, s.rollout_prefill_positions * head)


# ------------------------------------------------------------------------------------------------ the plan


@dataclass
class MemoryPlan:
    """A plan's terms in bytes (per process) and its peak.

    Attributes:
        terms: name -> bytes: ``parameters``, ``master_weights``, ``gradients``, ``optimizer_state``,
            ``optimizer_step``, ``ddp_buckets``, ``gathered_layer``, ``reference_model``, ``activations`` (as the
            run is set up), ``activations_no_checkpointing`` / ``activations_checkpointing`` (both, for reading),
            ``logits_per_forward``, ``attention_mask``, ``rollout_kv_cache``, ``rollout_logits``,
            ``rollout_gathered_weights``.
        phases: name -> bytes at that phase's peak: ``forward_backward``, ``optimizer_step``, ``rollout``.
        peak: the largest phase.
        peak_phase: its name.
        trainable_parameters / total_parameters: counts.
        notes: what the reader should know (assumptions).
    """

    terms: dict[str, int]
    phases: dict[str, int]
    peak: int
    peak_phase: str
    total_parameters: int
    trainable_parameters: int
    notes: list[str] = field(default_factory=list)


#: the terms every phase holds (:func:`plan_memory`'s ``static``)
STATIC_TERMS = ("parameters", "master_weights", "optimizer_state", "ddp_buckets", "gathered_layer", "reference_model")
#: the terms each phase adds to :data:`STATIC_TERMS` (what the budget warning names as the largest)
PHASE_TERMS = {"forward_backward": ("activations", "logits_per_forward", "attention_mask", "gradients"),
               "optimizer_step": ("gradients", "optimizer_step"),
               "rollout": ("rollout_kv_cache", "rollout_logits", "rollout_gathered_weights"),
               "old_scores": ("scoring_gathered_weights", "logits_per_forward")}


def plan_memory(arch: Architecture, s: MemorySettings) -> MemoryPlan:
    """The memory plan of one process (all terms in bytes).

    Phases, each on top of what lives through the whole run (weights, master copy, optimizer state, a frozen
    reference copy, DDP's buckets, FSDP's gathered layer):

    - ``forward_backward``: the kept activations (:func:`kept_activation_bytes`) with the larger of the logits'
      peak (:func:`logits_peak_bytes`) and the top layer's backward (:func:`layer_backward_bytes`, after the head's
      weight gradient), and the gradients when they are already held (micro-batch chunks). Gradients
      set to ``None`` after each optimizer step do not exist when a step's forward starts; they grow in the
      backward as the activations are freed, so the end of the backward is its own phase:
    - ``optimizer_step``: the gradients and the step's temporary (:func:`optimizer_step_bytes`);
    - ``rollout``: sampling without grad: the key/value cache and one step's logits
      (:func:`kv_cache_bytes`, :func:`rollout_logits_bytes`), and sharded weights gathered whole for it
      (:func:`rollout_weight_bytes`);
    - ``old_scores`` (sharded weights only): the old-policy and reference scores, with the policy and the reference
      gathered whole (:func:`scoring_weight_bytes`) and one forward's logits.

    Args:
        arch: the model (:class:`Architecture`). s: the run (:class:`MemorySettings`).
    Returns:
        :class:`MemoryPlan`.
    """
    act_off = activation_bytes(arch, s, checkpointing=False)
    act_on = activation_bytes(arch, s, checkpointing=True)
    terms = {
        "parameters": parameter_bytes(arch, s),
        "master_weights": master_bytes(arch, s),
        "gradients": gradient_bytes(arch, s),
        "optimizer_state": optimizer_bytes(arch, s),
        "optimizer_step": optimizer_step_bytes(arch, s),
        "ddp_buckets": ddp_bucket_bytes(arch, s),
        "gathered_layer": gathered_layer_bytes(arch, s),
        "reference_model": reference_bytes(arch, s),
        "activations": act_on if s.gradient_checkpointing else act_off,
        "activations_no_checkpointing": act_off,
        "activations_checkpointing": act_on,
        "logits_per_forward": logits_peak_bytes(arch, s),
        "attention_mask": mask_bytes(arch, s, s.canvases_per_forward),
        "soft_inputs": soft_input_bytes(arch, s),
        "rollout_soft_inputs": rollout_soft_input_bytes(arch, s),
        "rollout_kv_cache": kv_cache_bytes(arch, s),
        "rollout_logits": rollout_logits_bytes(arch, s),
        "rollout_gathered_weights": rollout_weight_bytes(arch, s),
        "scoring_gathered_weights": scoring_weight_bytes(arch, s),
    }
    static = sum(terms[k] for k in STATIC_TERMS)
    kept = kept_activation_bytes(arch, s) + (kept_logits_bytes(arch, s) if s.logprob_chunk is not None else 0)
    head_grad = arch.vocab_size * arch.hidden_size * _trainable_bytes(s) if s.full else 0
    # (the forward with grad at its two largest moments: the logits formed and undone over the kept activations,
    # and the top layer's backward, rebuilt when checkpointed, after the head's gradient exists)
    moments = max(kept + terms["logits_per_forward"], kept + layer_backward_bytes(arch, s) + head_grad)
    phases = {
        "forward_backward": static + moments + terms["soft_inputs"]
        + (terms["gradients"] if s.grads_during_forward else 0),
        "optimizer_step": static + terms["gradients"] + terms["optimizer_step"],
        "rollout": static + terms["rollout_kv_cache"] + terms["rollout_logits"] + terms["rollout_soft_inputs"]
        + terms["rollout_gathered_weights"],
    }
    if terms["scoring_gathered_weights"]:  # (old and reference scores on gathered weights: a no-grad forward)
        phases["old_scores"] = static + terms["scoring_gathered_weights"] + terms["logits_per_forward"]
    peak_phase = max(phases, key=phases.get)
    return MemoryPlan(terms=terms, phases=phases, peak=phases[peak_phase], peak_phase=peak_phase,
                      total_parameters=arch.parameter_count(), trainable_parameters=trainable_parameters(arch, s))


__all__ = [
    "ASSUMED_PROMPT_TOKENS",
    "DTYPE_BYTES",
    "PHASE_TERMS",
    "SHARDING",
    "STATIC_TERMS",
    "Architecture",
    "MemoryPlan",
    "MemorySettings",
    "activation_bytes",
    "architecture_from_config",
    "chunked_logits_bytes",
    "kept_activation_bytes",
    "kept_logits_bytes",
    "kv_cache_bytes",
    "layer_activation_bytes_per_token",
    "logits_peak_bytes",
    "plan_memory",
    "rollout_logits_bytes",
    "rollout_weight_bytes",
    "scoring_weight_bytes",
]
