"""Threshold rollouts through the trainer (per-row NFE, the mean logged) and the rollout log-prob mismatch: its
measurement (``rollout_logp_gap_*``) and truncated importance-sampling correction (``train.rollout_is_cap``)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dlmrl.config import Config, ConfigError, apply_overrides, validate
from dlmrl.data.tasks import SudokuTask
from dlmrl.kinds import kind_of
from dlmrl.models.loading import load_policy
from dlmrl.objectives.objective import GroupObjective
from dlmrl.training import rollout, run_setup, trainer, update
from dlmrl.training.anchors import add_anchors
from dlmrl.training.distributed import Processes, gather_rollout
from dlmrl.training.rollout import mean_nfe, rollout_diffusion
from dlmrl.training.scorers import RolloutMismatch
from tests.tolerances import EPS32, SHIPPED_TERMS, adamw_run_tol, forward_tol, rounding_tol
from tests.training.test_trainer import params, small_config

#: float64 runs: the scorer's batches have other shapes than the sampler's, so their log-probs agree to rounding
TRAJECTORY = {"estimator.name": "trajectory", "estimator.merge": 1, "eval.before": False, "eval.after": False,
              "model.dtype": "float64"}
#: The gap of a float64 run: the sampler stores its log-probs in float32 and the mismatch compares in float32, so
#: float64 scores ≤ forward_tol apart become float32 values ≤ one ulp apart; |log p| ≤ 16 (the shipped model's logits
#: stay within ±6: ≤ 2·6 + log 19). ≈ 1.9e-6 (measured: 0).
GAP_TOL = rounding_tol(scale=16, n=1) + forward_tol(scale=16, terms=SHIPPED_TERMS)


def config(**overrides) -> Config:
    cfg = Config()
    apply_overrides(cfg, [f"{k}={v}" for k, v in overrides.items()])
    return cfg


# --- the mismatch's formulas ---------------------------------------------------------------------


def test_gap_and_truncated_weights_by_hand():
    rollout = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, 0.0, -1.0]])
    old = torch.tensor([[-1.5, -1.0, -0.5], [-0.5, 5.0, -1.2]])
    valid = torch.tensor([[True, True, True], [True, False, True]])
    mm = RolloutMismatch(rollout, valid, cap=2.0)
    mm.observe(old)
    # Δ = old - rollout on valid tokens: -0.5, 1.0, 0.0, 2.5, -0.2
    total, count, top = mm.gap()
    assert count == 5 and total == pytest.approx(0.5 + 1.0 + 0.0 + 2.5 + 0.2) and top == pytest.approx(2.5)
    want = [[math.exp(-0.5), 2.0, 1.0], [2.0, 1.0, math.exp(-0.2)]]  # min(e^Δ, 2); 1 off valid
    # float32: a weight ≤ 2 is off by ≤ 2 ulps (Δ's subtraction, exp); their sum of 5 (≤ 7.5) by ≤ 5 ulps of it
    torch.testing.assert_close(mm.weights(), torch.tensor(want), atol=rounding_tol(scale=2, n=2), rtol=0)
    assert mm.weight_sum() == pytest.approx(math.exp(-0.5) + 2.0 + 1.0 + 2.0 + math.exp(-0.2),
                                            abs=rounding_tol(scale=7.5, n=5))
    mm.observe(old + 10)  # the first observation is kept (the policy that sampled)
    assert mm.gap()[2] == pytest.approx(2.5)
    assert RolloutMismatch(rollout, valid).weights() is None  # (measure only)


def test_mismatch_argument_errors():
    r, v = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="differ"):
        RolloutMismatch(r, v[:, :2])
    with pytest.raises(ValueError, match="cap must be >= 1"):
        RolloutMismatch(r, v, cap=0.5)
    with pytest.raises(RuntimeError, match="observe"):
        RolloutMismatch(r, v, cap=2.0).weights()
    with pytest.raises(ValueError, match="logp_old"):
        RolloutMismatch(r, v).observe(torch.zeros(3, 2))


def test_the_weights_multiply_each_tokens_policy_loss():
    g = torch.Generator().manual_seed(0)
    new = torch.randn(4, 5, generator=g, dtype=torch.float64).requires_grad_(True)
    old = new.detach() + 0.1 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    rollout = old + 0.3 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    mask = torch.rand(4, 5, generator=g) < 0.8
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    objective = GroupObjective(ratio_level="token", epsilon=0.2, loss_type="dapo")
    mm = RolloutMismatch(rollout, mask, cap=1.5)
    loss, _ = update.group_loss_fn(objective, old, adv, mask, 1.0, mismatch=mm, num_tokens=mask.sum())(new)
    # by hand: -Σ w · min(r A, clip(r) A) / Σ mask, w = min(exp(old - rollout), 1.5)
    w = torch.exp(old - rollout.float().double()).clamp(max=1.5)
    r = torch.exp(new.detach() - old)
    surrogate = torch.minimum(r * adv[:, None], r.clamp(0.8, 1.2) * adv[:, None])
    want = -(w * surrogate)[mask].sum() / mask.sum()
    # the mismatch computes w in float32: old rounded to float32 (|old| ≤ 4: ≤ 2 ulps of 1 in Δ), the subtraction
    # and exp: ≤ 4 ulps of w relative, so the mean of the float64 terms moves by ≤ 4·eps·mean|w·surrogate|
    assert old.abs().max() <= 4
    tol = rounding_tol(scale=float((w * surrogate)[mask].abs().mean()), n=4)
    assert loss.item() == pytest.approx(want.item(), rel=0, abs=tol)
    plain, _ = update.group_loss_fn(objective, old, adv, mask, 1.0, num_tokens=mask.sum())(new)
    assert abs(plain.item() - loss.item()) > 1e3 * tol  # (the weights matter: not a vacuous comparison)


# --- config -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("overrides", "key"), [
    ({"sampling.threshold": 0}, "sampling.threshold"), ({"sampling.threshold": 1.2}, "sampling.threshold"),
    ({"sampling.threshold_factor": -1}, "sampling.threshold_factor"),
    ({"sampling.threshold": 0.9, "sampling.threshold_factor": 1}, "sampling.threshold_factor"),
    ({"sampling.threshold": 0.9, "sampling.remasking": "random"}, "sampling.threshold"),
    ({"train.rollout_is_cap": 0.5, "estimator.merge": 1}, "train.rollout_is_cap"),
    ({"train.rollout_is_cap": 2}, "train.rollout_is_cap"),  # (the gdpo preset's estimator, sdmc)
    ({"train.rollout_is_cap": 2, "estimator.name": "trajectory", "estimator.merge": 2}, "train.rollout_is_cap"),
    ({"train.rollout_is_cap": 2, "estimator.name": "trajectory", "estimator.order": "left_to_right"},
     "train.rollout_is_cap"),
])
def test_bad_threshold_and_cap_values_name_their_key(overrides, key):
    cfg = config(**overrides)
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        validate(cfg)


def test_threshold_config_is_valid_and_off_by_default():
    assert Config().sampling.threshold is None and Config().sampling.threshold_factor is None
    assert Config().train.rollout_is_cap is None
    validate(config(**{"sampling.threshold": 1.0, "estimator.name": "trajectory", "train.rollout_is_cap": 2}))
    validate(config(**{"sampling.threshold_factor": 2.5}))
    # the trajectory estimator's step bound: a threshold rollout takes at most one step per token
    merged = {"estimator.name": "trajectory", "estimator.merge": 2}
    assert run_setup.build_estimator(config(**merged, **{"sampling.threshold": 0.9})).nfe == math.ceil(16 / 2)
    assert run_setup.build_estimator(config(**merged)).nfe == math.ceil(4 / 2)


# --- rollouts -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shipped():
    return load_policy()


def test_threshold_rollouts_report_the_mean_nfe_and_the_summed_passes(shipped):
    cfg = config(**{"sampling.threshold": 0.6, "num_generations": 4})
    task = SudokuTask(shipped.tokenizer, shipped.mask_token_id)
    ro = rollout_diffusion(shipped, task, cfg, task.train_batch(3, 0, 0), torch.Generator().manual_seed(0))
    assert ro.row_nfe.shape == (12,) and ro.token_logprobs.shape == ro.completion.shape
    assert ro.nfe == pytest.approx(float(ro.row_nfe.double().mean()), abs=5e-4 + 1e-12)  # (mean_nfe: 3 places)
    assert ro.sampling_passes() == int(ro.row_nfe.sum())
    assert len(set(ro.row_nfe.tolist())) > 1  # (rows reveal different counts)
    assert mean_nfe(torch.tensor([4, 4])) == 4 and isinstance(mean_nfe(torch.tensor([4, 4])), int)
    assert mean_nfe(torch.tensor([1, 2, 2])) == 1.667
    plain = rollout_diffusion(shipped, task, config(num_generations=4), task.train_batch(3, 0, 0),
                              torch.Generator().manual_seed(0))
    assert plain.nfe == 4 and plain.row_nfe.tolist() == [4] * 12 and plain.sampling_passes() == 48
    # anchors were not sampled: no log-probs, no passes
    ro.rewards = ro.train_rewards = torch.zeros(12)
    out, k = add_anchors(ro, task, 0.0, kind_of("diffusion"), shipped.eos_token_id, 0, lambda r, _: r,
                         lambda m: torch.where(m, 0, -1))
    assert k == 3 and (out.token_logprobs[-3:] == 0).all() and (out.row_nfe[-3:] == 0).all()
    assert torch.equal(out.token_logprobs[:12], ro.token_logprobs)


class TwoShares(Processes):
    """Two processes whose gathered shares are given (no torch.distributed)."""

    def __init__(self, parts):
        super().__init__(0, 2)
        self.parts = parts

    def gather(self, obj):
        return self.parts


def test_gathered_shares_average_their_rows_nfe(shipped):
    cfg = config(**{"sampling.threshold": 0.6, "num_generations": 2})
    task = SudokuTask(shipped.tokenizer, shipped.mask_token_id)
    examples = task.train_batch(4, 0, 0)
    whole = rollout_diffusion(shipped, task, cfg, examples, torch.Generator().manual_seed(1))
    shares = [rollout_diffusion(shipped, task, cfg, examples, torch.Generator().manual_seed(1), prompts=p)
              for p in ((0, 1), (1, 4))]
    out = gather_rollout(shares[0], TwoShares(shares), 0)
    assert torch.equal(out.completion, whole.completion) and torch.equal(out.row_nfe, whole.row_nfe)
    assert out.nfe == whole.nfe and out.sampling_passes() == whole.sampling_passes()


# --- through the trainer -------------------------------------------------------------------------------


def metrics(path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_threshold_rollouts_have_zero_logprob_gap_and_a_cap_of_ones_changes_nothing(tmp_path):
    kw = {**TRAJECTORY, "sampling.threshold": 0.6, "num_iterations": 2}
    trainer.train(small_config("tiny-sudoku", tmp_path / "plain", **kw), progress=False)
    trainer.train(small_config("tiny-sudoku", tmp_path / "capped", **kw, **{"train.rollout_is_cap": 2}),
                  progress=False)
    plain, capped = metrics(tmp_path / "plain"), metrics(tmp_path / "capped")
    scored = [r for r in plain + capped if r["rows_scored"]]  # (a step whose advantages are all 0 scores nothing)
    assert scored and all(r["rollout_logp_gap_max"] <= GAP_TOL for r in scored)
    for row in plain + capped:  # (nfe_sampling is the rows' mean rounded to 3 places: 6 rows × ≤ 5e-4)
        assert row["nfe_sampling"] <= 16
        assert row["sampling_passes"] == pytest.approx(6 * row["nfe_sampling"], abs=6 * 5e-4 + 1e-9)
    # a weight min(e^gap, 2) is within (e^GAP_TOL − 1) ≈ GAP_TOL of 1 (their mean: a float32 rounding more)
    assert all(abs(r["rollout_is_weight_mean"] - 1) <= GAP_TOL + EPS32 for r in capped if r["rows_scored"])
    assert "rollout_is_weight_mean" not in plain[0]
    a, b = params(tmp_path / "plain"), params(tmp_path / "capped")
    # weights within GAP_TOL of 1: AdamW normalises the gradient, so each of the 2 × 2 updates at lr 1e-3 moves by
    # ≤ lr·GAP_TOL more (≈ 7.6e-9 in all; measured 0: the gap was 0), plus the float64 runs' own rounding: a weight's
    # gradient sums ≤ 6 rows × 16 canvases × 34 positions, each through 4 × (64 + 34 + 192) accumulations: ≤ 5000
    tol = 4 * 1e-3 * GAP_TOL + adamw_run_tol(1e-3, 4, terms=5000)  # ≈ 4.5e-7
    for k in a:  # weights exp(0) = 1: the same training up to float error
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=tol)


def test_the_gap_is_logged_only_for_the_exact_trajectory_likelihood(tmp_path):
    trainer.train(small_config("tiny-sudoku", tmp_path / "merged", **{**TRAJECTORY, "estimator.merge": 2}),
                  progress=False)
    assert all("rollout_logp_gap_mean" not in r for r in metrics(tmp_path / "merged"))
    trainer.train(small_config("tiny-sudoku", tmp_path / "exact", **TRAJECTORY), progress=False)
    rows = metrics(tmp_path / "exact")
    assert all("rollout_logp_gap_max" in r for r in rows)
    assert all(r["rollout_logp_gap_max"] <= GAP_TOL for r in rows if r["rows_scored"])


def test_a_capped_weight_reweights_the_tokens_the_rollout_drew_off_policy(tmp_path, monkeypatch):
    # rollout log-probs lowered by 1 nat on every token: Δ = +1, weight min(e, 1.5) = 1.5 everywhere; the gap is 1
    original = rollout.rollout_diffusion

    def off_policy(*args, **kwargs):
        ro = original(*args, **kwargs)
        ro.token_logprobs = torch.where(ro.completion_mask, ro.token_logprobs - 1.0, ro.token_logprobs)
        return ro

    monkeypatch.setattr(rollout, "rollout_diffusion", off_policy)  # (the masked kind samples with it)
    trainer.train(small_config("tiny-sudoku", tmp_path, **TRAJECTORY, **{"train.rollout_is_cap": 1.5}),
                  progress=False)
    rows = [r for r in metrics(tmp_path) if r["rows_scored"]]
    assert rows
    for row in rows:  # (Δ = 1 + the float64 run's gap, in float32: GAP_TOL and one ulp of the shift)
        assert row["rollout_logp_gap_mean"] == pytest.approx(1.0, abs=GAP_TOL + EPS32)
        assert row["rollout_logp_gap_max"] == pytest.approx(1.0, abs=GAP_TOL + EPS32)
        assert row["rollout_is_weight_mean"] == pytest.approx(1.5, abs=rounding_tol(scale=1.5, n=1))  # (the mean)
