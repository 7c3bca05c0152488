"""The memory plan for ``model.kind: uniform`` (DiffusionGemma): the architecture from ``config.json``'s
``text_config`` (a dense MLP and routed experts in every layer), LoRA's parameters by the kind's targets, and the
trajectory likelihood's grad pass as the plan's canvas."""

from __future__ import annotations

import pytest
import yaml

from dlmrl import cli
from dlmrl.config import Config, apply_overrides
from dlmrl.errors import ConfigError
from dlmrl.kinds import kind_of
from dlmrl.models.lora import lora_parameter_count, prepare_for_training
from dlmrl.models.uniform_policy import build_tiny_uniform_policy, save_tiny_uniform_checkpoint
from dlmrl.training.memory_plan import architecture_from_config

#: google/diffusiongemma-26B-A4B-it's text_config, as public copies of its config.json give it (hidden 2816, 30
#: layers, 16 heads, 8 key/value heads of 256, a dense MLP of 2112 and 128 experts of 704, top 8, vocabulary 262,144;
#: its 5 full-attention layers: 2 key/value heads of 512, keys as values)
DG_26B = {"model_type": "diffusion_gemma", "canvas_length": 256, "tie_word_embeddings": True,
          "text_config": {"hidden_size": 2816, "num_hidden_layers": 30, "num_attention_heads": 16,
                          "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 2112,
                          "moe_intermediate_size": 704, "num_experts": 128, "top_k_experts": 8,
                          "vocab_size": 262144, "global_head_dim": 512, "num_global_key_value_heads": 2,
                          "attention_k_eq_v": True}}


def test_the_architecture_reads_text_config_with_the_dense_mlp_beside_the_experts():
    policy = build_tiny_uniform_policy()
    model = policy.model
    arch = architecture_from_config(model.config.to_dict())
    assert (arch.layout, arch.num_experts, arch.experts_per_token, arch.moe_intermediate_size) == (
        "diffusion_gemma", 4, 2, 32)
    assert all(arch.is_moe_layer(i) for i in range(arch.num_layers))
    text = sum(p.numel() for n, p in model.named_parameters() if "vision" not in n)
    # the full-attention layers have no v_proj (their keys are their values); the tiny model's global layers keep
    # the sliding layers' head shapes, so the count is transformers' own
    assert arch.kv_shared_layers == tuple(i for i, t in enumerate(model.config.text_config.layer_types)
                                          if t == "full_attention") != ()
    assert arch.parameter_count() == text
    cfg = Config()
    apply_overrides(cfg, ["model.kind=uniform", "model.use_peft=true"])
    prepare_for_training(policy, cfg.model, kind_of("uniform"))
    assert arch.lora_parameters(cfg.model.lora_r, "all-linear") == lora_parameter_count(policy.model)
    assert "experts.gate_proj" not in arch.lora_targets("all-linear")


@pytest.mark.parametrize("targets", ["q_proj", "self_attn.v_proj", "mlp.down_proj,o_proj", "proj", "router.proj"])
def test_lora_targets_inside_the_text_layers_are_planned_as_the_kind_adapts_them(targets):
    """The kind's rule (names matched inside the text layers, one adapter shared by the encoder and the decoder):
    ``v_proj`` exists in the sliding layers only, ``proj`` and ``router.proj`` name the routers' ``nn.Linear``."""
    policy = build_tiny_uniform_policy()
    arch = architecture_from_config(policy.model.config.to_dict())
    cfg = Config()
    apply_overrides(cfg, ["model.kind=uniform", "model.use_peft=true", f"model.lora_target_modules={targets}"])
    prepare_for_training(policy, cfg.model, kind_of("uniform"))
    assert arch.lora_parameters(cfg.model.lora_r, targets) == lora_parameter_count(policy.model) > 0
    assert arch.unmatched_lora_targets(targets) == []


