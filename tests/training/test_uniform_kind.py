"""``model.kind: uniform`` (DiffusionGemma, issue 35): training steps of the group presets on a tiny random
DiffusionGemma saved locally, the trajectory likelihood against the sampler's record, the config check, --dry-run and
the saved kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dlmrl import cli
from dlmrl.config import Config, ConfigError, apply_overrides, validate
from dlmrl.models.uniform_policy import build_tiny_uniform_policy, save_tiny_uniform_checkpoint
from dlmrl.training.uniform_trajectory import rollout_uniform, trajectory_logprobs

SMALL = ["train.max_steps=2", "train.prompts_per_step=3", "train.num_generations=4", "eval.before=false",
         "eval.after=false", "train.warmup_steps=0", "train.learning_rate=1e-3"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return save_tiny_uniform_checkpoint(tmp_path_factory.mktemp("uniform") / "tiny_dg")


def _args(checkpoint: Path, *extra: str) -> list[str]:
    return [f"model.name_or_path={checkpoint}", "model.kind=uniform", "task.answer_mode=full", *extra]


def _config(checkpoint: Path, *extra: str) -> Config:
    cfg = Config()
    apply_overrides(cfg, _args(checkpoint, *extra))
    return cfg


@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo", "gspo", "dapo"])
def test_two_training_steps_move_the_parameters_and_log_the_gap(checkpoint, tmp_path, algorithm):
    from safetensors.torch import load_file

    out = tmp_path / "run"
    assert cli.main(["train", "--output-dir", str(out), "--no-progress", *_args(checkpoint, *SMALL,
                                                                                 f"train.algorithm={algorithm}")]) == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]
    assert any(r["grad_norm"] > 0 for r in lines)  # (a step whose groups all tie has no signal)
    for r in lines:
        assert r["nfe_sampling"] > 0 and r["nfe_scoring"] > 0
        # (scores taken right after sampling, at the weights that sampled: only float batch effects; a step that
        # scores no row, every group tied, logs None)
        assert r["rollout_logp_gap_max"] is None or r["rollout_logp_gap_max"] < 1e-3
    assert any(r["rollout_logp_gap_max"] is not None for r in lines)
    before, after = load_file(checkpoint / "model.safetensors"), load_file(out / "final_model" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert json.loads((out / "final_model" / "config.json").read_text())["dlmrl_kind"] == "uniform"


def test_the_trajectory_likelihood_equals_the_samplers_record(checkpoint):
    """Scoring right after sampling, with and without grad, gives the recorded log-probs per position.

    Tolerance: each term is log_softmax(ℓ/τ)[x] in float32, computed by the sampler as ℓ/τ − logsumexp and here by
    log_softmax, possibly in another batch composition; its error is a few ulps of the largest magnitude involved,
    |ℓ/τ| ≤ 30/τ_min (the softcap) plus log V. A position sums at most one term per step (N steps per canvas, the
    EOS position also the folded terms of its canvas: N·L), so the bound is 8·eps·(30/τ_min + log V)·N·L."""
    from dlmrl.training.run_setup import build_task

    for draw_last in (False, True):
        cfg = _config(checkpoint, "train.num_generations=4", f"sampling.draw_last_step={str(draw_last).lower()}")
        policy = build_tiny_uniform_policy()
        task = build_task(cfg, policy)
        ro = rollout_uniform(policy, task, cfg, task.train_batch(3, 0, 0), torch.Generator().manual_seed(0), 17)
        assert ro.completion.shape == (12, 24) and ro.kind_record["inputs"].shape == (12, 3, 4, 8)
        t_min = float(ro.kind_record["temperatures"].min())
        N, L, V = 4, 8, policy.vocab_size
        tol = 8 * torch.finfo(torch.float32).eps * (30 / t_min + torch.log(torch.tensor(float(V)))) * N * L
        for grad in (False, True):
            logp, passes = trajectory_logprobs(policy.model, ro.prompt_ids, ro.prompt_mask, ro.completion,
                                               ro.completion_mask, ro.kind_record, grad=grad)
            assert (logp.detach() - ro.token_logprobs).abs().max() <= tol
            assert passes > 0
        # (the whole trajectory: every row has scored terms; zero off the mask)
        assert (ro.token_logprobs.sum(-1) < 0).all()
        assert (ro.token_logprobs[~ro.completion_mask] == 0).all()


def test_the_gradient_reaches_the_weights_but_not_through_self_conditioning(checkpoint):
    from dlmrl.training.run_setup import build_task

    cfg = _config(checkpoint, "train.num_generations=2")
    policy = build_tiny_uniform_policy()
    task = build_task(cfg, policy)
    ro = rollout_uniform(policy, task, cfg, task.train_batch(2, 0, 0), torch.Generator().manual_seed(1), 17)
    logp, _ = trajectory_logprobs(policy.model, ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask,
                                  ro.kind_record, grad=True)
    logp.sum().backward()
    grads = {n: p.grad for n, p in policy.model.named_parameters() if p.grad is not None}
    assert any("self_conditioning" in n for n in grads) and any("encoder" in n or "layers" in n for n in grads)


def test_a_process_share_samples_only_its_rows_with_its_own_seed(checkpoint, monkeypatch):
    """prompts = (lo, hi) (one process's share): the sampler runs on that share's (hi - lo)·G rows only, with
    share_seed(seed, lo), and gives exactly the rollout of sampling those prompts alone with that seed; the whole
    batch (a one-process run) keeps the drawn seed; an empty share samples one row and keeps none."""
    from dlmrl.models.ar import draw_seed
    from dlmrl.models.uniform_policy import UniformNoisePolicy
    from dlmrl.training.run_setup import build_task
    from dlmrl.training.uniform_trajectory import share_seed

    cfg = _config(checkpoint, "train.num_generations=2")
    policy = build_tiny_uniform_policy()
    task = build_task(cfg, policy)
    examples = task.train_batch(3, 0, 0)
    calls = []
    real = UniformNoisePolicy.sample
    monkeypatch.setattr(UniformNoisePolicy, "sample", lambda self, ids, *a, seed=None, **k: (
        calls.append((ids.shape[0], seed)), real(self, ids, *a, seed=seed, **k))[1])
    seed = draw_seed(torch.Generator().manual_seed(5))
    share = rollout_uniform(policy, task, cfg, examples, torch.Generator().manual_seed(5), 17, prompts=(1, 3))
    alone = rollout_uniform(policy, task, cfg, examples[1:3], share_seed(seed, 1), 17)
    whole = rollout_uniform(policy, task, cfg, examples, torch.Generator().manual_seed(5), 17)
    empty = rollout_uniform(policy, task, cfg, examples, torch.Generator().manual_seed(5), 17, prompts=(3, 3))
    assert calls == [(4, share_seed(seed, 1)), (4, share_seed(seed, 1)), (6, seed), (2, share_seed(seed, 3))]
    assert share_seed(seed, 1) != seed and share_seed(seed, 1) != share_seed(seed, 3)
    assert torch.equal(share.completion, alone.completion) and len(share) == 4 and len(whole) == 6
    assert torch.equal(share.token_logprobs, alone.token_logprobs) and len(empty) == 0
    for key, value in share.kind_record.items():
        assert torch.equal(value, alone.kind_record[key]), key


def test_rows_and_concatenation_keep_the_record(checkpoint):
    from dlmrl.training.rollout import Rollout
    from dlmrl.training.run_setup import build_task

    cfg = _config(checkpoint, "train.num_generations=2")
    policy = build_tiny_uniform_policy()
    task = build_task(cfg, policy)
    ro = rollout_uniform(policy, task, cfg, task.train_batch(2, 0, 0), torch.Generator().manual_seed(2), 17)
    both = Rollout.cat([ro, ro.rows(torch.tensor([3, 1]))], pad_id=0)
    assert both.kind_record["inputs"].shape[0] == 6
    assert torch.equal(both.kind_record["drawn"][4], ro.kind_record["drawn"][3])
    sub = both.rows(torch.tensor([4]))
    a, _ = trajectory_logprobs(policy.model, sub.prompt_ids, sub.prompt_mask, sub.completion, sub.completion_mask,
                               sub.kind_record)
    b, _ = trajectory_logprobs(policy.model, ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask,
                               ro.kind_record)
    assert torch.allclose(a[0], b[3], atol=1e-5)


def test_dry_run_describes_the_sampler_and_the_likelihoods_passes(checkpoint, capsys):
    assert cli.main(["train", "--dry-run", *_args(checkpoint, "train.algorithm=grpo", "sampling.entropy_bound=0.5")]) == 0
    out = " ".join(capsys.readouterr().out.split())  # (yaml wraps long values)
    assert "entropy-bounded uniform denoising" in out and "entropy_bound: 0.5" in out
    assert "trajectory likelihood (uniform)" in out and "self-conditioning" in out and "batched pass" in out


def test_equal_temperature_ends_are_refused_up_front(checkpoint):
    """transformers' generation config refuses t_max == t_min when the first rollout builds it; the config check
    refuses it before, naming the key."""
    cfg = _config(checkpoint, "train.algorithm=grpo", "sampling.t_max=0.6", "sampling.t_min=0.6")
    with pytest.raises(ConfigError, match="config key 'sampling.t_max'") as err:
        validate(cfg, data=False)
    assert "must be > t_min" in str(err.value)


@pytest.mark.parametrize("override, key", [
    ("sampling.entropy_bound=-1", "sampling.entropy_bound"),
    ("sampling.stability_threshold=-1", "sampling.stability_threshold"),
    ("sampling.threshold=0.9", "sampling.threshold"),
    ("sampling.cache=prefix", "sampling.cache"),
    ("sampling.temperature=0.5", "sampling.temperature"),
    ("task.answer_mode=infill", "task.answer_mode"),
    ("train.algorithm=gdpo", "train.algorithm"),
    ("train.algorithm=egsw", "train.algorithm"),
    ("train.algorithm=dagrpo", "train.algorithm"),
    ("train.algorithm=just_grpo", "train.algorithm"),  # (a left-to-right order: no uniform sampler takes one)
    ("sampling.t_max=0.01", "sampling.t_max"),  # (below the checkpoint's t_min: generate raises at the first rollout)
    ("estimator.logits_chunk=4", "estimator.logits_chunk"),
    ("estimator.name=sdmc", "estimator.name"),
])
def test_config_errors_name_the_key(checkpoint, override, key):
    cfg = _config(checkpoint, "train.algorithm=grpo", override)
    with pytest.raises(ConfigError, match=f"config key '{key}'") as err:
        validate(cfg, data=False)
    assert "model.kind 'ar'" not in str(err.value)


@pytest.mark.parametrize("override", ["sampling.entropy_bound=0.5", "sampling.t_max=1.0", "sampling.t_min=0.3",
                                      "sampling.stability_threshold=2", "sampling.confidence_threshold=0.01",
                                      "sampling.draw_last_step=true"])
@pytest.mark.parametrize("kind", ["diffusion", "ar"])
def test_the_other_kinds_refuse_the_uniform_sampler_keys_when_set(kind, override):
    cfg = Config()
    extra = ["model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "task.answer_mode=full",
             "train.algorithm=grpo"] if kind == "ar" else []
    apply_overrides(cfg, [*extra, override])
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=f"config key '{key}'.*uniform"):
        validate(cfg, data=False)


def test_a_saved_final_model_reloads_as_uniform(checkpoint, tmp_path):
    out = tmp_path / "run"
    assert cli.main(["train", "--output-dir", str(out), "--no-progress",
                     *_args(checkpoint, *SMALL, "train.max_steps=1", "train.algorithm=grpo")]) == 0
    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={out / 'final_model'}", "task.answer_mode=full",
                          "train.algorithm=grpo"])
    validate(cfg, data=False)
    assert cfg.model.kind == "uniform"
    where = tmp_path / "eval"
    assert cli.main(["eval", "--model", str(out / "final_model"), "--output-dir", str(where),
                     "eval.num_puzzles=4", "eval.batch_size=4"]) == 0
    (record,) = json.loads((where / "eval.json").read_text())
    assert record["record"]["model"]["kind"] == "uniform"


@pytest.mark.parametrize("kind", ["diffusion", "block", "ar"])
def test_a_diffusion_gemma_checkpoint_on_another_kind_is_refused_naming_the_kind(checkpoint, kind):
    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={checkpoint}", f"model.kind={kind}", "task.answer_mode=full",
                          "train.algorithm=grpo", *(["model.block_size=4"] if kind == "block" else [])])
    with pytest.raises(ConfigError, match="config key 'model.kind'.*DiffusionGemma.*set model.kind uniform"):
        validate(cfg, data=False)


def test_the_python_api_takes_the_uniform_kind_from_a_loaded_diffusion_gemma(checkpoint):
    """``Trainer(model=<DiffusionGemmaForBlockDiffusion>)``'s config takes the uniform kind from the model's config
    (it records no dlmrl_kind) and the kind's default algorithm (grpo); a UniformNoisePolicy says its kind."""
    from dlmrl.api import trainer_config
    from dlmrl.models.diffusion_gemma import load_diffusion_gemma

    model = load_diffusion_gemma(str(checkpoint), "float32")
    cfg = trainer_config({"train.max_steps": 1}, model=model)
    assert (cfg.model.kind, cfg.train.algorithm) == ("uniform", "grpo")
    policy = build_tiny_uniform_policy()
    assert trainer_config(None, model=policy).model.kind == "uniform"


def test_scoring_in_chunks_gives_the_same_gradient_and_holds_one_pass(checkpoint):
    """estimator.micro_batch (step canvases per forward with grad): row chunks (a multiple of the N recorded steps)
    and passes of fewer steps than a canvas has (one row at a time, its encoder back-propagated once through the
    detached cache) sum to the one-pass gradient, with the same values; each pass holds only its own steps."""
    from dlmrl.training import uniform_trajectory
    from dlmrl.training.run_setup import build_task
    from dlmrl.training.uniform_trajectory import UniformTrajectoryScorer

    cfg = _config(checkpoint, "train.num_generations=3")
    grads, batch_rows = [], {}
    steps = None
    for micro in (None, "2 rows", 3, 1):
        policy = build_tiny_uniform_policy()
        task = build_task(cfg, policy)
        ro = rollout_uniform(policy, task, cfg, task.train_batch(2, 0, 0), torch.Generator().manual_seed(3), 17)
        steps = ro.kind_record["inputs"].shape[2]
        micro_batch = 2 * steps if micro == "2 rows" else micro
        scorer = UniformTrajectoryScorer(policy, None, micro_batch=micro_batch)
        scorer.prepare(ro, 1, torch.Generator())
        weights = torch.linspace(-1, 1, ro.completion.numel()).reshape(ro.completion.shape)
        seen = []
        real = uniform_trajectory._batched_steps
        def counted(inner, cache, inputs, *a, seen=seen, real=real):
            seen.append(tuple(inputs.shape[:2]))
            return real(inner, cache, inputs, *a)

        uniform_trajectory._batched_steps = counted
        try:
            scorer.backward(0, lambda logp, w=weights: ((logp * w).sum(), {}), lambda loss: loss.backward())
        finally:
            uniform_trajectory._batched_steps = real
        batch_rows[micro] = seen
        grads.append(torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None]))
    assert steps > 3 and len(ro) == 6
    assert max(r * k for r, k in batch_rows[3]) <= 3 and max(r * k for r, k in batch_rows[1]) == 1
    assert max(r for r, _ in batch_rows["2 rows"]) == 2 and max(r for r, _ in batch_rows[None]) == 6
    # (the same float32 terms, summed in another order and from batches of another size: each gradient entry sums at
    # most rows · C · N · L = 6 · 3 · N · 8 per-draw contributions, so its error is at most that many float32
    # roundings of the largest entry)
    terms = 6 * 3 * steps * 8
    for other in grads[1:]:
        assert other.shape == grads[0].shape
        assert (grads[0] - other).abs().max() <= terms * torch.finfo(torch.float32).eps * grads[0].abs().max()


