"""The memory plan for ``model.kind: uniform`` (DiffusionGemma): the architecture from ``config.json``'s
``text_config`` (a dense MLP and routed experts in every layer), LoRA's parameters by the kind's targets, and the
trajectory likelihood's grad pass as the plan's canvas."""

from __future__ import annotations

import yaml

from dlmrl import cli
from dlmrl.config import Config, apply_overrides
from dlmrl.kinds import kind_of
from dlmrl.models.lora import lora_parameter_count, prepare_for_training
from dlmrl.models.uniform_policy import build_tiny_uniform_policy, save_tiny_uniform_checkpoint
from dlmrl.training.memory_plan import architecture_from_config

#: google/diffusiongemma-26B-A4B-it's text_config, as public copies of its config.json give it (hidden 2816, 30
#: layers, 16 heads, 8 key/value heads of 256, a dense MLP of 2112 and 128 experts of 704, top 8, vocabulary 262,144)
DG_26B = {"model_type": "diffusion_gemma", "canvas_length": 256, "tie_word_embeddings": True,
          "text_config": {"hidden_size": 2816, "num_hidden_layers": 30, "num_attention_heads": 16,
                          "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 2112,
                          "moe_intermediate_size": 704, "num_experts": 128, "top_k_experts": 8,
                          "vocab_size": 262144}}


def test_the_architecture_reads_text_config_with_the_dense_mlp_beside_the_experts():
    policy = build_tiny_uniform_policy()
    model = policy.model
    arch = architecture_from_config(model.config.to_dict())
    assert (arch.layout, arch.num_experts, arch.experts_per_token, arch.moe_intermediate_size) == (
        "diffusion_gemma", 4, 2, 32)
    assert all(arch.is_moe_layer(i) for i in range(arch.num_layers))
    text = sum(p.numel() for n, p in model.named_parameters() if "vision" not in n)
    # every layer counted with the sliding layers' attention shapes: the tiny model's one global layer has no
    # v_proj (its keys are its values), so the count is above transformers' by about that projection (2,048 of
    # 148,616: within 2%)
    assert abs(arch.parameter_count() - text) <= 0.02 * text
    cfg = Config()
    apply_overrides(cfg, ["model.kind=uniform", "model.use_peft=true"])
    prepare_for_training(policy, cfg.model, kind_of("uniform"))
    kv = arch.num_kv_heads * arch.head_dim  # (the global layer's missing v_proj adapter: r·(H + kv·head_dim))
    assert arch.lora_parameters(cfg.model.lora_r, "all-linear") - lora_parameter_count(policy.model) == (
        cfg.model.lora_r * (arch.hidden_size + kv))
    assert "experts.gate_proj" not in arch.lora_targets("all-linear")


def test_the_26b_a4b_counts_its_parameters():
    arch = architecture_from_config(DG_26B)
    # the model card: 25.2B-25.8B in all with the vision tower (not counted here), about 3.8B active
    assert 24.5e9 <= arch.parameter_count() <= 25.8e9


