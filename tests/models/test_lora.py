"""LoRA via peft on both policy kinds: trainable parameter counts, the adapter-disabled reference view (the
original base, no second copy), adapter save/load, gradient checkpointing, and LoRA/bf16 ``dlmrl train`` runs
(KL against the base, exact resume)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from dlmrl import cli
from dlmrl.config import Config, ConfigError, apply_overrides, validate
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
from dlmrl.training import run_setup
from tests.helpers import crash_then_resume
from tests.tolerances import SHIPPED_TERMS, forward_tol, rounding_tol

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
        # the adapted policy moved (by ~6 nats here) ... far beyond a rerun's float32 rounding, which stays below
        # rounding_tol(|score| ≤ 8.5, SHIPPED_TERMS) ≈ 1.6e-3
        assert (adapted - base).abs().max() > 10 * rounding_tol(scale=float(base.abs().max()), n=SHIPPED_TERMS)
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
        policy = load(kind, dtype="float64")  # (the recomputation may accumulate in another order: float64)
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
    assert all(g.dtype == torch.float64 for g in grads[0].values())
    # the backward mirrors the forward's accumulations (SHIPPED_TERMS) at the gradients' own scale
    tol = forward_tol(scale=max(float(g.abs().max()) for g in grads[0].values()), terms=SHIPPED_TERMS)
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=tol, msg=name)


# -- dlmrl train with LoRA ----------------------------------------------------------------------------------

LORA = ["model.use_peft=true", "model.lora_r=4", "model.lora_alpha=8", "model.lora_dropout=0",
        "model.lora_target_modules=q_proj,k_proj,v_proj,o_proj"]
SMALL = ["max_steps=2", "prompts_per_step=2", "num_generations=3", "num_iterations=2", "sampling.steps=4",
         "save_steps=1", "learning_rate=1e-2", "warmup_steps=0", "eval.before=false", "eval.after=false"]
AR = ["model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "task.answer_mode=full"]


def run_train(out, *overrides, resume: bool = False) -> int:
    return cli.main(["train", "--output-dir", str(out), "--no-progress", *(["--resume"] if resume else []),
                     *SMALL, *overrides])


@pytest.mark.parametrize("kind", KINDS)
def test_dlmrl_train_with_lora_keeps_the_base_and_scores_kl_against_it(kind, tmp_path, monkeypatch):
    loads = []
    real_load = run_setup.load_configured_policy
    monkeypatch.setattr(run_setup, "load_configured_policy", lambda cfg: loads.append(1) or real_load(cfg))
    assert run_train(tmp_path, "algorithm=grpo", *LORA, *(AR if kind == "ar" else [])) == 0
    assert len(loads) == 1  # the KL reference (grpo: beta 0.04) is the base in the same model, not a second load
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["kl"] is not None and math.isfinite(r["kl"]) and math.isfinite(r["loss"]) for r in rows)
    assert rows[1]["kl"] > 0  # after one update the adapted policy has left the base
    final = tmp_path / "final_model"
    assert (final / ADAPTER_CONFIG).exists() and (final / "tokenizer.json").exists()
    assert json.loads((final / BASE_NOTE).read_text())["base_model_name_or_path"] == SHIPPED[kind]
    adapter = load_file(str(final / "adapter_model.safetensors"))
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in adapter.items())
    assert all(k.split(".")[-3] in ("q_proj", "k_proj", "v_proj", "o_proj") for k in adapter)
    checkpoint = load_file(str(tmp_path / "checkpoints" / "step-2" / "model.safetensors"))
    assert checkpoint and all("lora_" in k for k in checkpoint)  # checkpoints hold the adapter only

    overrides = ["--model", str(final), "eval.num_puzzles=4", *(["algorithm=grpo", *AR[:1], AR[2]]
                                                               if kind == "ar" else [])]
    assert cli.main(["eval", *overrides]) == 0  # dlmrl eval loads the adapter onto its base


def test_lora_run_resumes_exactly(tmp_path, monkeypatch):
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    args = ("algorithm=grpo", *LORA)
    assert run_train(full, *args) == 0
    crash_then_resume(monkeypatch, lambda resume: run_train(crashed, *args, resume=resume), crash_step=1)
    a = load_file(str(full / "final_model" / "adapter_model.safetensors"))
    b = load_file(str(crashed / "final_model" / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:  # bit for bit: the resumed steps rerun the same code on the same reloaded state
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0)
    losses = [[json.loads(x)["loss"] for x in (p / "metrics.jsonl").read_text().splitlines()] for p in (full, crashed)]
    assert losses[0] == losses[1]


@pytest.mark.parametrize(("kind", "extra"), [("diffusion", [*LORA, "model.gradient_checkpointing=true"]),
                                             ("ar", [])], ids=["diffusion-lora-checkpointing", "ar-full"])
def test_bfloat16_runs_two_steps_with_finite_loss(kind, extra, tmp_path):
    assert run_train(tmp_path, "algorithm=grpo", "model.dtype=bfloat16", *extra, *(AR if kind == "ar" else [])) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) and math.isfinite(r["kl"]) for r in rows)


@pytest.mark.parametrize(("override", "key"), [("model.lora_r=0", "model.lora_r"),
                                               ("model.lora_alpha=0", "model.lora_alpha"),
                                               ("model.lora_dropout=1.0", "model.lora_dropout"),
                                               ("model.lora_target_modules=q_proj,,v_proj", "model.lora_target_modules")])
def test_lora_fields_are_validated(override, key):
    cfg = Config()
    apply_overrides(cfg, ["model.use_peft=true", override])
    with pytest.raises(ConfigError, match=key):
        validate(cfg)
