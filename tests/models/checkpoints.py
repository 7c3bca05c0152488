"""Tiny local checkpoints of every model family, built offline in temporary folders.

- BERT, RoBERTa and ModernBERT ``*ForMaskedLM`` with character-level tokenizers (RoBERTa's ``<pad>``
  is id 1, so its positions start at 2 as in the real model).
- A LLaDA, a Dream, an SDAR and a LLaDA2 stand-in whose model code lives next to their ``config.json`` (copied
  from ``tests/models/remote_code``) and is loaded through ``auto_map`` + ``trust_remote_code``. As in the
  real checkpoints, the LLaDA tokenizer declares no mask token (the id, 126336, comes from
  ``config.json``), the Dream tokenizer declares ``<|mask|>`` and the SDAR one ``<|MASK|>``, which their configs
  repeat (SDAR's also records its ``block_size``, 4).

:func:`isolated_remote_code` keeps ``transformers``' copies of remote code inside a temporary folder
instead of ``~/.cache/huggingface/modules``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

REMOTE_CODE = Path(__file__).parent / "remote_code"
ALPHABET = "0123456789=+ abc"
LLADA_VOCAB = 126464  # LLaDA-8B's embedding size; its mask id 126336 lies inside
LLADA_MASK = 126336
ILLADA_VOCAB = 155136  # iLLaDA-8B's vocabulary (its model card); its mask id is 5
ILLADA_MASK = 5


def char_tokenizer(specials: list[str], **roles: str) -> PreTrainedTokenizerFast:
    """Special tokens (ids 0..) then one token per character of ``ALPHABET``; left padding."""
    vocab = {tok: i for i, tok in enumerate(specials + list(ALPHABET))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=roles["unk_token"]))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, padding_side="left", clean_up_tokenization_spaces=False,
                                   **roles)


@contextlib.contextmanager
def isolated_remote_code(cache_dir: Path):
    """Point ``transformers``' dynamic-module cache at ``cache_dir`` and restore ``sys.modules`` after."""
    from transformers import dynamic_module_utils

    saved = {k: v for k, v in sys.modules.items() if k == "transformers_modules" or k.startswith("transformers_modules.")}
    for key in saved:
        del sys.modules[key]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(cache_dir))
        mp.syspath_prepend(str(cache_dir))
        try:
            yield
        finally:
            for key in [k for k in sys.modules if k == "transformers_modules" or k.startswith("transformers_modules.")]:
                del sys.modules[key]
            sys.modules.update(saved)


def _save_masked_lm(path: Path, tok, config) -> Path:
    from transformers import AutoModelForMaskedLM

    torch.manual_seed(0)
    AutoModelForMaskedLM.from_config(config).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def save_bert(path: Path) -> Path:
    from transformers import BertConfig

    tok = char_tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], pad_token="[PAD]", unk_token="[UNK]",
                         cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    config = BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64, pad_token_id=0)
    return _save_masked_lm(path, tok, config)


def save_roberta(path: Path) -> Path:
    from transformers import RobertaConfig

    tok = char_tokenizer(["<s>", "<pad>", "</s>", "<unk>", "<mask>"], bos_token="<s>", pad_token="<pad>",
                         eos_token="</s>", unk_token="<unk>", mask_token="<mask>")
    config = RobertaConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=32, max_position_embeddings=66, pad_token_id=1, bos_token_id=0,
                           eos_token_id=2)
    return _save_masked_lm(path, tok, config)


def save_modernbert(path: Path) -> Path:
    from transformers import ModernBertConfig

    tok = char_tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], pad_token="[PAD]", unk_token="[UNK]",
                         cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    config = ModernBertConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                              num_attention_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=2,
                              eos_token_id=3, cls_token_id=2, sep_token_id=3, global_attn_every_n_layers=1,
                              local_attention=16)
    return _save_masked_lm(path, tok, config)


