"""``model.kind: uniform`` (DiffusionGemma, issue 35) at training scale: LoRA on the text layers (one adapter shared
by the encoder and the decoder), the adapter-disabled KL reference, save and reload, gradient checkpointing,
bfloat16, and ``train.rollout_is_cap`` on the trajectory likelihood."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from dlmrl import cli
from dlmrl.config import Config, ConfigError, apply_overrides, validate
from dlmrl.kinds import kind_of
from dlmrl.models.diffusion_gemma import DEFAULT_LORA_TARGETS, share_encoder_adapters, unwrap_diffusion_gemma
from dlmrl.models.lora import AdapterDisabledPolicy, lora_parameter_count, save_final_model
from dlmrl.models.lora import prepare_for_training as _prepare
from dlmrl.models.uniform_policy import (
    build_tiny_uniform_policy,
    load_uniform_policy,
    save_tiny_uniform_checkpoint,
)
from dlmrl.training.uniform_trajectory import UniformTrajectoryScorer, rollout_uniform, trajectory_logprobs
from tests.tolerances import EPS32, rounding_tol

SMALL = ["train.max_steps=2", "train.prompts_per_step=3", "train.num_generations=4", "eval.before=false",
         "eval.after=false", "train.warmup_steps=0", "train.learning_rate=1e-2"]
#: the tiny model's text layers (2) and the suffixes all-linear adapts there (layer 1 is a global-attention layer
#: whose keys are its values: no v_proj)
TEXT_LAYERS = re.compile(r"model\.(encoder\.language_model|decoder)\.layers\.(\d+)\.(.+)")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_uniform_checkpoint(tmp_path_factory.mktemp("uniform_lora") / "tiny_dg")


def _config(checkpoint: Path, *extra: str) -> Config:
    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={checkpoint}", "model.kind=uniform", "task.answer_mode=full",
                          "train.algorithm=grpo", *extra])
    return cfg


def _prepare_uniform(policy, model_cfg):
    return _prepare(policy, model_cfg, kind_of("uniform"))


def _adapted(model) -> dict[str, torch.nn.Module]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    inner = unwrap_diffusion_gemma(model)
    return {n: m for n, m in inner.named_modules(remove_duplicate=False) if isinstance(m, BaseTunerLayer)}


def _rollout(policy, cfg, seed: int = 3):
    from dlmrl.training.run_setup import build_task

    task = build_task(cfg, policy)
    return rollout_uniform(policy, task, cfg, task.train_batch(2, 0, 0), torch.Generator().manual_seed(seed), 17)


def _score(policy, ro, grad: bool = False, through: bool = False) -> torch.Tensor:
    return trajectory_logprobs(policy.model, ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask,
                               ro.kind_record, grad=grad, through=through)[0]


def _train_adapter(policy, seed: int = 0) -> None:
    """Stand-in for training: the adapters' A and B matrices (B zero at creation, A drawn from the global generator)
    set to seeded random values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def test_lora_adapts_attention_and_dense_mlp_of_the_text_layers_once_for_encoder_and_decoder():
    """all-linear on DiffusionGemma = NeMo AutoModel's recipe's targets (router, experts, vision tower,
    self-conditioning MLP and head frozen), one adapter per layer shared by the encoder's and the decoder's trees."""
    policy = build_tiny_uniform_policy()
    cfg = _config(Path("unused"), "model.use_peft=true", "model.lora_dropout=0.0").model
    _prepare_uniform(policy, cfg)
    adapted = _adapted(policy.model)
    assert adapted and all(TEXT_LAYERS.fullmatch(n) for n in adapted)  # (no vision tower, self-conditioning, head)
    suffixes = {TEXT_LAYERS.fullmatch(n).group(3) for n in adapted}
    assert suffixes == set(DEFAULT_LORA_TARGETS)
    inner = unwrap_diffusion_gemma(policy.model)
    for name, module in adapted.items():  # (the decoder's layer is the encoder's own module)
        _tree, layer, suffix = TEXT_LAYERS.fullmatch(name).groups()
        twin = inner.get_submodule(f"model.encoder.language_model.layers.{layer}.{suffix}")
        assert module is twin
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert not any(re.search(r"router|experts|vision|self_conditioning|embed|lm_head", n) for n in trainable)
    decoder = [m for n, m in adapted.items() if n.startswith("model.decoder.")]  # (the shared modules, once each)
    r = cfg.lora_r  # (counted once: r·(in + out) per decoder layer adapted)
    assert lora_parameter_count(policy.model) == sum(r * (m.in_features + m.out_features) for m in decoder)