@pytest.mark.parametrize("targets", ["lm_head", "q_proj,embed_tokens", "layers.0.self_attn.q_proj"])
def test_a_name_outside_the_text_layers_is_named_by_the_plan_and_refused_by_the_run(targets):
    """The head, the embedding and a layer's index are outside the kind's rule: the plan names them, the run stops
    naming the key and the rule."""
    policy = build_tiny_uniform_policy()
    arch = architecture_from_config(policy.model.config.to_dict())
    bad = targets.split(",")[-1]
    assert arch.unmatched_lora_targets(targets) == [bad]
    cfg = Config()
    apply_overrides(cfg, ["model.kind=uniform", "model.use_peft=true", f"model.lora_target_modules={targets}"])
    with pytest.raises(ConfigError, match=rf"model.lora_target_modules.*'{bad}'.*text layers"):
        prepare_for_training(policy, cfg.model, kind_of("uniform"))


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
    # (full training keeps a second copy, the inputs' softmax the soft embeddings' matmul saves for the trained
    # embedding; LoRA freezes the embedding)
    for extra, forward in ((["estimator.micro_batch=2"], 2 * 2 * 8), (["estimator.name=uniform_sdmc"], 0),
                           (["estimator.micro_batch=2", "model.use_peft=true"], 2 * 8)):
        cfg = Config()
        apply_overrides(cfg, [*base, *extra])
        arch, _ = architecture_for(cfg)
        settings, _ = settings_from_config(cfg, 4, 1)
        terms = plan_memory(arch, settings).terms
        assert terms["soft_inputs"] == forward * arch.vocab_size * 4  # (float32 weights)
        assert terms["rollout_soft_inputs"] == 6 * 8 * arch.vocab_size * 4  # (6 rows x the canvas's 8 positions)


def test_a_sampling_step_is_planned_as_the_entropy_bounded_samplers_tensors(tmp_path):
    """The rollout's full-vocabulary term is the entropy-bounded step's: six float32 ``(rows, L, V)`` tensors (the
    float32 logits, ``ℓ/τ``, and in ``Categorical.entropy`` the normalised logits, probabilities, clamped logits
    and ``p log p``) plus, in bfloat16, the head's own output; the encoder's prefill computes no logits. (Measured
    against sampling calls' peaks in benchmarks/memory_plan_check.py's uniform rollout cases.)"""
    from dataclasses import replace

    from dlmrl.training.memory_config import architecture_for, settings_from_config
    from dlmrl.training.memory_plan import plan_memory

    checkpoint = save_tiny_uniform_checkpoint(tmp_path / "tiny_dg")  # (canvas 8)
    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={checkpoint}", "model.kind=uniform", "task.answer_mode=full",
                          "sampling.steps=4", "train.prompts_per_step=2", "train.num_generations=3"])
    arch, _ = architecture_for(cfg)
    settings, _ = settings_from_config(cfg, 4, 1)
    assert settings.rollout_sampler == "entropy_bound" and settings.rollout_prefill_positions == 0
    units = 6 * 8 * arch.vocab_size  # (6 rows x the canvas's 8 positions x V)
    assert plan_memory(arch, settings).terms["rollout_logits"] == units * 6 * 4
    bf16 = replace(settings, weight_dtype="bfloat16")
    assert plan_memory(arch, bf16).terms["rollout_logits"] == units * (6 * 4 + 2)
    # (the masked and block samplers' Gumbel-max step, for contrast: 4 + 2 x 4 + 5 x 8 bytes per position)
    assert plan_memory(arch, replace(settings, rollout_sampler="gumbel")).terms["rollout_logits"] == units * 52


def _tiny_layer_model(dtype):
    """2 layers: a sliding one (4 heads of 16 over 1 key/value head) and a full-attention one with heads of 32 and
    keys as values (no v_proj), as the 26B-A4B's global layers are shaped relative to its sliding ones."""
    from dlmrl.models.diffusion_gemma import build_tiny_diffusion_gemma

    return build_tiny_diffusion_gemma(vocab_size=64, hidden_size=64, num_layers=2, num_heads=4, head_dim=16,
                                      intermediate_size=96, moe_intermediate_size=24, dtype=dtype,
                                      global_head_dim=32).train()