def build_remote_model(path: Path, auto_class: str = "AutoModel"):
    """The random model of the checkpoint code in ``path`` (its ``config.json``'s ``auto_map[auto_class]``), built
    as ``dlmrl.models.compat`` loads such code under ``transformers`` 5 (the stand-ins are written for 4.x)."""
    from dlmrl.models.compat import (
        checkpoint_model_class,
        declare_tied_parameters,
        ensure_default_rope,
        load_checkpoint_config,
    )

    ensure_default_rope()
    config = load_checkpoint_config(str(path), trust_remote_code=True)
    return declare_tied_parameters(checkpoint_model_class(config, str(path), auto_class)(config))


def _save_remote(path: Path, code: str, config: dict, tok, extra: dict | None = None,
                 auto_class: str = "AutoModel") -> Path:
    """Write the stand-in's code, ``config.json``, the ``extra`` JSON files and the tokenizer, then random weights
    built from that code (its ``auto_class`` entry)."""
    path.mkdir(parents=True, exist_ok=True)
    for source in (REMOTE_CODE / code).glob("*.py"):
        shutil.copy(source, path / source.name)
    for name, content in {"config.json": config, **(extra or {})}.items():
        (path / name).write_text(json.dumps(content, indent=2))
    tok.save_pretrained(path)
    torch.manual_seed(0)
    build_remote_model(path, auto_class).save_pretrained(path, safe_serialization=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))  # exactly the fields a release has
    return path


def save_llada_like(path: Path, n_layers: int = 1) -> Path:
    tok = char_tokenizer(["<|startoftext|>", "<|endoftext|>", "<|unk|>"], bos_token="<|startoftext|>",
                         eos_token="<|endoftext|>", pad_token="<|endoftext|>", unk_token="<|unk|>")
    config = {
        "model_type": "llada",
        "architectures": ["LLaDAModelLM"],
        "auto_map": {
            "AutoConfig": "configuration_llada.LLaDAConfig",
            "AutoModel": "modeling_llada.LLaDAModelLM",
            "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
        },
        "vocab_size": LLADA_VOCAB,
        "d_model": 16,
        "n_heads": 2,
        "n_layers": n_layers,
        "mask_token_id": LLADA_MASK,
        "eos_token_id": 1,
        "pad_token_id": 1,
        "use_cache": False,
    }
    return _save_remote(path, "llada", config, tok)


def save_dream_like(path: Path) -> Path:
    tok = char_tokenizer(["<|endoftext|>", "<|im_end|>", "<|mask|>", "<|unk|>"], pad_token="<|endoftext|>",
                         eos_token="<|im_end|>", mask_token="<|mask|>", unk_token="<|unk|>")
    config = {
        "model_type": "Dream",
        "architectures": ["DreamModel"],
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
        "vocab_size": len(tok),
        "hidden_size": 16,
        "num_attention_heads": 2,
        "max_position_embeddings": 64,
        "mask_token_id": 2,  # the tokenizer's <|mask|>, as Dream's config repeats its tokenizer's 151666
        "pad_token_id": 0,
        "eos_token_id": 1,
        "use_cache": False,
    }
    generation = {"mask_token_id": 2, "pad_token_id": 0, "eos_token_id": 1, "steps": 8}  # Dream ships one
    return _save_remote(path, "dream", config, tok, {"generation_config.json": generation})


def save_sdar_like(path: Path) -> Path:
    """An SDAR/TraDo-like block-diffusion checkpoint (``AutoModelForCausalLM``): ``config.json`` with SDAR's fields
    (``block_size`` 4, ``mask_token_id`` = the tokenizer's ``<|MASK|>``, no ``pad_token_id``), Qwen3's layout
    shrunk (4 query heads of 8 over 2 key/value heads, width 16). The code needs dlmrl's flash-attn stand-in and
    ``LossKwargs`` to import, as SDAR's does (:mod:`dlmrl.models.sdar`)."""
    from dlmrl.models.sdar import ensure_loss_kwargs, install_flash_attn_fallback

    tok = char_tokenizer(["<|endoftext|>", "<|im_end|>", "<|MASK|>", "<|unk|>"], eos_token="<|endoftext|>",
                         pad_token="<|endoftext|>", mask_token="<|MASK|>", unk_token="<|unk|>")
    config = {
        "model_type": "sdar",
        "architectures": ["SDARForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_sdar.SDARConfig",
            "AutoModel": "modeling_sdar.SDARModel",
            "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM",
        },
        "vocab_size": len(tok),
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "initializer_range": 0.5,  # (SDAR: 0.02; larger here so that the random model's predictions are not uniform)
        "attention_dropout": 0.0,
        "block_size": 4,
        "mask_token_id": 2,  # the tokenizer's <|MASK|>, as SDAR's config repeats its tokenizer's 151669
        "bos_token_id": 0,
        "eos_token_id": 0,
        "use_cache": False,
        "tie_word_embeddings": False,
    }
    ensure_loss_kwargs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the stand-in's warning: flash_attn is not installed here)
        install_flash_attn_fallback()
    return _save_remote(path, "sdar", config, tok, auto_class="AutoModelForCausalLM")


