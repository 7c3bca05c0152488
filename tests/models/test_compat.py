"""The transformers-5 patches of ``dlmrl.models.compat``, each on the stand-in that reproduces what it fixes.

The stand-ins (``tests/models/remote_code``) are written for transformers 4 in the ways LLaDA's and Dream's
published files are. Each test first shows the failure under plain transformers 5 (a fresh copy of the stand-in's
module, unpatched), then that the patch removes it. Nothing is downloaded.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import modeling_rope_utils
from transformers.dynamic_module_utils import get_class_from_dynamic_module

from dlmrl.models import compat
from dlmrl.models.compat import (
    CheckpointCodeError,
    default_rope_parameters,
    ensure_default_rope,
    load_checkpoint_config,
    load_checkpoint_model,
    patch_config,
    patch_model_class,
    restore_rotary_buffers,
)
from dlmrl.models.families import FAMILIES, left_padding
from dlmrl.models.loading import load_policy, needs_remote_code
from dlmrl.models.lora import enable_gradient_checkpointing
from tests.models.checkpoints import isolated_remote_code, save_dream_like, save_llada_like

#: float32 ``θ^x`` is within a few ulps of the exact power: 4 float32 epsilons relative
RTOL_F32 = 4 * torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    root = tmp_path_factory.mktemp("compat")
    with isolated_remote_code(root / "built"):
        paths = {"llada": save_llada_like(root / "llada"), "dream": save_dream_like(root / "dream")}
    return paths


@pytest.fixture
def fresh_class(tmp_path):
    """``(family, auto_class) -> class`` imported from a fresh module cache: the stand-in's code, unpatched."""
    def get(paths, family, auto_class="AutoModel"):
        config = load_checkpoint_config(str(paths[family]), trust_remote_code=True)
        return get_class_from_dynamic_module(config.auto_map[auto_class], str(paths[family])), config

    with isolated_remote_code(tmp_path / "fresh"):
        yield get


# ---------------------------------------------------------------------------------------------- RoPE (4)


def test_default_rope_parameters_are_plain_rope():
    # head dim 16 / 2 = 8: inv_freq_i = 10000^(-2i/8) = 1, 0.1, 0.01, 0.001
    config = SimpleNamespace(rope_theta=10000.0, hidden_size=16, num_attention_heads=2)
    inv_freq, scaling = default_rope_parameters(config)
    torch.testing.assert_close(inv_freq, torch.tensor([1.0, 0.1, 0.01, 0.001]), rtol=RTOL_F32, atol=0.0)
    assert scaling == 1.0 and inv_freq.dtype == torch.float32
    half = SimpleNamespace(rope_theta=100.0, head_dim=4, partial_rotary_factor=0.5, hidden_size=99,
                           num_attention_heads=1)  # d = 4 · 0.5 = 2: one frequency, 100^0 = 1
    assert default_rope_parameters(half)[0].tolist() == [1.0]
    by_kwargs, _ = default_rope_parameters(None, base=10000.0, dim=4)  # 4.x's fallback: 1, 10000^(-1/2)
    torch.testing.assert_close(by_kwargs, torch.tensor([1.0, 0.01]), rtol=RTOL_F32, atol=0.0)
    from_parameters = SimpleNamespace(rope_parameters={"rope_theta": 10000.0}, hidden_size=4, num_attention_heads=1)
    torch.testing.assert_close(default_rope_parameters(from_parameters)[0], by_kwargs, rtol=RTOL_F32, atol=0.0)
    with pytest.raises(CheckpointCodeError, match="rope_theta"):
        default_rope_parameters(SimpleNamespace(hidden_size=4, num_attention_heads=1))


def test_default_rope_is_registered_only_when_absent(monkeypatch):
    monkeypatch.delitem(modeling_rope_utils.ROPE_INIT_FUNCTIONS, "default", raising=False)
    assert ensure_default_rope() is True
    assert modeling_rope_utils.ROPE_INIT_FUNCTIONS["default"] is default_rope_parameters
    assert ensure_default_rope() is False
    mine = object()
    monkeypatch.setitem(modeling_rope_utils.ROPE_INIT_FUNCTIONS, "default", mine)
    assert ensure_default_rope() is False and modeling_rope_utils.ROPE_INIT_FUNCTIONS["default"] is mine


