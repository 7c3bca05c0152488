"""Tiny random LLaDA, Dream, SDAR and LLaDA2 checkpoints built from the model code of a local clone (for
``remote_code_check.py``, ``sdar_parity.py`` and ``llada2_parity.py``).

The clone's own ``configuration_*.py`` / ``modeling_*.py`` (and Dream's ``generation_utils.py`` and
``tokenization_dream.py``) are copied next to a ``config.json`` with the published checkpoint's fields, the sizes
shrunk (:data:`SHRINK`), the real vocabulary and mask id kept. Nothing of the clone is stored in dlmrl: the files are
read from the clone when the checkpoint is built. The weights are random (:func:`init_weights`), the tokenizer is
character-level with the real special tokens at their real ids.

Published fields: ``config.json`` of ``GSAI-ML/LLaDA-8B-Instruct`` (:data:`LLADA_CONFIG`), of
``Dream-org/Dream-v0-Instruct-7B`` (:data:`DREAM_CONFIG`) and of SDAR-4B-Chat (:data:`SDAR_CONFIG`, as JetAstra/SDAR
ships it in ``training/model/SDAR-4B-Chat/``); a clone that holds a ``config.json`` next to the code
(a ``git clone`` of the hub repository) gives its own instead.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

#: The code files of each family (the first two are required).
CODE_FILES = {
    "llada": ("configuration_llada.py", "modeling_llada.py"),
    "dream": ("configuration_dream.py", "modeling_dream.py", "generation_utils.py", "tokenization_dream.py"),
    "sdar": ("configuration_sdar.py", "modeling_sdar.py", "fused_linear_diffusion_cross_entropy.py"),
    "llada2": ("configuration_llada2_moe.py", "modeling_llada2_moe.py"),
    "llada_moe": ("configuration_lladamoe.py", "modeling_lladamoe.py"),
}
#: The ``transformers`` auto class each family's checkpoints load with.
AUTO_CLASS = {"llada": "AutoModel", "dream": "AutoModel", "sdar": "AutoModelForCausalLM",
              "llada2": "AutoModelForCausalLM", "llada_moe": "AutoModel"}
#: GSAI-ML/LLaDA-8B-Instruct's config.json, before :data:`SHRINK`.
LLADA_CONFIG = {
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
    "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
    "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModel": "modeling_llada.LLaDAModelLM",
                 "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"},
    "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": 4096,
    "embedding_dropout": 0.0, "embedding_size": 126464, "eos_token_id": 126081, "flash_attention": False,
    "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
    "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
    "layer_norm_with_affine": True, "mask_token_id": 126336, "max_sequence_length": 4096, "mlp_hidden_size": 12288,
    "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None, "n_heads": 32, "n_kv_heads": 32,
    "n_layers": 32, "pad_token_id": 126081, "precision": "amp_bf16", "residual_dropout": 0.0, "rms_norm_eps": 1e-05,
    "rope": True, "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False,
    "transformers_version": "4.46.3", "use_cache": False, "vocab_size": 126464, "weight_tying": False,
}
#: Dream-org/Dream-v0-Instruct-7B's config.json, before :data:`SHRINK`.
DREAM_CONFIG = {
    "architectures": ["DreamModel"], "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
    "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
    "initializer_range": 0.02, "intermediate_size": 18944, "mask_token_id": 151666, "max_position_embeddings": 131072,
    "max_window_layers": 28, "model_type": "Dream", "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "pad_token_id": 151643, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.46.2", "use_cache": False, "use_sliding_window": False, "vocab_size": 152064,
}
#: SDAR-4B-Chat's config.json (JetAstra/SDAR ``training/model/SDAR-4B-Chat/config.json``), before :data:`SHRINK`.
SDAR_CONFIG = {
    "architectures": ["SDARForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                 "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
    "attention_bias": False, "attention_dropout": 0.0, "attn_implementation": "flex_attention",
    "bos_token_id": 151643, "debug": False, "eos_token_id": 151643, "block_size": 4, "mask_token_id": 151669,
    "ep_size": 1, "fuse_cross_entropy": True, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560,
    "initializer_range": 0.02, "intermediate_size": 9728, "max_position_embeddings": 32768, "max_window_layers": 36,
    "micro_forward": False, "model_type": "sdar", "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "skip_checkpoint": False, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.52.4", "use_cache": False, "use_deepep": False, "use_sliding_window": False,
    "vocab_size": 151936,
}
#: inclusionAI/LLaDA2.0-mini's config.json, before :data:`SHRINK`: the fields as published copies list them (the hub
#: is not reachable from here; a ``git clone`` of the hub repository gives its own ``config.json`` instead). The three
#: dropouts and ``use_bias`` are our reading (``LLaDA2MoeConfig`` defaults them to 0.1 and True; Ling 2.0, the model it
#: was converted from, sets 0.0 and False).
LLADA2_CONFIG = {
    "architectures": ["LLaDA2MoeModelLM"],
    "auto_map": {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                 "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
                 "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
    "attention_dropout": 0.0, "embedding_dropout": 0.0, "output_dropout": 0.0, "use_bias": False,
    "first_k_dense_replace": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5120, "max_position_embeddings": 32768, "model_type": "llada2_moe", "moe_intermediate_size": 512,
    "moe_router_enable_expert_bias": True, "n_group": 8, "norm_head": False, "norm_topk_prob": True,
    "num_attention_heads": 16, "num_experts": 256, "num_experts_per_tok": 8, "num_hidden_layers": 20,
    "num_key_value_heads": 4, "num_shared_experts": 1, "output_router_logits": False, "pad_token_id": 156892,
    "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-06, "rope_theta": 600000, "routed_scaling_factor": 2.5,
    "score_function": "sigmoid", "tie_word_embeddings": False, "topk_group": 4, "torch_dtype": "bfloat16",
    "use_qk_norm": True, "use_qkv_bias": False, "vocab_size": 157184,
}
#: inclusionAI/LLaDA-MoE-7B-A1B-Instruct's config.json as we read it, before :data:`SHRINK` (the hub is not reachable
#: from here; a ``git clone`` of the hub repository gives its own ``config.json`` instead). Sources: the ``model_type``
#: ``"llada"`` and the ``auto_map`` of ``configuration_lladamoe.LLaDAConfig`` / ``modeling_lladamoe.LLaDAMoEModelLM``
#: are what ZHZisZZ/dllm's README tells users to overwrite for its renamed copy (``"lladamoe"``,
#: ``LLaDAMoEConfig``) and what InfiniTensor/InfiniLM's copy of ``configuration_lladamoe.py`` declares; 16 layers,
#: width 2048, 16 heads of 128, 64 experts of width 1024 with 8 per token, no shared expert, QK-norm and the
#: vocabulary 157,184 (Ling's tokenizer: ``<|endoftext|>`` 156892, ``<|mask|>`` 156895, the model card's ``mask_id``)
#: from published descriptions of the checkpoint; no ``mask_token_id`` (absent from its ``config.json``). The RoPE
#: base, ``partial_rotary_factor`` and ``dense_intermediate_size`` are our reading, and so is the expert bias being off:
#: the code adds it to the router's softmax output in place, which makes every backward pass fail
#: (``benchmarks/llada_moe_parity.py`` shows it), yet dllm fine-tunes LLaDA-MoE with that code and llama.cpp's
#: converter maps no expert-bias tensor.
LLADA_MOE_CONFIG = {
    "architectures": ["LLaDAMoEModelLM"],
    "auto_map": {"AutoConfig": "configuration_lladamoe.LLaDAConfig", "AutoModel": "modeling_lladamoe.LLaDAMoEModelLM",
                 "AutoModelForCausalLM": "modeling_lladamoe.LLaDAMoEModelLM"},
    "model_type": "llada", "attention_bias": False, "attention_dropout": 0.0, "clip_qkv": None,
    "dense_intermediate_size": 8192, "eos_token_id": 156892, "expert_intermediate_size": 1024, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "max_position_embeddings": 8192,
    "moe_layer_freq": [1] * 16, "moe_router_enable_expert_bias": False, "moe_router_score_function": "softmax",
    "norm_topk_prob": False, "num_attention_heads": 16, "num_experts": 64, "num_experts_per_tok": 8,
    "num_hidden_layers": 16, "num_key_value_heads": 16, "output_router_logits": False, "pad_token_id": 156892,
    "partial_rotary_factor": 1.0, "qk_layernorm": True, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 50000, "router_aux_loss_coef": 0.01, "shared_expert_intermediate_size": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": False, "vocab_size": 157184,
}
#: The size fields replaced (width 64, 4 heads, 2 layers); vocabulary, mask id and every other field stay.
SHRINK = {
    "llada": {"d_model": 64, "n_heads": 4, "n_kv_heads": 4, "n_layers": 2, "mlp_hidden_size": 128},
    "dream": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "max_window_layers": 2},
    "sdar": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "num_hidden_layers": 2, "max_window_layers": 2},
    "llada2": {"hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2, "num_experts": 8,
               "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2},
    "llada_moe": {"hidden_size": 64, "dense_intermediate_size": 128, "expert_intermediate_size": 32,
                  "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "moe_layer_freq": [1, 1],
                  "num_experts": 8, "num_experts_per_tok": 2},
}
#: Special tokens at their ids in the real tokenizers (LLaDA-8B-Instruct's; Dream's Qwen2 vocabulary).
SPECIALS = {
    "llada": {"<|startoftext|>": 126080, "<|endoftext|>": 126081, "<|mdm_mask|>": 126336,
              "<|start_header_id|>": 126346, "<|end_header_id|>": 126347, "<|eot_id|>": 126348},
    "dream": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|beginoftext|>": 151665,
              "<|mask|>": 151666},
    "sdar": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|MASK|>": 151669},
    # (LLaDA2's generate: eos_id 156892, mask_id 156895; the token names are our reading)
    "llada2": {"<|endoftext|>": 156892, "<|mask|>": 156895},
    # (LLaDA-MoE: Ling's tokenizer as LLaDA2's; the model card's generate uses mask_id 156895)
    "llada_moe": {"<|endoftext|>": 156892, "<|mask|>": 156895, "<|role_end|>": 156900},
}
CHAT_TEMPLATES = {  # the shape of each release's chat template (dlmrl's text tasks render prompts with it)
    "llada": "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
             "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
             "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
    "dream": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
}
CHAT_TEMPLATES["sdar"] = CHAT_TEMPLATES["dream"]  # (Qwen's ChatML)
CHAT_TEMPLATES["llada2"] = ("{% for m in messages %}<role>{{ m['role'] | upper }}</role>{{ m['content'] }}{% endfor %}"
                            "{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}")  # (Ling's role tags)
CHAT_TEMPLATES["llada_moe"] = ("{% for m in messages %}<role>{{ m['role'] | upper }}</role>{{ m['content'] }}"
                               "<|role_end|>{% endfor %}{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}")
MASK_IDS = {"llada": 126336, "dream": 151666, "sdar": 151669, "llada2": 156895, "llada_moe": 156895}


@dataclass(frozen=True)
class CodeSource:
    """Where a family's model code was found: the folder, and the clone's commit."""

    family: str
    folder: Path
    clone: Path
    commit: str


def clone_commit(clone: Path) -> str:
    """``git rev-parse HEAD`` of the clone (``"unknown"`` outside a git work tree)."""
    out = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=False)
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def find_code(clones: list[Path], families: tuple[str, ...] = ("llada", "dream")) -> dict[str, CodeSource]:
    """The folder of each family's model code in the clones (the first found)."""
    found: dict[str, CodeSource] = {}
    for clone in clones:
        for family in families:
            files = CODE_FILES[family]
            for config_file in sorted(clone.rglob(files[0])):
                folder = config_file.parent
                if family not in found and (folder / files[1]).exists():
                    found[family] = CodeSource(family, folder, clone, clone_commit(clone))
    return found