def save_llada2_like(path: Path) -> Path:
    """A LLaDA2-like block-diffusion mixture-of-experts checkpoint (``AutoModelForCausalLM``): ``config.json`` with
    LLaDA2's fields (no ``block_size``, no ``mask_token_id``: the family's defaults and the tokenizer's ``<|mask|>``
    apply), a dense first layer then 4 experts (2 per token) and a shared one, width 16."""
    tok = char_tokenizer(["<|endoftext|>", "<|mask|>", "<|role_end|>", "<|unk|>"], eos_token="<|endoftext|>",
                         pad_token="<|endoftext|>", mask_token="<|mask|>", unk_token="<|unk|>")
    config = {
        "model_type": "llada2_moe",
        "architectures": ["LLaDA2MoeModelLM"],
        "auto_map": {
            "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
            "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
            "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM",
        },
        "vocab_size": len(tok),
        "hidden_size": 16,
        "intermediate_size": 32,
        "moe_intermediate_size": 8,
        "num_hidden_layers": 2,
        "first_k_dense_replace": 1,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_shared_experts": 1,
        "routed_scaling_factor": 2.5,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "partial_rotary_factor": 0.5,
        "rms_norm_eps": 1e-6,
        "rope_theta": 600000,
        "initializer_range": 0.5,  # (LLaDA2: 0.02; larger here so that the random model's predictions are not uniform)
        "attention_dropout": 0.0,
        "pad_token_id": 0,
        "use_cache": False,
        "tie_word_embeddings": False,
    }
    return _save_remote(path, "llada2", config, tok, auto_class="AutoModelForCausalLM")


def save_llada_moe_like(path: Path, mask_in_vocabulary: bool = True, expert_bias: bool = False) -> Path:
    """A LLaDA-MoE-like masked-diffusion mixture-of-experts checkpoint (``AutoModel``): ``config.json`` with the
    release's fields (``model_type "llada"`` as dense LLaDA's, told apart by ``architectures`` / ``auto_map``; no
    ``mask_token_id``), 2 layers of 4 experts (2 per token), width 16. The tokenizer names no mask token but holds
    ``<|mask|>`` (id 1; the real one's is 156895), from which dlmrl reads the mask id; ``mask_in_vocabulary=False``
    leaves it out (such a checkpoint names its mask nowhere); ``expert_bias=True`` turns on the router's expert bias,
    which the code adds to the softmax output in place (every backward pass then fails, as the real code's)."""
    specials = ["<|endoftext|>", "<|mask|>" if mask_in_vocabulary else "<|pad|>", "<|role_end|>", "<|unk|>"]
    tok = char_tokenizer(specials, eos_token="<|endoftext|>", pad_token="<|endoftext|>", unk_token="<|unk|>")
    config = {
        "model_type": "llada",
        "architectures": ["LLaDAMoEModelLM"],
        "auto_map": {
            "AutoConfig": "configuration_lladamoe.LLaDAConfig",
            "AutoModel": "modeling_lladamoe.LLaDAMoEModelLM",
            "AutoModelForCausalLM": "modeling_lladamoe.LLaDAMoEModelLM",
        },
        "vocab_size": len(tok),
        "hidden_size": 16,
        "dense_intermediate_size": 32,
        "expert_intermediate_size": 8,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "moe_layer_freq": [1, 1],
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_router_enable_expert_bias": False,  # (as we read the release: the code's in-place add breaks backward)
        "qk_layernorm": True,
        "partial_rotary_factor": 1.0,
        "rope_theta": 50000,
        "rms_norm_eps": 1e-5,
        "initializer_range": 0.5,  # (LLaDA-MoE: 0.02; larger here so that the random model's predictions are not uniform)
        "attention_dropout": 0.0,
        "pad_token_id": 0,
        "eos_token_id": 0,
        "use_cache": False,
        "tie_word_embeddings": False,
    }
    config["moe_router_enable_expert_bias"] = expert_bias
    return _save_remote(path, "llada_moe", config, tok)


