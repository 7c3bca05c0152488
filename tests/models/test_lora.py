"""LoRA via peft on both policy kinds: trainable parameter counts, the adapter-disabled reference view (the
original base, no second copy), adapter save/load, gradient checkpointing."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from dlmrl.models.ar import load_ar_policy
from dlmrl.models.loading import load_policy
from dlmrl.models.lora import (
    ADAPTER_CONFIG,
    BASE_NOTE,
    AdapterDisabledPolicy,
    apply_lora,
    enable_gradient_checkpointing,
    is_peft_model,
    save_final_model,
)

KINDS = ("diffusion", "ar")
SHIPPED = {"diffusion": "tiny-sudoku", "ar": "tiny-sudoku-ar"}


def load(kind: str, dtype: str = "float32"):
    return load_ar_policy(SHIPPED["ar"], dtype=dtype) if kind == "ar" else load_policy(SHIPPED["diffusion"], dtype=dtype)


def scores(policy, kind: str, batch) -> torch.Tensor:
    """Float32 scores that see every weight: diffusion ``(B, T, V)`` log-probs, AR ``(B, L)`` token log-probs."""
    if kind == "ar":
        return policy.token_logprobs(*batch)[0]
    return policy(*batch).log_softmax(-1)


def diffusion_batch(policy, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 14, (3, 24), generator=g)
    ids[:, 16:] = policy.mask_token_id  # a masked canvas after the prompt
    return ids, torch.ones_like(ids, dtype=torch.bool)


def batch_for(policy, kind: str, seed: int = 0):
    return make_ar_batch(seed) if kind == "ar" else diffusion_batch(policy, seed)


def make_ar_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompt, completion = torch.randint(3, 14, (3, 8), generator=g), torch.randint(3, 14, (3, 6), generator=g)
    return prompt, torch.ones_like(prompt, dtype=torch.bool), completion, torch.ones_like(completion, dtype=torch.bool)


def train_step(policy, kind: str, batch, lr: float = 1e-2) -> None:
    """One AdamW step on the trainable parameters, maximising the batch's scores."""
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr)
    policy.model.train()
    (-scores(policy, kind, batch).mean()).backward()
    optimizer.step()
    optimizer.zero_grad()
    policy.model.eval()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("targets", ["all-linear", "q_proj, v_proj"])
def test_only_lora_parameters_are_trainable_r_times_in_plus_out_per_targeted_linear(kind, targets):
    policy, r = load(kind), 4
    linears = {name: m for name, m in policy.model.named_modules() if isinstance(m, nn.Linear) and name != "lm_head"}
    if targets != "all-linear":
        linears = {n: m for n, m in linears.items() if n.rsplit(".", 1)[-1] in ("q_proj", "v_proj")}
    expected = sum(r * (m.in_features + m.out_features) for m in linears.values())
    total = sum(p.numel() for p in policy.model.parameters())
    policy.model = apply_lora(policy.model, r=r, alpha=8, target_modules=targets)
    trainable = {n: p for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert sum(p.numel() for p in trainable.values()) == expected
    assert len(trainable) == 2 * len(linears)
    assert sum(p.numel() for p in policy.model.parameters()) == total + expected


def test_target_modules_that_match_nothing_are_an_error():
    with pytest.raises(ValueError, match="nonexistent_proj"):
        apply_lora(load("diffusion").model, r=2, alpha=4, target_modules="nonexistent_proj")


@pytest.mark.parametrize("kind", KINDS)
def test_reference_view_scores_the_original_base_without_a_second_copy(kind):
    policy, original = load(kind), load(kind)  # original: an independent copy, only to compare against
    policy.model = apply_lora(policy.model, r=4, alpha=8, dropout=0.0)
    batch = batch_for(policy, kind)
    modules_made = []
    real_init = nn.Module.__init__
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nn.Module, "__init__", lambda self, *a, **k: modules_made.append(1) or real_init(self, *a, **k))
        ref = AdapterDisabledPolicy(policy)
    assert not modules_made and vars(ref) == {"policy": policy}  # the view holds no model of its own
    assert ref.model is policy.model
    assert [id(p) for p in ref.parameters()] == [id(p) for p in policy.parameters()]
    with torch.no_grad():
        base = scores(original, kind, batch)
        assert torch.equal(scores(ref, kind, batch), base)
        assert torch.equal(scores(policy, kind, batch), base)  # B = 0: the fresh adapter changes nothing

    train_step(policy, kind, batch)
    with torch.no_grad():
        adapted = scores(policy, kind, batch)
        assert not torch.allclose(adapted, base, atol=1e-4)  # the adapted policy moved ...
        assert torch.equal(scores(ref, kind, batch), base)  # ... its reference view is still the original base
        assert torch.equal(scores(policy, kind, batch), adapted)  # and the adapter is back on after the view
    frozen = {n.replace("base_model.model.", "").replace(".base_layer", ""): p
              for n, p in policy.model.named_parameters() if "lora_" not in n}
    for name, p in original.model.named_parameters():
        assert torch.equal(frozen[name], p), name


