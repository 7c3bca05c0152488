"""The ``llada_moe`` family (LLaDA-MoE-7B-A1B on its own ``modeling_lladamoe.py``) on the offline stand-in
``tests/models/remote_code/llada_moe`` (see its README), and the mask id of LLaDA-code checkpoints (LLaDA, iLLaDA) read
from the checkpoint: detection (LLaDA-MoE's ``config.json`` says ``model_type "llada"`` as dense LLaDA's), refusal
without ``trust_remote_code``, the mask id from the tokenizer's vocabulary / ``config.json``, greedy decoding against
LLaDA's ``generate`` semantics (``tests/models/llada_reference.py``) called on the model's own forward, the sampler's
log-probabilities against a replay through that forward, the experts in training and eval mode, activation
checkpointing, two training steps with LoRA and with every weight, and ``dlmrl eval`` of both."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch

from dlmrl.models.families import (
    FAMILIES,
    ILLADA_MASK_TOKEN_ID,
    LLADA_MASK_TOKEN_ID,
    detect_family,
    is_illada,
)
from dlmrl.models.loading import load_policy
from dlmrl.models.sampler import generate
from tests.models.checkpoints import (
    ILLADA_VOCAB,
    isolated_remote_code,
    save_illada_like,
    save_llada_moe_like,
)
from tests.models.family_runs import train_then_eval
from tests.models.llada_reference import reference_greedy

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["12+3=", "45+6=", "7="]  # the first two unpadded, the third left-padded by 3
ATOL = 1e-5  # (float32 forwards of the same rows in another batch shape: a few ulps of logits of size ~10)


def _benchmark_module(monkeypatch):
    """``benchmarks/remote_code_checkpoints.py``, where LLaDA-MoE's ``config.json`` is written out."""
    spec = importlib.util.spec_from_file_location("remote_code_checkpoints",
                                                  ROOT / "benchmarks" / "remote_code_checkpoints.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("llada_moe")
    with isolated_remote_code(root / "hf_modules"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield {"moe": save_llada_moe_like(root / "moe"), "illada": save_illada_like(root / "illada")}


def _load(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (transformers' deprecations)
        return load_policy(str(path), trust_remote_code=True, **kw)


@pytest.fixture(scope="module")
def moe(paths):
    policy = _load(paths["moe"])
    policy.model.eval()
    return policy


def _encode(policy, texts):
    enc = policy.tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"].bool()


def _own_forward(policy):
    """The model's own call as LLaDA's ``generate`` makes it, ``model(x).logits`` (no mask, no positions), for the
    oracle ``reference_greedy`` (unpadded batches only)."""
    def call(x, attention):
        assert attention.all()
        return policy.model(x).logits.float()
    return call


# ------------------------------------------------------------------------------------ detection and loading


def test_llada_moe_configs_are_detected_and_dense_llada_ones_are_not(monkeypatch):
    module = _benchmark_module(monkeypatch)
    released = module.LLADA_MOE_CONFIG
    assert released["model_type"] == "llada"  # (dense LLaDA's type: detection must not rest on it)
    assert detect_family(released) == "llada_moe"
    dllm = {**released, "model_type": "lladamoe",  # (ZHZisZZ/dllm's renamed copy)
            "auto_map": {**released["auto_map"], "AutoConfig": "configuration_lladamoe.LLaDAMoEConfig"}}
    assert detect_family(dllm) == "llada_moe"
    assert detect_family({"model_type": "llada", "architectures": ["LLaDAMoEModelLM"]}) == "llada_moe"
    assert detect_family({"model_type": "llada", "auto_map": released["auto_map"]}) == "llada_moe"
    assert detect_family(module.LLADA_CONFIG) == "llada"
    assert detect_family({"model_type": "llada"}) == "llada"
    with pytest.raises(ValueError, match="cannot detect"):  # (OLMoE, the AR layout it comes from)
        detect_family({"model_type": "olmoe", "architectures": ["OlmoeForCausalLM"]})


def test_the_released_config_gives_the_published_parameter_count(monkeypatch):
    """The memory plan reads LLaDA-MoE's keys: 7.36B parameters (the model card's 7B total, published as 7.36B)."""
    from dlmrl.training.memory_plan import architecture_from_config

    arch = architecture_from_config(_benchmark_module(monkeypatch).LLADA_MOE_CONFIG)
    assert round(arch.parameter_count() / 1e9, 2) == 7.36
    assert arch.moe_layers == 16 and arch.experts_per_token == 8 and arch.shared_experts == 0


def test_the_stand_in_loads_with_the_mask_id_of_its_tokenizer(paths, moe):
    config = json.loads((paths["moe"] / "config.json").read_text())
    assert "mask_token_id" not in config and config["model_type"] == "llada"
    assert moe.tokenizer.mask_token_id is None  # (the tokenizer names no mask token: its vocabulary holds <|mask|>)
    assert moe.family == "llada_moe" and moe.mask_token_id == moe.tokenizer.get_vocab()["<|mask|>"] == 1
    assert type(moe.model).__name__ == "LLaDAMoEModelLM" and type(moe.model).__module__.startswith("transformers_modules")
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_policy(str(paths["moe"]))


def test_a_mask_id_in_config_json_wins_and_none_anywhere_is_refused(paths, tmp_path):
    import shutil

    named = tmp_path / "named"
    shutil.copytree(paths["moe"], named)
    config = json.loads((named / "config.json").read_text())
    (named / "config.json").write_text(json.dumps({**config, "mask_token_id": 2}))
    assert _load(named).mask_token_id == 2
    with isolated_remote_code(tmp_path / "hf"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bare = save_llada_moe_like(tmp_path / "bare", mask_in_vocabulary=False)
    with pytest.raises(ValueError, match="no mask token.*mask_token_id"):
        _load(bare)


def test_the_config_check_asks_for_trust_remote_code_for_a_named_llada_moe_hub_id():
    from dlmrl.config import Config, ConfigError, apply_overrides, validate

    cfg = Config()
    apply_overrides(cfg, ["model.name_or_path=inclusionAI/LLaDA-MoE-7B-A1B-Instruct", "model.family=llada_moe",
                          "task.answer_mode=text", "sampling.gen_length=8", "sampling.block_length=8",
                          "sampling.steps=8"])
    with pytest.raises(ConfigError, match="model.trust_remote_code.*'llada_moe' checkpoints ship"):
        validate(cfg, for_training=False)


def test_the_config_check_refuses_a_cache(paths):
    from dlmrl.config import Config, ConfigError, apply_overrides, validate

    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={paths['moe']}", "model.trust_remote_code=true", "task.answer_mode=text",
                          "sampling.gen_length=8", "sampling.block_length=8", "sampling.steps=8",
                          "sampling.cache=prefix"])
    with pytest.raises(ConfigError, match="sampling.cache.*'llada_moe'"):
        validate(cfg, for_training=False)


# ------------------------------------------------------------------------------------ LLaDA-code mask ids (iLLaDA)


def test_illada_configs_are_llada_and_take_mask_5_from_the_checkpoint(paths, tmp_path):
    policy = _load(paths["illada"])
    config = json.loads((paths["illada"] / "config.json").read_text())
    assert policy.family == "llada" and is_illada(config) and config["mask_token_id"] == 5
    assert policy.mask_token_id == ILLADA_MASK_TOKEN_ID == 5 and policy.tokenizer.mask_token_id is None
    # with no mask id in config.json (nor in the tokenizer), iLLaDA's vocabulary decides: 5, not LLaDA's 126336
    with isolated_remote_code(tmp_path / "hf"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bare = save_illada_like(tmp_path / "bare", mask_in_config=False)
    assert _load(bare).mask_token_id == 5
    fam = FAMILIES.get("llada")
    assert fam.default_mask_token_id is None  # (no family constant)
    assert fam.fallback_mask_token_id(None, {"model_type": "llada", "vocab_size": 126464}) == LLADA_MASK_TOKEN_ID
    assert fam.fallback_mask_token_id(None, {"model_type": "llada", "vocab_size": 50304}) is None
    assert not is_illada({"model_type": "llada", "vocab_size": 126464, "embedding_size": 126464})


def test_a_saved_full_model_keeps_the_mask_id_the_family_read(tmp_path):
    """An iLLaDA checkpoint with no mask id in config.json loads with 5 (its vocabulary); the full model a run saves
    (``save_final_model``) records 5 in its config.json and reloads with 5. Without it, ``save_pretrained`` writes the
    configuration class's default (the stand-in's 126336; LLaDA's published ``ModelConfig``: 50256) and the trained
    copy would decode with another token (a reviewer's finding)."""
    from dlmrl.models.lora import save_final_model

    with isolated_remote_code(tmp_path / "hf"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bare = save_illada_like(tmp_path / "bare", mask_in_config=False)
        policy = _load(bare)
        assert policy.mask_token_id == 5
        save_final_model(policy.model, policy.tokenizer, tmp_path / "plain")
        assert json.loads((tmp_path / "plain" / "config.json").read_text()).get("mask_token_id") != 5  # (the bug)
        save_final_model(policy.model, policy.tokenizer, tmp_path / "saved", mask_token_id=policy.mask_token_id)
        assert json.loads((tmp_path / "saved" / "config.json").read_text())["mask_token_id"] == 5
        assert _load(tmp_path / "saved").mask_token_id == 5


def test_a_llada_tokenizer_naming_mdm_mask_gives_its_id(tmp_path):
    from tests.models.checkpoints import char_tokenizer

    tok = char_tokenizer(["<|endoftext|>", "<|mdm_mask|>", "<|unk|>"], eos_token="<|endoftext|>", unk_token="<|unk|>")
    assert FAMILIES.get("llada").fallback_mask_token_id(tok, {"vocab_size": 50304}) == 1


@torch.no_grad()
def test_an_illada_checkpoint_decodes_and_scores_with_mask_5_never_126336(paths):
    """Every forward of decoding and of scoring sees id 5 at the masked positions and never 126336, and greedy
    decoding equals LLaDA's ``generate`` run with ``mask_id=5`` on the model's own call."""
    policy = _load(paths["illada"])
    policy.model.eval()
    seen = []
    hook = policy.model.register_forward_pre_hook(lambda m, args, kw: seen.append((args[0] if args else
                                                                                   kw["input_ids"]).clone()),
                                                  with_kwargs=True)
    ids, pm = _encode(policy, PROMPTS[:2])
    out = generate(policy, ids, pm, gen_length=8, block_length=4, steps=4)
    hook.remove()
    assert seen and all(int((x == LLADA_MASK_TOKEN_ID).sum()) == 0 for x in seen)
    assert int((seen[0][:, ids.shape[1]:] == 5).sum()) == 16  # (the first pass: the whole canvas masked with 5)
    ref, _ = reference_greedy(_own_forward(policy), ids, pm, gen_length=8, block_length=4, steps=4, mask_id=5)
    assert torch.equal(out.canvas, ref)
    # scoring: the family's logits of a canvas masked with 5 are the model's own
    canvas = out.canvas.clone()
    canvas[:, ::2] = 5
    x = torch.cat([ids, canvas], 1)
    torch.testing.assert_close(policy(x), policy.model(x).logits.float(), atol=0, rtol=0)
    assert policy.model.config.vocab_size == ILLADA_VOCAB


def test_a_tied_illada_model_saves_once_and_reloads(paths, tmp_path):
    """iLLaDA ties its embedding and head (LLaDA's ``weight_tying``: ``tie_weights`` shares the matrix as
    ``transformer.ff_out``): ``save_pretrained`` under transformers 5 refuses an undeclared shared matrix; compat
    patch 11 declares it, the file holds it once, and the reloaded model gives the same logits."""
    from safetensors.torch import load_file

    from dlmrl.models.compat import declare_tied_parameters

    policy = _load(paths["illada"])
    model = policy.model
    assert model.model.transformer.ff_out.weight is model.model.transformer.wte.weight
    assert model._tied_weights_keys == {"model.transformer.ff_out.weight": "model.transformer.wte.weight"}
    model.save_pretrained(tmp_path / "saved", safe_serialization=True)
    policy.tokenizer.save_pretrained(tmp_path / "saved")
    assert set(load_file(str(tmp_path / "saved" / "model.safetensors"))) == {
        n for n, _ in model.named_parameters()} - {"model.transformer.ff_out.weight"}
    x = torch.tensor([[7, 8, 9, 5, 5, 5]])
    with torch.no_grad():
        torch.testing.assert_close(_load(tmp_path / "saved")(x), policy(x), atol=0, rtol=0)
    del model._tied_weights_keys  # (without the declaration, transformers refuses: what patch 11 fixes)
    with pytest.raises(RuntimeError, match="shared tensors"):
        model.save_pretrained(tmp_path / "refused", safe_serialization=True)
    assert declare_tied_parameters(model) is model and model._tied_weights_keys


# ------------------------------------------------------------------------------------ logits, decoding, likelihood


@torch.no_grad()
def test_logits_are_the_model_call_and_a_padded_row_is_the_row_alone(moe):
    ids, pm = _encode(moe, PROMPTS)
    assert not pm.all()
    logits = moe(ids, pm)
    for row in range(ids.shape[0]):
        alone = ids[row:row + 1, pm[row]]
        own = moe.model(alone).logits.float()[0]
        torch.testing.assert_close(logits[row, pm[row]], own, atol=ATOL, rtol=0)
        assert (logits[row, ~pm[row]] == 0).all()
    # not vacuous: the code ignores any attention mask, so the padded rows run through it whole differ
    whole = moe.model(ids, attention_mask=pm.long()).logits.float()
    assert (whole[2, pm[2]] - logits[2, pm[2]]).abs().max() > 1e-3


@pytest.mark.parametrize(("gen_length", "block_length", "steps"), [(8, 8, 8), (8, 4, 4), (8, 4, 2), (12, 4, 6)])
@torch.no_grad()
def test_greedy_decoding_equals_lladas_generate(moe, gen_length, block_length, steps):
    ids, pm = _encode(moe, PROMPTS[:2])
    assert pm.all()
    out = generate(moe, ids, pm, gen_length=gen_length, block_length=block_length, steps=steps)
    ref, _ = reference_greedy(_own_forward(moe), ids, pm, gen_length=gen_length, block_length=block_length,
                              steps=steps, mask_id=moe.mask_token_id)
    assert torch.equal(out.canvas, ref), (out.canvas, ref)
    assert (out.canvas != moe.mask_token_id).all()


@torch.no_grad()
def test_sampled_log_probs_equal_a_replay_through_the_models_forward(moe):
    """The rollout's recorded log-probabilities (the trajectory likelihood's terms) against each step replayed
    through ``model(x).logits`` on the row alone, mask token excluded (the sampler never draws it)."""
    ids, pm = _encode(moe, PROMPTS)
    out = generate(moe, ids, pm, gen_length=8, block_length=4, steps=8, temperature=1.0,
                   generator=torch.Generator().manual_seed(0))
    for row in range(ids.shape[0]):
        prompt = ids[row, pm[row]]
        for step in out.reveal_step[row].unique().tolist():
            canvas = torch.where(out.reveal_step[row] < step, out.canvas[row], moe.mask_token_id)
            logits = moe.model(torch.cat([prompt, canvas])[None]).logits.float()[0, len(prompt):]
            logits[:, moe.mask_token_id] = -math.inf
            here = out.reveal_step[row] == step
            replay = torch.log_softmax(logits, -1).gather(-1, out.canvas[row][:, None])[:, 0]
            torch.testing.assert_close(out.token_logprobs[row, here], replay[here], atol=ATOL, rtol=0)


# ------------------------------------------------------------------------------------ training mode


def _grads(policy, x, clean):
    policy.model.zero_grad(set_to_none=True)
    logits = policy(x)
    torch.log_softmax(logits, -1).gather(-1, clean[..., None]).sum().backward()
    return logits.detach(), {n: p.grad.detach().clone() for n, p in policy.model.named_parameters()
                             if p.grad is not None}


def _noised(policy, seed=0):
    clean = torch.randint(4, len(policy.tokenizer), (2, 10), generator=torch.Generator().manual_seed(seed))
    x = clean.masked_fill(torch.rand(2, 10, generator=torch.Generator().manual_seed(seed + 1)) < 0.5,
                          policy.mask_token_id)
    return x, clean


def test_the_experts_get_gradients_in_training_and_eval_mode_alike(paths):
    """LLaDA-MoE's expert loop has no eval-mode branch (unlike LLaDA2's ``moe_infer``): the same logits and the same
    gradients, every routed expert included, in both modes."""
    policy = _load(paths["moe"])
    x, clean = _noised(policy)
    policy.model.train()
    train_logits, train_grads = _grads(policy, x, clean)
    routed = {n for n, _ in policy.model.named_parameters() if ".experts." in n}
    assert routed and set(train_grads) == {n for n, _ in policy.model.named_parameters()}
    policy.model.eval()
    eval_logits, eval_grads = _grads(policy, x, clean)
    torch.testing.assert_close(eval_logits, train_logits, atol=0, rtol=0)
    assert set(eval_grads) == set(train_grads)
    for n, g in train_grads.items():
        torch.testing.assert_close(eval_grads[n], g, atol=0, rtol=0)


def test_an_expert_bias_warns_and_breaks_backward_as_the_code_does(tmp_path):
    """With ``moe_router_enable_expert_bias`` on, the code adds the bias to the router's softmax output in place:
    loading warns, a no-grad pass runs, and a backward pass fails (the stand-in does what the release does)."""
    with isolated_remote_code(tmp_path / "hf"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = save_llada_moe_like(tmp_path / "bias", expert_bias=True)
    with pytest.warns(UserWarning, match="moe_router_enable_expert_bias"):
        policy = load_policy(str(path), trust_remote_code=True)
    x, clean = _noised(policy)
    with torch.no_grad():
        assert torch.isfinite(policy(x)).all()
    with pytest.raises(RuntimeError, match="inplace operation"):
        _grads(policy, x, clean)


def test_activation_checkpointing_gives_the_same_gradients(paths):
    from dlmrl.models.lora import enable_gradient_checkpointing

    policy = _load(paths["moe"])
    assert FAMILIES.get("llada_moe").activation_checkpointing is None  # (transformers' own, which the code supports)
    x, clean = _noised(policy, seed=3)
    policy.model.train()
    _, plain = _grads(policy, x, clean)
    calls = []
    policy.model.model.layers[0].register_forward_pre_hook(lambda *_: calls.append(1))
    enable_gradient_checkpointing(policy.model)
    _, checkpointed = _grads(policy, x, clean)
    assert len(calls) == 2  # (not vacuous: the layer ran again in the backward pass)
    for n, g in plain.items():
        torch.testing.assert_close(checkpointed[n], g, atol=0, rtol=0)


# ------------------------------------------------------------------------------------ training and eval runs

@pytest.mark.parametrize("lora", [True, False])
def test_two_training_steps_and_dlmrl_eval(paths, tmp_path, monkeypatch, capsys, lora):
    """``dlmrl train`` (2 steps of ``gdpo``, LoRA on the attention projections or every weight) then ``dlmrl eval`` of
    the saved model, in this process."""
    from safetensors.torch import load_file

    model = {"name_or_path": str(paths["moe"]), "trust_remote_code": True, "gradient_checkpointing": True}
    if lora:
        model |= {"use_peft": True, "lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.0,
                  "lora_target_modules": "q_proj,k_proj,v_proj,o_proj"}
    _, final = train_then_eval(
        tmp_path, monkeypatch, capsys, model,
        sampling={"gen_length": 8, "block_length": 4, "steps": 4, "temperature": 1.0},
        estimator={"name": "sdmc", "num_nodes": 2}, train={"algorithm": "gdpo", "num_iterations": 1}, eval_steps=4)
    if lora:
        lora_b = {k: v for k, v in load_file(str(final / "adapter_model.safetensors")).items() if "lora_B" in k}
        assert len(lora_b) == 4 * 2 and any(v.abs().max() > 0 for v in lora_b.values())
    else:
        saved = load_file(str(final / "model.safetensors"))
        base = load_file(str(paths["moe"] / "model.safetensors"))
        moved = [k for k in base if not torch.equal(base[k], saved[k])]
        assert any(".experts." in k for k in moved), "training must reach the routed experts"
        assert (final / "modeling_lladamoe.py").is_file()  # (the code is saved next to the weights)