def test_dry_run_names_the_lora_targets(checkpoint, capsys):
    assert cli.main(["train", "--dry-run", f"model.name_or_path={checkpoint}", "model.kind=uniform",
                     "task.answer_mode=full", "train.algorithm=grpo", "model.use_peft=true"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "self_attn.q_proj" in out and "mlp.down_proj" in out and "shared by the encoder and the decoder" in out


def test_lora_target_names_stay_inside_the_text_layers():
    policy = build_tiny_uniform_policy()
    _prepare_uniform(policy, _config(Path("unused"), "model.use_peft=true",
                                         "model.lora_target_modules=q_proj,v_proj").model)
    assert {TEXT_LAYERS.fullmatch(n).group(3) for n in _adapted(policy.model)} == {"self_attn.q_proj",
                                                                                     "self_attn.v_proj"}
    with pytest.raises(ConfigError, match="config key 'model.lora_target_modules'"):
        _prepare_uniform(build_tiny_uniform_policy(), _config(Path("unused"), "model.use_peft=true",
                                                                  "model.lora_target_modules=nothing_here").model)


def test_the_trajectory_scorers_reference_is_the_base(checkpoint):
    """A trained adapter changes the scores; the KL reference (AdapterDisabledPolicy) scores exactly as the base
    model does, through the scorer."""
    cfg = _config(checkpoint, "model.use_peft=true", "model.lora_dropout=0.0", "train.num_generations=3")
    base = load_uniform_policy(str(checkpoint))
    ro = _rollout(base, cfg)
    expected = _score(base, ro)
    policy = _prepare_uniform(load_uniform_policy(str(checkpoint)), cfg.model)
    _train_adapter(policy)
    scorer = UniformTrajectoryScorer(policy, AdapterDisabledPolicy(policy), old_scores=True)
    old = scorer.prepare(ro, 2, torch.Generator())
    assert torch.equal(old.ref[0], expected)  # (the same modules, the adapters switched off: the same arithmetic)
    assert not torch.allclose(old.old[1], expected)


def test_the_elbo_scorers_reference_is_the_base_too(checkpoint):
    """The uniform ELBO scorer's KL reference under LoRA scores the base model's bound (same noise plan)."""
    from dlmrl.training.uniform_elbo_scorer import UniformELBOScorer

    cfg = _config(checkpoint, "model.use_peft=true", "model.lora_dropout=0.0", "train.num_generations=3",
                  "estimator.name=uniform_sdmc")
    estimator = kind_of("uniform").own_estimator(cfg)
    base = load_uniform_policy(str(checkpoint))
    ro = _rollout(base, cfg)
    expected = UniformELBOScorer(base, base, estimator).prepare(ro, 1, torch.Generator().manual_seed(5)).ref[0]
    policy = _prepare_uniform(load_uniform_policy(str(checkpoint)), cfg.model)
    _train_adapter(policy)
    old = UniformELBOScorer(policy, AdapterDisabledPolicy(policy), estimator).prepare(
        ro, 2, torch.Generator().manual_seed(5))
    assert torch.equal(old.ref[0], expected)  # (the same plan: the generator's first draw)
    assert not torch.allclose(old.old[1], old.ref[1])


def test_two_lora_steps_move_only_the_adapter_and_save_an_adapter_folder_of_kind_uniform(checkpoint, tmp_path):
    """2 GRPO steps with use_peft, a KL term (the adapter-disabled reference) and gradient checkpointing: the
    adapter moves, every base weight (router and experts included) is bit-identical, final_model/ is an adapter
    recording kind uniform."""
    from dlmrl import Trainer
    from dlmrl.models.diffusion_gemma import load_diffusion_gemma

    model = load_diffusion_gemma(str(checkpoint), "float32")
    base = {k: v.clone() for k, v in model.state_dict().items()}
    policy = build_tiny_uniform_policy()  # (its tokenizer: the checkpoint's)
    data = {"prompt": ["12|34=", "43|21=", "1|2="], "answer": ["1234", "4321", "12"]}

    def ones(prompts, completions, **columns):
        return [float(c.count("1") + 2 * c.count("2")) for c in completions]

    out = tmp_path / "run"
    trainer = Trainer(model, tokenizer=policy.tokenizer, reward_funcs=[ones], train_dataset=data,
                      config={"train.max_steps": 2, "train.prompts_per_step": 3, "train.num_generations": 4,
                              "eval.before": False, "eval.after": False, "output_dir": str(out),
                              "sampling.gen_length": 8, "model.use_peft": True, "model.gradient_checkpointing": True,
                              "train.beta": 0.05, "train.learning_rate": 1e-2, "train.warmup_steps": 0,
                              "model.name_or_path": str(checkpoint)})
    trainer.train(progress=False)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(r["grad_norm"] > 0 for r in lines) and all("kl" in r for r in lines if r["rows_scored"])
    after = model.state_dict()  # (peft injected its layers into this module: base weights under base_layer)
    moved = [k for k in after if "lora_B" in k and after[k].abs().max() > 0]
    assert moved
    for key, value in after.items():
        if "lora_" in key:
            continue
        assert torch.equal(value, base[key.replace(".base_layer.", ".")]), key
    note = json.loads((out / "final_model" / "dlmrl_base_model.json").read_text())
    assert note["kind"] == "uniform" and (out / "final_model" / "adapter_config.json").is_file()
    from dlmrl.kinds import kind_names
    from dlmrl.models.loading import checkpoint_kind

    assert checkpoint_kind(str(out / "final_model"), kind_names()) == "uniform"  # (dlmrl eval --model's kind)


def test_a_lora_run_resumes_exactly(checkpoint, tmp_path, monkeypatch):
    """A LoRA run stopped after its first step's checkpoint and resumed ends bit for bit where the uninterrupted run
    does: the checkpoint holds the shared adapter once (the trainable tensors, under the encoder's names) and puts it
    back into the one module both trees use."""
    from safetensors.torch import load_file

    from tests.helpers import crash_then_resume

    def run(out, resume=False):
        return cli.main(["train", "--output-dir", str(out), "--no-progress", *(["--resume"] if resume else []),
                         f"model.name_or_path={checkpoint}", "model.kind=uniform", "task.answer_mode=full",
                         "train.algorithm=grpo", "model.use_peft=true", "model.lora_dropout=0.0", "train.save_steps=1",
                         "train.num_iterations=2", *SMALL])

    full, crashed = tmp_path / "full", tmp_path / "crashed"
    assert run(full) == 0
    crash_then_resume(monkeypatch, lambda resume: run(crashed, resume), crash_step=1)
    saved = load_file(str(crashed / "checkpoints" / "step-1" / "model.safetensors"))
    assert saved and all("lora_" in k and ".decoder." not in k for k in saved)
    a = load_file(str(full / "final_model" / "adapter_model.safetensors"))
    b = load_file(str(crashed / "final_model" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and any(v.abs().max() > 0 for k, v in a.items() if "lora_B" in k)
    for k in a:  # (the resumed step reruns the same code on the same reloaded state)
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0)


def _saved_adapter(checkpoint, folder):
    """A trained adapter (dropout 0, seed 1) saved to ``folder`` as a run's final_model: ``(policy, rollout, its
    scores before saving)``."""
    cfg = _config(checkpoint, "model.use_peft=true", "model.lora_dropout=0.0", "train.num_generations=3")
    policy = _prepare_uniform(load_uniform_policy(str(checkpoint)), cfg.model)
    _train_adapter(policy, seed=1)
    ro = _rollout(policy, cfg)
    expected = _score(policy, ro)
    save_final_model(policy.model, policy.tokenizer, folder, cfg.model)
    return policy, ro, expected


def test_a_saved_adapter_reloads_to_the_same_scores(checkpoint, tmp_path):
    """save_final_model → load_uniform_policy (the adapter folder: its base from the note, each adapter shared
    again) gives the same trajectory log-probs; so does plain peft followed by share_encoder_adapters (peft saved
    each shared adapter once, under the encoder's name); a loader for other kinds refuses it, naming
    load_uniform_policy."""
    from peft import PeftModel

    from dlmrl.models.diffusion_gemma import load_diffusion_gemma
    from dlmrl.models.loading import load_policy

    policy, ro, expected = _saved_adapter(checkpoint, tmp_path / "final")
    reloaded = load_uniform_policy(str(tmp_path / "final"))
    assert len(_adapted(reloaded.model)) == len(_adapted(policy.model))
    inner = unwrap_diffusion_gemma(reloaded.model)
    assert inner.model.encoder.language_model.layers[1].mlp.up_proj is inner.model.decoder.layers[1].mlp.up_proj
    # (the same modules and weights in the same order: the same float32 arithmetic)
    assert torch.equal(_score(reloaded, ro), expected)
    with pytest.warns(UserWarning, match="missing adapter keys"):  # (the decoder's: saved once, as the encoder's)
        plain_model = PeftModel.from_pretrained(load_diffusion_gemma(str(checkpoint), "float32"), str(tmp_path / "final"))
    plain = reloaded.__class__(model=plain_model, tokenizer=reloaded.tokenizer, eos_token_id=reloaded.eos_token_id,
                               pad_token_id=reloaded.pad_token_id)
    assert share_encoder_adapters(plain.model) == len(_adapted(policy.model)) // 2
    assert torch.equal(_score(plain, ro), expected)
    with pytest.raises(ValueError, match="load_uniform_policy"):
        load_policy(str(tmp_path / "final"))
    # the kind's own loader reads it from the config as well
    again = kind_of("uniform").load(_config(tmp_path / "final").model)
    assert torch.equal(_score(again, ro), expected)


def test_an_adapter_folder_trained_in_full_is_merged_everywhere(checkpoint, tmp_path):
    """An adapter folder run with use_peft false: the adapter is merged into the (tied) base weights and no adapter
    layer is left in either tree (peft unloads a shared module under one name only); the scores are the adapted
    model's up to the merge's rounding."""
    from dlmrl.models.lora import prepare_for_training

    _, ro, expected = _saved_adapter(checkpoint, tmp_path / "final")
    merged = prepare_for_training(load_uniform_policy(str(tmp_path / "final")), _config(tmp_path / "final").model,
                                  kind_of("uniform"))
    assert not _adapted(merged.model) and not any("lora_" in n for n, _ in merged.model.named_parameters())
    # (W + BA rounded once in float32 against W x + B (A x): each log-prob is reached through ≤ 1,000 float32
    # accumulations (2 layers of hidden 64, MLP 128, experts 2 x 32, ≤ 50 keys; self-conditioning 64 + 128; the
    # 22-token log-sum-exp), each off by ≤ one ulp of its size, and a row's position sums ≤ 4 steps' terms; the
    # adapter moves the scores by far more than that)
    scale = float(expected.abs().max())
    tol = 4 * rounding_tol(scale=scale, n=1000)
    assert (_score(merged, ro) - expected).abs().max() <= tol
    assert (_score(load_uniform_policy(str(checkpoint)), ro) - expected).abs().max() > 100 * tol


@pytest.mark.parametrize("through", [False, True])
def test_gradient_checkpointing_recomputes_the_decoder_layers_with_the_same_gradient(checkpoint, through):
    """model.gradient_checkpointing: the decoder's layers run again in the backward pass (their forward count
    doubles) and the trajectory's gradient is that of the plain run; with estimator.self_conditioning through too,
    whose sequential passes read the encoder's cache while the next canvas's encoder pass extends it (the
    recompute must see what the forward read)."""
    grads, calls = [], []
    for checkpointing in (False, True):
        cfg = _config(checkpoint, "model.use_peft=true", "model.lora_dropout=0.0", "train.num_generations=3",
                      f"model.gradient_checkpointing={str(checkpointing).lower()}")
        policy = _prepare_uniform(load_uniform_policy(str(checkpoint)), cfg.model)
        _train_adapter(policy, seed=2)
        ro = _rollout(policy, cfg)
        policy.model.train()  # (transformers checkpoints in train mode only; dropout is 0)
        count = [0]
        layer = unwrap_diffusion_gemma(policy.model).model.decoder.layers[0]
        assert layer.gradient_checkpointing is checkpointing
        # (transformers checkpoints the layer's forward, not its __call__: count its attention's calls, which the
        # recompute repeats)
        handle = layer.self_attn.register_forward_pre_hook(lambda *a, c=count: c.__setitem__(0, c[0] + 1))
        weights = torch.linspace(-1, 1, ro.completion.numel()).reshape(ro.completion.shape)
        before = count[0]
        (_score(policy, ro, grad=True, through=through) * weights).sum().backward()
        handle.remove()
        calls.append(count[0] - before)
        grads.append(torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None]))
    # the no-grad sequential passes run the layer once each either way; the batched pass's layer call runs again in
    # the backward pass with checkpointing: one more call per canvas that has a batched pass
    assert calls[1] > calls[0]
    # (the recompute runs the same float32 operations on the same inputs; allow each gradient entry's sum over
    # rows · C · N · L = 6 · 3 · 4 · 8 per-draw contributions to round differently)
    terms = 6 * 3 * 4 * 8
    assert (grads[0] - grads[1]).abs().max() <= terms * EPS32 * grads[0].abs().max()


def test_bfloat16_full_fine_tuning_keeps_float32_master_weights(checkpoint, tmp_path):
    """model.dtype bfloat16 without LoRA (fp32_master_weights, the default): 2 steps with gradient checkpointing run;
    final_model/ holds float32 weights that moved."""
    from safetensors.torch import load_file

    out = tmp_path / "run"
    assert cli.main(["train", "--output-dir", str(out), "--no-progress",
                     f"model.name_or_path={checkpoint}", "model.kind=uniform", "task.answer_mode=full",
                     "train.algorithm=grpo", "model.dtype=bfloat16", "model.gradient_checkpointing=true",
                     *SMALL]) == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2] and any(r["grad_norm"] > 0 for r in lines)
    # (sampler and scorer both compute in bfloat16, in batches of other shapes: a per-position sum of ≤ N = 4 steps'
    # log-probs, each within a few bfloat16 roundings of |log p| ≤ log V + 2·max|logit|/t_min; the scorer's value
    # is summed per row and canvas: bound it by bfloat16's eps (2^-8) times 64 such terms of size 16)
    for r in lines:
        assert r["rollout_logp_gap_max"] is None or r["rollout_logp_gap_max"] <= 64 * 2 ** -8 * 16
    before, after = load_file(checkpoint / "model.safetensors"), load_file(out / "final_model" / "model.safetensors")
    assert all(v.dtype == torch.float32 for v in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)