def test_reference_view_needs_an_adapter():
    with pytest.raises(ValueError, match="peft adapter"):
        AdapterDisabledPolicy(load("diffusion"))


@pytest.mark.parametrize("kind", KINDS)
def test_saved_adapter_loads_onto_its_base_and_reproduces_the_adapted_logits(kind, tmp_path):
    policy = load(kind)
    policy.model = apply_lora(policy.model, r=4, alpha=8, dropout=0.0, base_model_name_or_path=SHIPPED[kind])
    batch = batch_for(policy, kind)
    train_step(policy, kind, batch)
    model_cfg = SimpleNamespace(kind=kind, family="auto", dtype="float32", trust_remote_code=False)
    save_final_model(policy.model, policy.tokenizer, tmp_path, model_cfg)

    assert (tmp_path / ADAPTER_CONFIG).exists() and not (tmp_path / "model.safetensors").exists()
    saved = load_file(str(tmp_path / "adapter_model.safetensors"))
    assert saved and all("lora_" in k for k in saved)
    note = json.loads((tmp_path / BASE_NOTE).read_text())
    assert note == {"base_model_name_or_path": SHIPPED[kind], "kind": kind, "family": "auto", "dtype": "float32",
                    "trust_remote_code": False}
    loaded = load_ar_policy(str(tmp_path)) if kind == "ar" else load_policy(str(tmp_path))
    assert is_peft_model(loaded.model)
    assert not any(p.requires_grad for p in loaded.parameters())  # loaded for inference
    with torch.no_grad():
        assert torch.equal(scores(loaded, kind, batch), scores(policy, kind, batch))
    wrong = load_policy if kind == "ar" else load_ar_policy
    with pytest.raises(ValueError, match="trained on a"):
        wrong(str(tmp_path))


def layer_calls(model: nn.Module) -> list:
    """Counts forward calls of the first decoder layer's MLP (a checkpointed layer runs again in the backward)."""
    calls = []
    layer = next(m for n, m in model.named_modules() if n.endswith("layers.0.mlp"))
    layer.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_gradient_checkpointing_gives_the_same_gradients(kind, lora):
    grads, calls = [], []
    for checkpointing in (False, True):
        policy = load(kind)
        if lora:
            torch.manual_seed(0)  # the same A initialisation both times
            policy.model = apply_lora(policy.model, r=4, alpha=8, dropout=0.0)
            for n, p in policy.model.named_parameters():  # a nonzero B, so every adapter gets a gradient
                if "lora_B" in n:
                    p.data.fill_(0.01)
        if checkpointing:
            enable_gradient_checkpointing(policy.model)
        counter = layer_calls(policy.model)
        policy.model.train()
        scores(policy, kind, batch_for(policy, kind)).mean().backward()
        calls.append(len(counter))
        grads.append({n: p.grad for n, p in policy.model.named_parameters() if p.requires_grad})
    assert calls == [1, 2]  # with checkpointing the layer is recomputed in the backward pass
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7, msg=name)
