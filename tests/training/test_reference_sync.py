"""A KL reference that follows the policy (train.sync_ref_model; dlmrl.training.reference_sync): TR-DPO's mix by
hand, the reference a run checkpoints after each mix (full fine-tuning: the copy; LoRA: the second adapter), a
resumed run's reference, the memory of the two, and the settings refused with the key named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dlmrl.config import ConfigError, default_job_config
from dlmrl.models.ar import resolve_ar_model_path
from dlmrl.models.lora import REFERENCE_ADAPTER
from dlmrl.training.callbacks import Callback
from dlmrl.training.reference_sync import SyncedReference
from dlmrl.training.trainer import train

AR = ["model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "task.answer_mode=full", "train.algorithm=grpo",
      "train.prompts_per_step=2", "train.num_generations=4", "train.save_steps=1", "train.warmup_steps=0",
      "train.learning_rate=1e-2", "eval.before=false", "eval.after=false", "train.sync_ref_model=true",
      "train.ref_model_sync_steps=1", "train.collapse_window=0"]


def test_the_mix_is_tr_dpos_by_hand():
    ref, own = torch.tensor([1.0, 2.0, -4.0]), torch.tensor([3.0, 0.0, 4.0])
    synced = SyncedReference([(ref, own)], alpha=0.25, every=3)
    synced.sync()
    assert torch.equal(ref, torch.tensor([1.5, 1.5, -2.0]))  # (0.25·own + 0.75·ref)
    assert torch.equal(own, torch.tensor([3.0, 0.0, 4.0]))
    assert [synced.due(a, b) for a, b in ((0, 2), (2, 3), (3, 5), (5, 7), (0, 7))] == [False, True, False, True, True]


def _reference_state(step_dir: Path) -> dict:
    """The reference copy's weights in a checkpoint (accelerate's second custom object, after the run state)."""
    return torch.load(step_dir / "custom_checkpoint_1.pkl", weights_only=True)


def test_full_fine_tuning_checkpoints_the_mixed_reference_and_resumes_with_it(tmp_path):
    """Every optimizer step (sync every 1, α 0.5): ref_1 = α θ_1 + (1 − α) θ_0 and ref_2 = α θ_2 + (1 − α) ref_1,
    read from the checkpoints (θ_0 the shipped base); a run stopped after step 1 and resumed has the same reference
    and weights at step 2 as the uninterrupted run."""
    args = [*AR, "train.ref_model_mixup_alpha=0.5", "train.max_steps=2"]
    out = tmp_path / "run"
    train(default_job_config([*args, f"output_dir={out}"]), progress=False)
    theta0 = load_file(str(Path(resolve_ar_model_path("tiny-sudoku-ar")) / "model.safetensors"))
    theta = {s: load_file(str(out / "checkpoints" / f"step-{s}" / "model.safetensors")) for s in (1, 2)}
    ref = {s: _reference_state(out / "checkpoints" / f"step-{s}") for s in (1, 2)}
    moved = 0.0
    for name in theta0:
        if name not in ref[1]:
            continue  # (tied weights: one tensor under the first name)
        expect1 = 0.5 * theta[1][name].double() + 0.5 * theta0[name].double()
        expect2 = 0.5 * theta[2][name].double() + 0.5 * ref[1][name].double()
        # (float32 tensors: one rounding of a mul and an add)
        tol = 4 * torch.finfo(torch.float32).eps * (expect1.abs().max().item() + 1)
        assert (ref[1][name].double() - expect1).abs().max().item() <= tol, name
        assert (ref[2][name].double() - expect2).abs().max().item() <= tol, name
        moved = max(moved, (ref[1][name].double() - theta0[name].double()).abs().max().item())
    assert moved > 1e-4  # (not vacuous: the reference left the base)
    rows = [__import__("json").loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["ref_synced"] for r in rows] == [True, True]

    class StopAfterOne(Callback):
        def on_step_end(self, step, record):
            if step == 1:
                raise RuntimeError("simulated crash")

    part = tmp_path / "part"
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(default_job_config([*args, f"output_dir={part}"]), progress=False, callbacks=[StopAfterOne()])
    train(default_job_config([*args, f"output_dir={part}"]), resume=True, progress=False)
    resumed = _reference_state(part / "checkpoints" / "step-2")
    for name, value in ref[2].items():
        assert torch.equal(resumed[name], value), name
    again = load_file(str(part / "checkpoints" / "step-2" / "model.safetensors"))
    assert all(torch.equal(again[k], theta[2][k]) for k in theta[2])


def test_lora_mixes_a_second_adapter_and_costs_an_adapter_not_a_model(tmp_path):
    """LoRA: the reference is the adapter dlmrl_ref; with α 1 (a hard sync) it equals the policy's adapter after
    each step, with α 0.5 ref_2 = ½ A_2 + ½ ref_1 per factor; checkpoints hold it next to the trainable adapter. Its
    parameters are the adapter's count, a small fraction of the model a merged copy would hold."""
    out = tmp_path / "hard"
    train(default_job_config([*AR, "model.use_peft=true", "train.ref_model_mixup_alpha=1", "train.max_steps=1",
                              f"output_dir={out}"]), progress=False)
    state = load_file(str(out / "checkpoints" / "step-1" / "model.safetensors"))
    tag = f".{REFERENCE_ADAPTER}."
    ref = {k: v for k, v in state.items() if tag in k}
    own = {k: v for k, v in state.items() if ".default." in k}
    assert ref and len(ref) == len(own)
    assert all(torch.equal(v, own[k.replace(tag, ".default.")]) for k, v in ref.items())
    assert any(v.abs().max() > 0 for k, v in ref.items() if "lora_B" in k)  # (moved off the zero init)

    out = tmp_path / "soft"
    train(default_job_config([*AR, "model.use_peft=true", "train.ref_model_mixup_alpha=0.5", "train.max_steps=2",
                              f"output_dir={out}"]), progress=False)
    s1, s2 = (load_file(str(out / "checkpoints" / f"step-{s}" / "model.safetensors")) for s in (1, 2))
    for k in (k for k in s2 if tag in k):
        expect = 0.5 * s2[k.replace(tag, ".default.")] + 0.5 * s1[k]
        assert torch.allclose(s2[k], expect, rtol=0, atol=4 * torch.finfo(torch.float32).eps * (expect.abs().max() + 1))
    adapter = sum(v.numel() for v in ref.values())
    model = sum(v.numel() for v in load_file(str(Path(resolve_ar_model_path("tiny-sudoku-ar")) / "model.safetensors"))
                .values())
    assert adapter < 0.5 * model  # (the tiny model's share; LLaDA-8B's r-128 adapter: 101M of 8.0B, 1.3%: README)