def find_function(clones: list[Path], file: str, name: str, param: str) -> tuple[Path, str] | None:
    """``(path, commit)`` of the first ``file`` in the clones whose text defines ``def name(`` with ``param``."""
    for clone in clones:
        for path in sorted(clone.rglob(file)):
            text = path.read_text(errors="replace")
            head = text.split(f"def {name}(", 1)
            if len(head) == 2 and param in head[1].split(")", 1)[0]:
                return path, clone_commit(clone)
    return None


def checkpoint_config(source: CodeSource) -> dict:
    """The published ``config.json`` (the clone's own, when it has one) with :data:`SHRINK` applied."""
    own = source.folder / "config.json"
    base = json.loads(own.read_text()) if own.exists() else {"llada": LLADA_CONFIG, "dream": DREAM_CONFIG,
                                                             "sdar": SDAR_CONFIG, "llada2": LLADA2_CONFIG,
                                                             "llada_moe": LLADA_MOE_CONFIG}[source.family]
    config = {**base, **SHRINK[source.family]}
    if source.family == "llada_moe" and not own.exists():
        config.update(_config_class_fields(source.folder / CODE_FILES["llada_moe"][0]))
    return config


def _config_class_fields(file: Path) -> dict:
    """``model_type`` and ``auto_map["AutoConfig"]`` of the ``PretrainedConfig`` subclass ``file`` defines: a copy of
    LLaDA-MoE's code may rename it (ZHZisZZ/dllm's ``LLaDAMoEConfig``, ``model_type "lladamoe"``; the hub's is
    ``LLaDAConfig``, ``"llada"``), and its ``config.json`` must name the class it has."""
    import re

    text = file.read_text()
    name = re.search(r"^class (\w+)\(PretrainedConfig\)", text, re.MULTILINE).group(1)
    model_type = re.search(r'^\s+model_type = "([^"]+)"', text, re.MULTILINE).group(1)
    return {"model_type": model_type, "auto_map": {**LLADA_MOE_CONFIG["auto_map"],
                                                   "AutoConfig": f"{file.stem}.{name}"}}