def test_rollout_is_cap_applies_to_the_trajectory_likelihood_only(checkpoint):
    validate(_config(checkpoint, "train.rollout_is_cap=2"), data=False)
    validate(_config(checkpoint, "train.rollout_is_cap=2", "estimator.name=trajectory"), data=False)
    with pytest.raises(ConfigError, match="config key 'train.rollout_is_cap'.*uniform_sdmc"):
        validate(_config(checkpoint, "train.rollout_is_cap=2", "estimator.name=uniform_sdmc"), data=False)
    with pytest.raises(ConfigError, match="config key 'train.rollout_is_cap'"):
        validate(_config(checkpoint, "train.rollout_is_cap=0.5"), data=False)


def test_a_capped_weight_reweights_the_tokens_the_rollout_drew_off_policy(checkpoint, tmp_path, monkeypatch):
    """Rollout log-probs lowered by 1 nat at every scored position: Δ = +1, each weight min(e^Δ, 1.5) = 1.5; the gap
    logged is 1 (float32: the MoE's grouped matmul takes no float64)."""
    from dlmrl.training import uniform_trajectory

    original = uniform_trajectory.rollout_uniform

    def off_policy(*args, **kwargs):
        ro = original(*args, **kwargs)
        ro.token_logprobs = torch.where(ro.completion_mask, ro.token_logprobs - 1.0, ro.token_logprobs)
        return ro

    monkeypatch.setattr(uniform_trajectory, "rollout_uniform", off_policy)  # (the kind samples with it)
    out = tmp_path / "run"
    assert cli.main(["train", "--output-dir", str(out), "--no-progress", f"model.name_or_path={checkpoint}",
                     "model.kind=uniform", "task.answer_mode=full", "train.algorithm=grpo",
                     "train.rollout_is_cap=1.5", *SMALL]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["rows_scored"]]
    assert rows
    # Δ = 1 + the plain run's gap, which is float batch effects only: within the 1e-3 that
    # test_uniform_kind.test_two_training_steps_move_the_parameters_and_log_the_gap bounds it by; e^Δ ≥ e^0.999 > 1.5,
    # so every weight is the cap itself and their mean is 1.5 up to the mean's float32 rounding
    gap_tol = 1e-3
    for row in rows:
        assert row["rollout_logp_gap_mean"] == pytest.approx(1.0, abs=gap_tol)
        assert row["rollout_logp_gap_max"] == pytest.approx(1.0, abs=gap_tol)
        assert row["rollout_is_weight_mean"] == pytest.approx(1.5, abs=rounding_tol(scale=1.5, n=1))


def test_an_adapter_trained_on_the_shipped_model_loads_and_evaluates_offline(tmp_path, monkeypatch, capsys):
    """The adapter folder of a LoRA run on tiny-sudoku-uniform records the shipped name as its base; loading it
    resolves that name to the shipped folder (it went to the hub before), and dlmrl eval --model runs on it."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "run"
    assert cli.main(["train", "--config", str(Path(__file__).parents[2] / "configs" / "grpo_sudoku_tiny_uniform.yaml"),
                     f"output_dir={out}", "--no-progress", "train.max_steps=1", "train.prompts_per_step=2",
                     "model.use_peft=true", "eval.before=false", "eval.after=false"]) == 0
    assert json.loads((out / "final_model" / "adapter_config.json").read_text())["base_model_name_or_path"] == (
        "tiny-sudoku-uniform")
    policy = load_uniform_policy(str(out / "final_model"), "float32")
    assert any("lora_B" in name for name, _ in policy.model.named_parameters())
    capsys.readouterr()
    assert cli.main(["eval", "--model", str(out / "final_model"), "model.kind=uniform", "task.answer_mode=full",
                     "eval.num_puzzles=4"]) == 0
    assert "cell_accuracy" in capsys.readouterr().out