def test_dry_run_plans_the_trajectory_grad_pass(tmp_path, capsys):
    checkpoint = save_tiny_uniform_checkpoint(tmp_path / "tiny_dg")  # (canvas 8)
    assert cli.main(["train", "--dry-run", f"model.name_or_path={checkpoint}", "model.kind=uniform",
                     "task.answer_mode=full", "train.algorithm=grpo", "sampling.gen_length=16", "sampling.steps=4",
                     "estimator.micro_batch=2"]) == 0
    memory = yaml.safe_load(capsys.readouterr().out)["memory"]
    assert "unavailable" not in memory and "4 experts (2 per token" in memory["architecture"]
    # one step of one canvas per plan canvas (8 positions), 2 of them per pass (micro_batch 2 < 4 steps), sharing
    # the row's encoder graph: 17 prompt positions and C = ceil(17 / 8) = 3 canvases of 8, halved and rounded up
    assert memory["canvases_per_forward"] == 2
    assert memory["positions_per_canvas"] == 8 + -(-(17 + 3 * 8) // 2)
    assert memory["canvases_per_update"] == 64 * 8 * 3 * 4  # (the default 64 prompts x G 8 rows, x C x S)


def test_dry_run_plans_a_hub_26b_from_the_recorded_architecture(capsys):
    arch = {"name_or_path": "google/diffusiongemma-26B-A4B-it", **DG_26B}
    args = ["train", "--dry-run", "model.name_or_path=google/diffusiongemma-26B-A4B-it", "model.kind=uniform",
            "task.name=gsm8k", "train.algorithm=grpo", "model.use_peft=true", "model.dtype=bfloat16",
            f"model.architecture={yaml.safe_dump(arch, default_flow_style=True).strip()}",
            "sampling.gen_length=255", "sampling.steps=8"]
    assert cli.main(args) == 0
    memory = yaml.safe_load(capsys.readouterr().out)["memory"]
    # (one canvas of 256: 255 tokens and EOS; a text task's prompt is planned at 256 tokens; without micro_batch
    # one backward keeps the 8 steps' graphs, which share the row's encoder: 256 + 256 positions over 8)
    assert memory["positions_per_canvas"] == 256 + (256 + 256) // 8
    assert "128 experts (8 per token" in memory["architecture"]


def test_the_26b_recipe_fits_8_gpus_of_80gb_with_lora(capsys, monkeypatch):
    """configs/diffusiongemma_grpo_gsm8k.yaml by its own plan on 8 processes: LoRA, unsharded (the kind runs
    unsharded), peak per GPU within 90% of its 80 GB budget (the plan's error margin, README "Memory plan")."""
    from pathlib import Path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe = Path(__file__).parents[2] / "configs" / "diffusiongemma_grpo_gsm8k.yaml"
    assert cli.main(["train", "--config", str(recipe), "--dry-run", "--num-processes", "8"]) == 0
    memory = yaml.safe_load(capsys.readouterr().out)["memory"]
    assert memory["memory_budget"].endswith("fits"), memory
    assert float(memory["peak"].split(" GB")[0]) <= 80 * 0.9


def test_the_self_conditioning_inputs_are_planned(tmp_path):
    """The trajectory's grad pass reads each step canvas's detached self-conditioning input (``L × V`` values in the
    weights' dtype) and each sampling step one per row; the ELBO scorer passes none (zero self-conditioning) but
    samples with the same sampler."""
    from dlmrl.training.memory_config import architecture_for, settings_from_config
    from dlmrl.training.memory_plan import plan_memory

    checkpoint = save_tiny_uniform_checkpoint(tmp_path / "tiny_dg")  # (canvas 8)
    base = [f"model.name_or_path={checkpoint}", "model.kind=uniform", "task.answer_mode=full", "sampling.steps=4",
            "train.prompts_per_step=2", "train.num_generations=3"]
    for extra, forward in ((["estimator.micro_batch=2"], 2 * 8), (["estimator.name=uniform_sdmc"], 0)):
        cfg = Config()
        apply_overrides(cfg, [*base, *extra])
        arch, _ = architecture_for(cfg)
        settings, _ = settings_from_config(cfg, 4, 1)
        terms = plan_memory(arch, settings).terms
        assert terms["soft_inputs"] == forward * arch.vocab_size * 4  # (float32 weights)
        assert terms["rollout_soft_inputs"] == 6 * 8 * arch.vocab_size * 4  # (6 rows x the canvas's 8 positions)


def test_a_micro_batch_above_the_steps_is_planned_as_the_whole_rows_the_scorer_runs(tmp_path):
    """micro_batch 10 with 4 steps per canvas: the scorer runs 10 // 4 = 2 rows x 4 steps = 8 step canvases at once
    (UniformTrajectoryScorer._split), and the plan counts those 8, not 10."""
    from dlmrl.training.memory_config import settings_from_config

    checkpoint = save_tiny_uniform_checkpoint(tmp_path / "tiny_dg")
    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={checkpoint}", "model.kind=uniform", "task.answer_mode=full",
                          "sampling.steps=4", "estimator.micro_batch=10"])
    settings, numbers = settings_from_config(cfg, 4, 1)
    assert numbers["canvases_per_forward"] == settings.canvases_per_forward == 8