#: How much larger the output rows of the tokenizer's characters are drawn (:func:`init_weights`): enough that sampled
#: completions mix characters with the rest of the vocabulary, so a text reward varies within a group. LLaDA2's
#: random 157,184-token head needs more than the others (at 1.5 nearly every sampled token decodes to nothing).
TEXT_GAIN = {"llada2": 2.0}


def init_weights(model: torch.nn.Module, text_ids: int, seed: int = 0, text_gain: float = 1.5) -> None:
    """Random weights with confident, position-dependent predictions (ties in the samplers' confidence ranking
    would make greedy parity a matter of float rounding): every matrix ``N(0, 1/fan_in)·4`` (embeddings ``N(0, 1)``),
    norms 1, biases 0; the output rows of the tokenizer's first ``text_ids`` ids (its characters or bytes)
    ``text_gain`` times larger, so that sampled completions decode to text a reward can score."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                std = 1.0 if "wte" in name or "embed" in name else 4.0 / p.shape[1] ** 0.5
                p.copy_(torch.randn(p.shape, generator=g) * std)
            else:
                p.fill_(1.0 if "norm" in name or "ln_f" in name else 0.0)
        model.get_output_embeddings().weight[:text_ids] *= text_gain


def _char_vocab() -> list[str]:
    return [chr(c) for c in range(32, 127)] + ["\n"]


def save_fast_tokenizer(path: Path, family: str) -> None:
    """A character-level ``PreTrainedTokenizerFast`` with the family's special tokens at their real ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = _char_vocab()
    vocab = {c: i for i, c in enumerate(chars)} | {"<|unk|>": len(chars)} | SPECIALS[family]
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    names = list(SPECIALS[family])
    roles = {
        "llada": {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
        "dream": {"bos_token": "<|beginoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                  "mask_token": "<|mask|>"},
        "sdar": {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "mask_token": "<|MASK|>"},
        "llada2": {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "mask_token": "<|mask|>"},
        # (no mask_token role: dlmrl finds <|mask|> in the vocabulary, dlmrl.models.llada_moe)
        "llada_moe": {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    }[family]
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<|unk|>", padding_side="left",
                                  additional_special_tokens=[n for n in names if n not in roles.values()], **roles)
    tok.chat_template = CHAT_TEMPLATES[family]
    tok.save_pretrained(path)


def save_dream_tokenizer(path: Path) -> None:
    """Files for the clone's ``tokenization_dream.DreamTokenizer`` (byte-level BPE): the 256 byte symbols as the
    vocabulary (GPT-2's byte-to-unicode table, the tokenizer's own ``bytes_to_unicode``), no merges, and the
    special tokens at their Qwen2 ids, loaded through ``auto_map`` as Dream's ``tokenizer_config.json`` does."""
    byte_symbols = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in byte_symbols:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    (path / "vocab.json").write_text(json.dumps({table[b]: b for b in range(256)}))
    (path / "merges.txt").write_text("#version: 0.2\n")
    added = {str(i): {"content": t, "lstrip": False, "rstrip": False, "normalized": False, "single_word": False,
                      "special": True} for t, i in SPECIALS["dream"].items()}
    (path / "tokenizer_config.json").write_text(json.dumps({
        "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "tokenizer_class": "DreamTokenizer", "added_tokens_decoder": added, "bos_token": "<|beginoftext|>",
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "mask_token": "<|mask|>", "unk_token": None,
        "clean_up_tokenization_spaces": False, "errors": "replace", "split_special_tokens": False,
        "model_max_length": 131072, "padding_side": "left", "chat_template": CHAT_TEMPLATES["dream"],
    }, indent=1))


def build_checkpoint(source: CodeSource, out: Path) -> Path:
    """Write the tiny random checkpoint of ``source`` into ``out`` (code, config, tokenizer, safetensors)."""
    from dlmrl.models.compat import checkpoint_model_class, ensure_default_rope, load_checkpoint_config

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in CODE_FILES[source.family]:
        if (source.folder / name).exists():
            shutil.copy(source.folder / name, out / name)
    config = checkpoint_config(source)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if source.family == "dream" and (out / "tokenization_dream.py").exists():
        save_dream_tokenizer(out)
        text_ids = 256  # the byte symbols
    else:
        save_fast_tokenizer(out, source.family)
        text_ids = len(_char_vocab())
    ensure_default_rope()
    if source.family == "sdar":
        from dlmrl.models.sdar import ensure_loss_kwargs, install_flash_attn_fallback

        ensure_loss_kwargs()
        install_flash_attn_fallback()
    built = load_checkpoint_config(str(out), trust_remote_code=True)
    model = checkpoint_model_class(built, str(out), AUTO_CLASS[source.family])(built)
    init_weights(model, text_ids, text_gain=TEXT_GAIN.get(source.family, 1.5))
    model.save_pretrained(out, safe_serialization=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))  # the release's fields, as written
    if source.family == "dream":  # (Dream's from_pretrained reads it as a DreamGenerationConfig)
        ids = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id", "mask_token_id")}
        (out / "generation_config.json").write_text(json.dumps(ids, indent=2))
    return out