def _saved_bytes_per_token(dtype, lora: str | None, index: int = 0) -> tuple[int, int]:
    """``(bytes per token autograd saves in decoder layer ``index`` of a tiny DiffusionGemma, rotary cos/sin's
    share)``: the distinct storages ``saved_tensors_hooks`` sees over ``B x T`` tokens, weights excluded (the
    layer's input, a non-leaf as between layers, counts: it is the first norm's float32 input)."""
    import torch

    from dlmrl.models.diffusion_gemma import lora_target_pattern
    from dlmrl.models.lora import apply_lora, parse_target_modules

    model = _tiny_layer_model(dtype)
    assert model.config.text_config._experts_implementation == "grouped_mm"  # (the implementation counted)
    if lora:
        model = apply_lora(model, 8, 16, 0.0, lora, targets=lora_target_pattern(parse_target_modules(lora)))
    layer = next(m for n, m in model.named_modules() if n.endswith(f"decoder.layers.{index}"))
    hd = layer.self_attn.head_dim
    B, T = 3, 8
    x = torch.randn(B, T, 64, dtype=dtype, requires_grad=True).clone()  # (a non-leaf, as a layer's input is)
    cos, sin = torch.randn(B, T, hd, dtype=dtype), torch.randn(B, T, hd, dtype=dtype)
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, position_embeddings=(cos, sin), attention_mask=None)
    return sum(seen.values()) // (B * T), 2 * hd * x.element_size()


def test_the_diffusion_gemma_layer_is_planned_as_autograd_saves_it():
    """The plan's per-token count of a DiffusionGemma decoder layer (eight norms over H, q/k/v norms, the dense
    MLP beside the routed experts, the router) against the bytes autograd's saved-tensor hooks see, in float32 and
    bfloat16, full and LoRA on all-linear (experts and router frozen). The rotary cos/sin the hooks see in the
    layer are a model-level term of the plan. Tolerance: float32 full training is counted exactly (asserted), LoRA
    up to the router's few per-token bytes (8 of ~6,000); in bfloat16 the norms' scales are cast to float32 once
    per call, per-layer constants (~1.9 KB here) that the per-token count leaves out, about 1% over this test's 24
    tokens and less over a real batch's, so 3%. Counted for transformers' ``grouped_mm`` experts and the CPU's SDPA
    kernel (asserted / in use): another implementation keeps other tensors, which this test would catch. Both
    layers: the sliding one, and the full-attention one with its own head shape, keys as values and no v_proj
    (so no v_proj adapter either)."""
    import torch

    from dlmrl.training.memory_plan import MemorySettings, layer_activation_bytes_per_token

    arch = architecture_from_config(_tiny_layer_model(torch.float32).config.to_dict())
    assert arch.kv_shared_layers == (1,) and arch.attention_overrides == ((1, 32, 1),)
    for index in (0, 1):
        for dtype, lora in ((torch.float32, None), (torch.bfloat16, None), (torch.float32, "all-linear"),
                            (torch.bfloat16, "all-linear")):
            saved, rotary = _saved_bytes_per_token(dtype, lora, index)
            settings = MemorySettings(weight_dtype=str(dtype).removeprefix("torch."), lora_r=8 if lora else None,
                                      lora_targets=lora or "all-linear", master_weights=False)
            planned = layer_activation_bytes_per_token(arch, settings, moe=True, index=index)
            kept = saved - rotary
            assert abs(planned - kept) <= 0.03 * kept, (index, dtype, lora, planned, kept)
            if dtype == torch.float32 and lora is None:
                assert planned == kept, (index, planned, kept)


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