def test_dream_needs_the_default_rope_entry(stand_ins, fresh_class, monkeypatch):
    cls, config = fresh_class(stand_ins, "dream")
    monkeypatch.delitem(modeling_rope_utils.ROPE_INIT_FUNCTIONS, "default", raising=False)
    with pytest.raises(KeyError, match="default"):  # transformers 5 has no "default" entry
        cls(config)
    ensure_default_rope()
    assert cls(config).rotary_emb.inv_freq.shape == (4,)


# ----------------------------------------------------------------------------------------- use_cache (3)


def test_use_cache_is_popped_by_transformers_5_and_restored(stand_ins, fresh_class):
    cls, _ = fresh_class(stand_ins, "llada")
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(stand_ins["llada"], trust_remote_code=True)
    assert "use_cache" not in vars(config)  # config.json says false; PretrainedConfig popped it
    model = patch_model_class(cls)(config)
    with pytest.raises(AttributeError, match="use_cache"):
        model(torch.tensor([[5, 6]]))
    assert patch_config(config, {"use_cache": True}).use_cache is True  # config.json's value
    assert patch_config(config, {"use_cache": False}).use_cache is True  # set once, never overwritten
    fresh = AutoConfig.from_pretrained(stand_ins["llada"], trust_remote_code=True)
    assert patch_config(fresh).use_cache is False  # LLaDAConfig's and DreamConfig's default
    assert model(torch.tensor([[5, 6]])).logits.shape == (1, 2, config.vocab_size)


# ------------------------------------------------------------------------------ post_init, tie_weights (1, 2)


def test_llada_without_post_init_does_not_load_until_patched(stand_ins, fresh_class):
    cls, config = fresh_class(stand_ins, "llada")
    with pytest.raises(AttributeError, match="all_tied_weights_keys"):
        cls.from_pretrained(stand_ins["llada"], config=config, use_safetensors=True)
    model = patch_model_class(cls).from_pretrained(stand_ins["llada"], config=config, use_safetensors=True)
    assert "all_tied_weights_keys" in vars(model)
    assert patch_model_class(cls) is cls and cls.__init__.__wrapped__ is not None  # patched once


def test_tie_weights_accepts_transformers_5_keywords_and_keeps_its_rule(stand_ins, fresh_class):
    cls, config = fresh_class(stand_ins, "llada")
    with pytest.raises(TypeError):
        cls.tie_weights(SimpleNamespace(config=SimpleNamespace(weight_tying=False)), missing_keys=set(),
                        recompute_mapping=False)
    patch_model_class(cls)
    config.weight_tying = True
    model = cls(config)  # post_init -> tie_weights(recompute_mapping=False) now runs LLaDA's own rule
    assert model.model.transformer.ff_out.weight is model.model.transformer.wte.weight


# ----------------------------------------------------------------------------- list _tied_weights_keys (5)


def test_list_tied_weights_keys_become_transformers_5_mapping(stand_ins, fresh_class, tmp_path):
    ensure_default_rope()
    cls, config = fresh_class(stand_ins, "dream")
    with pytest.raises(AttributeError, match="'list' object has no attribute 'keys'"):
        cls(config).save_pretrained(tmp_path / "unpatched")
    model = patch_model_class(cls)(config)
    assert model._tied_weights_keys == {"lm_head.weight": "embed_tokens.weight"}
    model.save_pretrained(tmp_path / "patched")
    assert (tmp_path / "patched" / "model.safetensors").exists()


# --------------------------------------------------------------------------------- GenerationConfig (6)


def test_generation_config_validate_accepts_transformers_5_keywords(stand_ins, fresh_class):
    cls, _ = fresh_class(stand_ins, "dream")
    import sys

    generation_config_class = vars(sys.modules[cls.__module__])["DreamGenerationConfig"]
    with pytest.raises(TypeError, match="user_set_attributes"):
        generation_config_class(steps=4).update(steps=3)
    patch_model_class(cls)
    config = generation_config_class(steps=4)
    config.update(steps=3)
    assert config.steps == 3


# ------------------------------------------------------------------------------------ rotary buffers (7)