@pytest.mark.parametrize("override, key", [
    ("train.beta=0", "train.sync_ref_model"),
    ("train.ref_model_mixup_alpha=0", "train.ref_model_mixup_alpha"),
    ("train.ref_model_sync_steps=0", "train.ref_model_sync_steps"),
    ("train.sharding=fsdp2", "train.sync_ref_model"),
])
def test_settings_without_a_reference_or_out_of_range_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        default_job_config([*AR, override])


def test_the_memory_plan_counts_the_reference_adapter_not_a_copy():
    """LoRA with sync_ref_model: the plan's reference term is the second adapter (its LoRA parameters in float32);
    without it, none (the disabled adapter is the reference); full fine-tuning keeps its frozen copy either way."""
    from dlmrl.config import build_preset
    from dlmrl.training.memory_config import architecture_for, settings_from_config
    from dlmrl.training.memory_plan import plan_memory

    def reference_term(*extra):
        cfg = default_job_config([*AR, *extra])
        arch, _ = architecture_for(cfg)
        settings, _ = settings_from_config(cfg, 1, 1, build_preset(cfg).objective)
        return arch, settings, plan_memory(arch, settings).terms["reference_model"]

    arch, s, term = reference_term("model.use_peft=true")
    assert term == arch.lora_parameters(s.lora_r, s.lora_targets) * 4 > 0
    assert reference_term("model.use_peft=true", "train.sync_ref_model=false")[2] == 0
    arch, s, full = reference_term("model.use_peft=false")
    assert full == arch.parameter_count() * s.dtype_bytes


def test_the_uniform_kind_with_lora_refuses_it_naming_the_key():
    """DiffusionGemma's adapters are shared by its encoder and decoder; a reference adapter is not (yet)."""
    with pytest.raises(ConfigError, match="train.sync_ref_model"):
        default_job_config(["model.kind=uniform", "model.name_or_path=tiny-sudoku-uniform", "task.answer_mode=full",
                            "train.algorithm=grpo", "model.use_peft=true", "train.sync_ref_model=true"])
    default_job_config(["model.kind=uniform", "model.name_or_path=tiny-sudoku-uniform", "task.answer_mode=full",
                        "train.algorithm=grpo", "model.use_peft=false",
                        "train.sync_ref_model=true"])  # (full fine-tuning: the copy is mixed)