def test_checkpointing_leaves_the_encoder_and_its_cache_copies_in_the_plan(tmp_path):
    """transformers checkpoints DiffusionGemma's decoder layers only (``DiffusionGemmaEncoderTextLayer`` is not a
    ``GradientCheckpointingLayer``): with ``model.gradient_checkpointing`` the encoder's share of each step canvas
    (``P + C·L`` over the step canvases of a pass) keeps every layer's activations, and each step canvas holds its
    own copy of the row's encoder cache (``repeated_cache``), with checkpointing or without."""
    from dataclasses import replace

    from dlmrl.training.memory_config import architecture_for, settings_from_config
    from dlmrl.training.memory_plan import kept_activation_bytes, layer_activation_bytes_per_token

    checkpoint = save_tiny_uniform_checkpoint(tmp_path / "tiny_dg")  # (canvas 8)
    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={checkpoint}", "model.kind=uniform", "task.answer_mode=full",
                          "sampling.steps=4", "train.prompts_per_step=2", "train.num_generations=3",
                          "estimator.micro_batch=4", "model.gradient_checkpointing=true"])
    arch, _ = architecture_for(cfg)
    settings, _ = settings_from_config(cfg, 4, 1)
    P, L = 17, 8  # (Sudoku's prompt; the tiny canvas)
    C = -(-(cfg.sampling.gen_length + 1) // L)
    encoder = -(-(P + C * L) // 4)  # (the row's encoder positions over the pass's 4 step canvases)
    assert settings.uncheckpointed_positions == encoder and settings.kv_copy_positions == P + C * L
    n = settings.canvases_per_forward
    full = sum(layer_activation_bytes_per_token(arch, settings, arch.is_moe_layer(i), i)
               for i in range(arch.num_layers))
    full -= 4 * arch.hidden_size * (not settings.full)
    inputs_only = arch.num_layers * arch.hidden_size * 4
    as_checkpointed = replace(settings, uncheckpointed_positions=0)
    assert kept_activation_bytes(arch, settings) - kept_activation_bytes(arch, as_checkpointed) == (
        n * encoder * (full - inputs_only))
    no_copy = replace(settings, kv_copy_positions=0, gradient_checkpointing=False)
    assert kept_activation_bytes(arch, replace(settings, gradient_checkpointing=False)) - kept_activation_bytes(
        arch, no_copy) == n * (P + C * L) * arch.kv_cache_bytes_per_token(4)


def test_the_plans_all_linear_is_the_kinds():
    from dlmrl.models.diffusion_gemma import DEFAULT_LORA_TARGETS
    from dlmrl.training.memory_plan import DIFFUSION_GEMMA_ALL_LINEAR

    assert tuple(DIFFUSION_GEMMA_ALL_LINEAR) == tuple(DEFAULT_LORA_TARGETS)


def _global_layers_model():
    """A tiny DiffusionGemma whose full-attention layers are shaped as the 26B's are relative to its sliding ones:
    twice the head dimension, fewer key/value heads, keys as values (no v_proj)."""
    import torch
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    text = {"vocab_size": 40, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "global_head_dim": 16,
            "num_global_key_value_heads": 1, "attention_k_eq_v": True, "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention", "full_attention"], "num_experts": 2,
            "top_k_experts": 1, "moe_intermediate_size": 8, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 2, "head_dim": 8, "patch_size": 4, "position_embedding_size": 64,
              "pooling_kernel_size": 1}
    torch.manual_seed(0)
    config = DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=4, boi_token_id=37,
                                  eoi_token_id=38, image_token_id=39)
    return DiffusionGemmaForBlockDiffusion(config), text


@pytest.mark.parametrize("source", ["saved config", "release keys"])
def test_global_layers_are_counted_with_their_own_shapes(source):
    """The plan reads the global layers' head dimension and key/value heads (the config as transformers saves it,
    with ``per_layer_config``, or the release's ``global_head_dim`` / ``num_global_key_value_heads`` keys): the
    parameters, the LoRA parameters and the key/value cache per token equal the model's own."""
    from dlmrl.models.diffusion_gemma import lora_target_pattern
    from dlmrl.models.lora import apply_lora, parse_target_modules

    model, text = _global_layers_model()
    config = model.config.to_dict() if source == "saved config" else {"model_type": "diffusion_gemma",
                                                                       "text_config": text}
    arch = architecture_from_config(config)
    assert arch.attention_overrides == ((1, 16, 1), (2, 16, 1)) and arch.kv_shared_layers == (1, 2)
    assert arch.parameter_count() == sum(p.numel() for n, p in model.named_parameters() if "vision" not in n)
    layers = model.model.decoder.layers
    assert arch.kv_cache_bytes_per_token(4) == sum(2 * layer.self_attn.k_proj.out_features * 4 for layer in layers)
    for spec in ("all-linear", "q_proj,o_proj", "k_proj"):
        targets = lora_target_pattern(parse_target_modules(spec))
        adapted = apply_lora(_global_layers_model()[0], 2, 4, 0.0, spec, targets=targets)
        # (the encoder's and the decoder's adapters, not yet shared: each layer adapted twice)
        assert 2 * arch.lora_parameters(2, spec) == sum(p.numel() for p in adapted.parameters() if p.requires_grad)