def test_rotary_buffers_are_recomputed_after_loading(stand_ins, fresh_class, monkeypatch):
    """transformers 5 recreates non-persistent buffers with torch.empty_like and refills them only through
    _init_weights; filling the empty tensors with NaN makes what the stand-in's _init_weights leaves visible."""
    ensure_default_rope()
    cls, config = fresh_class(stand_ins, "dream")
    patch_model_class(cls)
    empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: empty_like(t, **kw).fill_(math.nan))
    loaded = cls.from_pretrained(stand_ins["dream"], config=config, use_safetensors=True)
    assert torch.isnan(loaded.rotary_emb.inv_freq).all()  # the bug: no error, garbage frequencies
    restore_rotary_buffers(loaded)
    expected = torch.tensor([1.0, 0.1, 0.01, 0.001])  # 10000^(-2i/8), head dim 8
    torch.testing.assert_close(loaded.rotary_emb.inv_freq, expected, rtol=RTOL_F32, atol=0.0)
    through_dlmrl = load_checkpoint_model(str(stand_ins["dream"]), True, torch.float32)
    torch.testing.assert_close(through_dlmrl.rotary_emb.inv_freq, expected, rtol=RTOL_F32, atol=0.0)


# ----------------------------------------------------------------------------------- what no patch covers


def test_an_uncovered_failure_names_the_code_and_transformers(stand_ins, monkeypatch):
    def broken(*args, **kwargs):
        raise AttributeError("'Broken' object has no attribute 'frobnicate'")

    fake = type("Broken", (), {"from_pretrained": classmethod(broken), "__module__": "transformers_modules.x.m"})
    monkeypatch.setattr(compat, "checkpoint_model_class", lambda *a, **k: fake)
    with pytest.raises(CheckpointCodeError, match=r"transformers_modules\.x\.m\.Broken.*transformers 5.*frobnicate"):
        load_checkpoint_model(str(stand_ins["llada"]), True, torch.float32)


def test_code_another_checkpoint_registered_still_needs_trust(monkeypatch):
    from transformers import CONFIG_MAPPING

    registered = type("LLaDAConfig", (), {"__module__": "transformers_modules.other.configuration_llada"})
    monkeypatch.setitem(CONFIG_MAPPING._extra_content, "fake_llada", registered)
    assert needs_remote_code({"model_type": "fake_llada", "auto_map": {"AutoModel": "m.C"}})
    assert not needs_remote_code({"model_type": "llama", "auto_map": {"AutoModel": "m.C"}})
    assert not needs_remote_code({"model_type": "fake_llada"})


# ------------------------------------------------------------------------- LLaDA's padding and checkpointing


def test_left_padding_counts_and_refuses_other_padding():
    mask = torch.tensor([[False, False, True], [True, True, True]])
    assert left_padding(mask).tolist() == [2, 0]
    with pytest.raises(ValueError, match="left padding"):
        left_padding(torch.tensor([[True, False, True]]))


def test_llada_activation_checkpointing_recomputes_blocks_with_equal_gradients(stand_ins):
    with isolated_remote_code(stand_ins["llada"].parent / "ckpt_modules"):
        def grads(checkpointing: bool):
            policy = load_policy(str(stand_ins["llada"]), trust_remote_code=True)
            policy.model.train()
            if checkpointing:
                enable_gradient_checkpointing(policy.model, FAMILIES.get("llada").activation_checkpointing)
            calls = []
            policy.model.model.transformer.blocks[0].register_forward_pre_hook(lambda *_: calls.append(1))
            ids = torch.tensor([[5, 6, 7, 126336, 126336]])
            policy(ids)[0, 3:].logsumexp(-1).sum().backward()
            return {n: p.grad for n, p in policy.model.named_parameters()}, len(calls)

        plain, plain_calls = grads(False)
        checkpointed, checkpointed_calls = grads(True)
    assert (plain_calls, checkpointed_calls) == (1, 2)  # the block ran again in the backward pass
    for name, grad in plain.items():  # the same float32 kernels on the same inputs, recomputed: identical
        torch.testing.assert_close(checkpointed[name], grad, rtol=0.0, atol=0.0, msg=name)


def test_checkpointing_without_support_or_fallback_is_refused():
    bare = SimpleNamespace(supports_gradient_checkpointing=False, config=object())
    with pytest.raises(ValueError, match="does not support gradient checkpointing"):
        enable_gradient_checkpointing(bare)
    with pytest.raises(ValueError, match="set_activation_checkpointing"):
        FAMILIES.get("llada").activation_checkpointing(torch.nn.Linear(1, 1))