def test_later_updates_read_the_rollout_policys_scores(checkpoint, tmp_path):
    """μ = 2 and three mini-batches: old scores are taken before any step (the gap is measured on them) and a later
    update's ratio moves away from 1."""
    out = tmp_path / "run"
    assert cli.main(["train", "--output-dir", str(out), "--no-progress",
                     *_args(checkpoint, *SMALL, "train.algorithm=grpo", "train.num_iterations=2",
                            "train.steps_per_generation=3", "train.max_steps=1")]) == 0
    (r,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert r["rollout_logp_gap_max"] is None or r["rollout_logp_gap_max"] < 1e-3
    assert r["ratio_max"] > 1 or r["ratio_min"] < 1 or r["grad_norm"] == 0


@pytest.mark.parametrize("task", ["gsm8k", "sudoku_text"])
def test_two_steps_on_a_text_task_with_held_out_evaluation(task, tmp_path):
    """A text task end to end (the printable-ASCII tokenizer's tiny DiffusionGemma; prompts as plain text): 2 steps,
    the held-out metric before and after, decoded through the uniform sampler."""
    from tests.data.text_helpers import text_tokenizer
    from tests.training.text_fixtures import write_gsm8k

    checkpoint = save_tiny_uniform_checkpoint(tmp_path / "dg_text", tokenizer=text_tokenizer())
    if task == "gsm8k":
        data = [f"task.train_file={write_gsm8k(tmp_path / 'train.jsonl')}",
                f"task.test_file={write_gsm8k(tmp_path / 'test.jsonl', 3)}"]
        metric = "accuracy"
    else:
        task, data, metric = "sudoku", ["task.answer_mode=text", "eval.num_puzzles=3"], "cell_accuracy"
    out = tmp_path / "run"
    assert cli.main(["train", "--output-dir", str(out), "--no-progress", f"model.name_or_path={checkpoint}",
                     "model.kind=uniform", f"task.name={task}", "train.algorithm=grpo", "train.max_steps=2",
                     "train.prompts_per_step=2", "train.num_generations=2", "sampling.gen_length=12",
                     "eval.steps=2", "eval.batch_size=4", "eval.num_puzzles=0" if task == "gsm8k" else "eval.steps=2",
                     "task.prompt_template=plain", "task.chat_template=off", *data]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("eval_before", "eval_after"):
        assert summary[key]["primary_metric"] == metric and summary[key]["num_puzzles"] == 3
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


# ----- the uniform ELBO estimators as a second likelihood (estimator.name, this kind only) -----------------------

@pytest.mark.parametrize("name", ["uniform_sdmc", "uniform_double_mc", "uniform_flat_ce"])
def test_two_steps_with_an_elbo_estimator(checkpoint, tmp_path, name):
    from safetensors.torch import load_file

    out = tmp_path / "run"
    assert cli.main(["train", "--output-dir", str(out), "--no-progress",
                     *_args(checkpoint, *SMALL, "train.algorithm=grpo", f"estimator.name={name}",
                            "estimator.num_nodes=2", "train.num_iterations=2")]) == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["nfe_scoring"] for r in lines] == [2, 2]  # (N·K = 2 and num_nodes · samples_per_node = 2)
    assert all("rollout_logp_gap_max" not in r for r in lines)  # (a bound, not the sampler's log-probs)
    assert any(r["ratio_max"] != 1 or r["ratio_min"] != 1 for r in lines)  # (μ = 2: the second update moved)
    before, after = load_file(checkpoint / "model.safetensors"), load_file(out / "final_model" / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)


def _denoiser_inputs(seed: int = 4):
    from dlmrl.training.run_setup import build_task

    cfg = Config()
    apply_overrides(cfg, ["task.answer_mode=full", "train.num_generations=2"])
    policy = build_tiny_uniform_policy()
    task = build_task(cfg, policy)
    ro = rollout_uniform(policy, task, cfg, task.train_batch(2, 0, 0), torch.Generator().manual_seed(seed), 17)
    return policy, ro


def test_the_denoiser_reads_each_canvas_against_the_clean_earlier_canvases():
    """Canvas c's logits: the same as one row's own cache of the prompt and clean canvases < c (the batch's cache
    repeated K times and cut back); they change with z_t at canvas c only, and with the clean completion before c
    only."""
    from dlmrl.models.diffusion_gemma import (
        canvas_attention_masks,
        canvas_logits,
        encode,
        new_cache,
        position_ids,
    )
    from dlmrl.training.uniform_elbo_scorer import canvas_denoiser

    policy, ro = _denoiser_inputs()
    model, L = policy.model, policy.canvas_length
    mask = torch.ones_like(ro.completion_mask)  # (every canvas scored)
    g = torch.Generator().manual_seed(0)
    z = torch.randint(0, policy.vocab_size, (2, *ro.completion.shape), generator=g)
    t = torch.tensor([0.3, 0.7], dtype=torch.float64)
    with torch.no_grad():
        logits = canvas_denoiser(model, ro.prompt_ids, ro.prompt_mask, ro.completion, mask, L)(z, t)
        b, k, c = 1, 1, 2  # (one row, one draw, the third canvas, by hand)
        P = ro.prompt_ids.shape[1]
        cache, attn = new_cache(model), ro.prompt_mask[b:b + 1].bool()
        cache = encode(model, ro.prompt_ids[b:b + 1], attn, cache, position_ids(0, P, "cpu")).cache
        for j in range(c):
            attn = torch.nn.functional.pad(attn, (0, L), value=True)
            cache = encode(model, ro.completion[b:b + 1, j * L:(j + 1) * L], attn, cache,
                           position_ids(P + j * L, L, "cpu")).cache
        canvas = z[k, b:b + 1, c * L:(c + 1) * L]
        masks = canvas_attention_masks(model, canvas, cache, torch.nn.functional.pad(attn, (0, L), value=True))
        direct = canvas_logits(model, canvas, cache, masks, position_ids(P + c * L, L, "cpu"))
        # (the same float32 computation in a batch of another size: a few ulps of the softcapped logits, |ℓ| <= 30)
        assert (logits[k, b, c * L:] - direct[0]).abs().max() <= 64 * torch.finfo(torch.float32).eps * 30
        z2 = z.clone()
        z2[:, :, :L] = (z2[:, :, :L] + 1) % policy.vocab_size  # (canvas 0 of z_t changed)
        comp2 = ro.completion.clone()
        comp2[:, 2 * L:] = (comp2[:, 2 * L:] + 1) % policy.vocab_size  # (the clean last canvas changed)
        other = canvas_denoiser(model, ro.prompt_ids, ro.prompt_mask, comp2, mask, L)(z2, t)
    assert not torch.equal(other[:, :, :L], logits[:, :, :L])
    assert torch.equal(other[:, :, L:], logits[:, :, L:])


def test_the_elbo_scorer_gives_a_bound_per_token_and_shares_its_plan():
    """Every UDLM term is <= 0 (a negative KL rate), so each position's estimate is; old and current scores of one
    update read the same plan, so at the same weights they are equal."""
    from dlmrl.estimators.uniform_elbo import UniformSDMC
    from dlmrl.training.uniform_elbo_scorer import UniformELBOScorer

    policy, ro = _denoiser_inputs(5)
    scorer = UniformELBOScorer(policy, None, UniformSDMC(num_nodes=2))
    old = scorer.prepare(ro, 2, torch.Generator().manual_seed(1))
    got = {}
    scorer.backward(1, lambda per_token: (got.setdefault("x", per_token).sum(), {}), lambda loss: loss.backward())
    assert (old.old[1] <= 0).all() and (old.old[1][~ro.completion_mask] == 0).all()
    assert torch.allclose(got["x"].detach(), old.old[1], atol=1e-6 * float(old.old[1].abs().max()) + 1e-12)


@pytest.mark.parametrize("overrides, key", [
    (["estimator.name=sdmc"], "estimator.name"),
    (["estimator.name=uniform_sdmc", "estimator.options.bogus=1"], "estimator.options.bogus"),
    (["estimator.name=uniform_double_mc", "estimator.options.time_exponent=0"], "estimator.options.time_exponent"),
    (["estimator.name=trajectory", "estimator.num_nodes=5"], "estimator.num_nodes"),
])
def test_the_kinds_estimator_keys_are_checked_naming_the_key(checkpoint, overrides, key):
    cfg = _config(checkpoint, "train.algorithm=grpo", *overrides)
    with pytest.raises(ConfigError, match=f"config key '{key}"):
        validate(cfg, data=False)


def test_the_uniform_estimators_are_this_kinds_only():
    cfg = Config()
    apply_overrides(cfg, ["estimator.name=uniform_sdmc"])
    with pytest.raises(ConfigError, match="config key 'estimator.name'"):
        validate(cfg, data=False)


def test_the_python_api_trains_a_diffusion_gemma_module_with_its_tokenizer(tmp_path):
    """``Trainer(<DiffusionGemmaForBlockDiffusion>, tokenizer=...)`` wraps it as a uniform policy (the kind from the
    model's config) and trains a step on your own data and reward."""
    from dlmrl import Trainer

    policy = build_tiny_uniform_policy()
    data = {"prompt": ["12|34="] * 4, "answer": ["1234"] * 4}

    def ones(prompts, completions, **columns):
        return [float(c.count("1")) for c in completions]

    trainer = Trainer(policy.model, tokenizer=policy.tokenizer, reward_funcs=[ones], train_dataset=data,
                      config={"train.max_steps": 1, "train.prompts_per_step": 2, "train.num_generations": 2,
                              "eval.before": False, "eval.after": False, "output_dir": str(tmp_path / "run"),
                              "sampling.gen_length": 8})
    assert (trainer.config.model.kind, trainer.config.train.algorithm) == ("uniform", "grpo")
    trainer.train(progress=False)
    (line,) = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(line)["nfe_scoring"] > 0