def save_illada_like(path: Path, mask_in_config: bool = True) -> Path:
    """An iLLaDA-like checkpoint: LLaDA's code (the ``llada`` stand-in) with iLLaDA's vocabulary of 155,136 and mask id 5
    (ML-GSAI/LLaDA's README: iLLaDA reuses LLaDA's inference code with ``mask_id=5``), in ``config.json`` unless
    ``mask_in_config`` is False, and its tied embedding and head (``weight_tying``). The tokenizer declares no mask token, as LLaDA's; its id 5 is ``<|mask|>`` (the
    real token's name is not known here)."""
    tok = char_tokenizer(["<|startoftext|>", "<|endoftext|>", "<|unk|>", "<|start_header_id|>", "<|end_header_id|>",
                          "<|mask|>", "<|eot_id|>"], bos_token="<|startoftext|>", eos_token="<|endoftext|>",
                         pad_token="<|endoftext|>", unk_token="<|unk|>")
    config = {
        "model_type": "llada",
        "architectures": ["LLaDAModelLM"],
        "auto_map": {
            "AutoConfig": "configuration_llada.LLaDAConfig",
            "AutoModel": "modeling_llada.LLaDAModelLM",
            "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
        },
        "vocab_size": ILLADA_VOCAB,
        "d_model": 16,
        "n_heads": 2,
        "n_layers": 1,
        **({"mask_token_id": ILLADA_MASK} if mask_in_config else {}),
        "weight_tying": True,
        "eos_token_id": 1,
        "pad_token_id": 1,
        "use_cache": False,
    }
    return _save_remote(path, "llada", config, tok)


def save_fast_dllm_v2_like(path: Path) -> Path:
    """A Fast-dLLM v2-like block-diffusion checkpoint (``AutoModelForCausalLM``, code in ``modeling.py`` /
    ``configuration.py``): ``config.json`` with the release's fields (the block size as ``bd_size``, 4 here; no
    ``mask_token_id``), a tokenizer that lists ``|<MASK>|`` as an additional special token, not as ``mask_token`` (as
    the release's), width 16."""
    tok = char_tokenizer(["<|endoftext|>", "<|im_end|>", "|<MASK>|", "<|unk|>"], eos_token="<|im_end|>",
                         pad_token="<|endoftext|>", unk_token="<|unk|>", additional_special_tokens=["|<MASK>|"])
    config = {
        "model_type": "Fast_dLLM_Qwen",
        "architectures": ["Fast_dLLM_QwenForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration.Fast_dLLM_QwenConfig",
            "AutoModel": "modeling.Fast_dLLM_QwenModel",
            "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM",
        },
        "vocab_size": len(tok),
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "initializer_range": 0.5,  # (the release: 0.02; larger so that the random model's predictions are not uniform)
        "attention_dropout": 0.0,
        "bd_size": 4,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 1,
        "use_cache": True,
        "tie_word_embeddings": False,
    }
    return _save_remote(path, "fast_dllm_v2", config, tok, auto_class="AutoModelForCausalLM")


BUILDERS = {
    "bert": save_bert,
    "roberta": save_roberta,
    "modernbert": save_modernbert,
    "llada": save_llada_like,
    "dream": save_dream_like,
    "sdar": save_sdar_like,
    "llada2": save_llada2_like,
    "llada_moe": save_llada_moe_like,
}
#: expected detected family of each checkpoint
FAMILY_OF = {"bert": "masked_lm", "roberta": "masked_lm", "modernbert": "masked_lm", "llada": "llada",
             "dream": "dream", "sdar": "sdar", "llada2": "llada2",
             "llada_moe": "llada_moe"}
