"""The collapse monitor (dlmrl.training.collapse): sample_nll and kl against their running baselines, a warning
naming the step, and the opt-in stop that leaves a resumable checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from dlmrl.config import ConfigError, default_job_config, validate
from dlmrl.objectives import GroupObjective
from dlmrl.training import trainer
from dlmrl.training.collapse import CollapseMonitor
from dlmrl.training.update import group_loss_fn


def test_it_fires_above_ratio_times_the_median_of_the_window_and_warns_once_per_episode():
    m = CollapseMonitor(window=3, ratio=2.0)
    values = [1.0, 1.2, 0.9, 2.3, 2.5, 1.0, 3.0, 0.1]
    out = [m.observe(step, {"sample_nll": v, "kl": None}) for step, v in enumerate(values, start=1)]
    fired = [f["collapse"] for f, _ in out]
    # baselines: none for 3 steps, then median(1.0, 1.2, 0.9) = 1.0 (2.3 > 2: fires), median(1.2, 0.9, 2.3) = 1.2
    # (2.5 > 2.4: fires, same episode: no new warning), median(0.9, 2.3, 2.5) = 2.3 (1.0 no), median(2.3, 2.5, 1.0) = 2.3
    # (3.0 no), median(2.5, 1.0, 3.0) = 2.5 (0.1 no)
    assert fired == [False, False, False, True, True, False, False, False]
    assert [f.get("sample_nll_baseline") for f, _ in out][3:5] == [1.0, 1.2]
    warnings = [(step, w) for step, (_, w) in enumerate(out, start=1) if w]
    assert len(warnings) == 1 and warnings[0][0] == 4 and "step 4" in warnings[0][1] and "sample_nll" in warnings[0][1]


def test_a_kl_still_growing_from_zero_is_no_baseline_and_the_state_round_trips():
    m = CollapseMonitor(window=2, ratio=2.0)
    for step, kl in enumerate([0.0, 0.004, 0.08], start=1):
        fields, warning = m.observe(step, {"sample_nll": 1.0, "kl": kl})
    assert not fields["collapse"] and warning is None  # (baseline 0.002, below the kl floor 0.05: 40x is no signal)
    fields, warning = m.observe(4, {"sample_nll": 1.0, "kl": 0.5})  # (baseline median(0.004, 0.08) = 0.042)
    assert not fields["collapse"]
    fields, warning = m.observe(5, {"sample_nll": 1.0, "kl": 2.0})  # (baseline median(0.08, 0.5) = 0.29)
    assert fields["collapse"] and "kl" in warning
    again = CollapseMonitor(window=2, ratio=2.0)
    again.load_state_dict(json.loads(json.dumps(m.state_dict())))
    assert again.state_dict() == m.state_dict()
    assert CollapseMonitor(window=0).observe(1, {"sample_nll": 9.0}) == ({}, None)


def test_sample_nll_is_the_rollout_policys_mean_negative_log_likelihood_per_token():
    logp = torch.tensor([[-0.5, -1.5, -9.0], [-2.0, -3.0, -4.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    fn = group_loss_fn(GroupObjective(), None, torch.tensor([1.0, -1.0]), mask)
    _, metrics = fn(logp.clone().requires_grad_(True))
    assert metrics["sample_nll"] == pytest.approx((0.5 + 1.5 + 2.0 + 3.0 + 4.0) / 5)
    old = logp - 1.0  # (later updates: the old policy's scores, not the current ones)
    _, metrics = group_loss_fn(GroupObjective(), old, torch.tensor([1.0, -1.0]), mask)(logp.requires_grad_(True))
    assert metrics["sample_nll"] == pytest.approx((0.5 + 1.5 + 2.0 + 3.0 + 4.0) / 5 + 1.0)


@pytest.mark.parametrize("override, key", [("train.collapse_window=-1", "train.collapse_window"),
                                           ("train.collapse_ratio=1", "train.collapse_ratio"),
                                           ("train.stop_on_collapse=1", "train.stop_on_collapse")])
def test_bad_settings_name_the_key(override, key):
    with pytest.raises(ConfigError, match=f"train.{key.split('.')[1]}"):
        validate(default_job_config([override]), data=False)


def test_the_opt_in_stop_leaves_a_checkpoint_that_resume_continues(tmp_path, monkeypatch):
    """The AR recipe (β 0) with sample_nll forced up from step 4: the monitor (window 3) fires at step 4, the run stops
    there with its checkpoint and stop_reason collapse; --resume continues to max_steps without stopping again in
    the same episode."""
    real = trainer.step_record

    def forced(run, *args, **kwargs):
        record = real(run, *args, **kwargs)
        return {**record, "sample_nll": 1.0 if record["step"] < 4 else 10.0}

    monkeypatch.setattr(trainer, "step_record", forced)
    out = tmp_path / "run"
    args = ["model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "task.answer_mode=full", "train.algorithm=grpo",
            "train.beta=0", "train.max_steps=6",  # (no KL: only the forced series moves the monitor)
            "train.prompts_per_step=2", "train.num_generations=2", "train.collapse_window=3",
            "train.stop_on_collapse=true", "train.save_steps=100", "eval.before=false", "eval.after=false",
            f"output_dir={out}"]
    summary = trainer.train(default_job_config(args), progress=False)
    assert summary["stop_reason"] == "collapse" and summary["steps"] == 4
    assert (out / "checkpoints" / "step-4").is_dir()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["collapse"] for r in rows] == [False, False, False, True]
    summary = trainer.train(default_job_config(args), resume=True, progress=False)
    assert summary["stop_reason"] == "max_steps" and summary["steps"] == 6
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    # (step 5: baseline median(1, 1, 10) = 1, still firing, no new warning, no stop; step 6: median(1, 10, 10) = 10,
    # the sustained rise is the baseline now)
    assert [r["collapse"] for r in rows] == [False, False, False, True, True, False]


def test_a_diffusion_run_takes_sample_nll_from_the_samplers_record(tmp_path, monkeypatch):
    """The masked-diffusion sampler records each token's log-prob under the distribution it was drawn from; the
    logged sample_nll is its mean negative over the completion tokens (not the estimator's per-token terms)."""
    real, seen = trainer.step_record, []

    def capture(run, ro, *args, **kwargs):
        record = real(run, ro, *args, **kwargs)
        tokens = ro.completion_mask.float()
        seen.append((record["sample_nll"], float(-(ro.token_logprobs * tokens).sum() / tokens.sum())))
        return record

    monkeypatch.setattr(trainer, "step_record", capture)
    trainer.train(default_job_config(["train.algorithm=diffu_grpo", "train.max_steps=1", "train.prompts_per_step=2",
                                      "train.num_generations=4", "eval.before=false", "eval.after=false",
                                      f"output_dir={tmp_path / 'run'}"]), progress=False)
    ((logged, expected),) = seen
    assert logged == expected and logged > 0


def test_direction_both_also_fires_when_sample_nll_falls_below_baseline_over_ratio_and_kl_only_rises():
    rise, both = CollapseMonitor(window=3, ratio=2.0), CollapseMonitor(window=3, ratio=2.0, direction="both")
    series = [(1.0, 0.2), (1.2, 0.3), (0.9, 0.2), (0.45, 0.2), (0.55, 0.01)]
    # step 4: baseline median(1.0, 1.2, 0.9) = 1.0, 0.45 < 1.0 / 2 fires under "both" only; the kl 0.2 vs its
    # baseline 0.2 is no fall. Step 5: baseline median(1.2, 0.9, 0.45) = 0.9, 0.55 > 0.45: no fire; the kl 0.01
    # falls 20x under its baseline 0.2 and never fires (a falling KL is no failure).
    out_rise = [rise.observe(s, {"sample_nll": v, "kl": k}) for s, (v, k) in enumerate(series, start=1)]
    out_both = [both.observe(s, {"sample_nll": v, "kl": k}) for s, (v, k) in enumerate(series, start=1)]
    assert [f["collapse"] for f, _ in out_rise] == [False] * 5
    assert [f["collapse"] for f, _ in out_both] == [False, False, False, True, False]
    assert "step 4" in out_both[3][1] and "a fall" in out_both[3][1]
    with pytest.raises(ValueError, match="direction"):
        CollapseMonitor(direction="down")
    with pytest.raises(ConfigError, match="train.collapse_direction"):
        validate(default_job_config(["train.collapse_direction=down"]), data=False)
    validate(default_job_config(["train.collapse_direction=fall"]), data=False)


def test_direction_fall_watches_the_sample_nll_fall_alone():
    fall, both = (CollapseMonitor(window=3, ratio=2.0, direction=d) for d in ("fall", "both"))
    # step 4: sample_nll 2.5 is 2.5x its baseline median(1.0, 1.2, 0.9) = 1.0: a rise, fires under "both" only;
    # step 5: sample_nll 0.45 < median(1.2, 0.9, 2.5) / 2 = 0.6 fires under both; step 6: kl 0.8 > 2 x
    # median(0.2, 0.3, 0.2) (0.2, above the 0.05 floor) fires under "both" only
    series = [(1.0, 0.2), (1.2, 0.3), (0.9, 0.2), (2.5, 0.2), (0.45, 0.2), (1.0, 0.8)]
    out = [fall.observe(s, {"sample_nll": v, "kl": k}) for s, (v, k) in enumerate(series, start=1)]
    out_both = [both.observe(s, {"sample_nll": v, "kl": k}) for s, (v, k) in enumerate(series, start=1)]
    assert [f["collapse"] for f, _ in out] == [False, False, False, False, True, False]
    assert [f["collapse"] for f, _ in out_both] == [False, False, False, True, True, True]
    assert "a fall" in out[4][1] and out_both[5][1].startswith("step 6: possible collapse: kl 0.8")


def test_the_dry_run_describes_the_monitor_and_the_following_reference(capsys):
    from dlmrl import cli

    base = ["train", "--config", "configs/grpo_sudoku_tiny_ar.yaml", "--dry-run"]
    assert cli.main(base) == 0
    text = " ".join(capsys.readouterr().out.split())  # (YAML folds long lines)
    assert "collapse_monitor: warns when sample_nll or kl above 3 x the median of its previous 20 steps" in text
    assert "reference_model: a frozen second copy of the model" in text
    assert cli.main([*base, "train.sync_ref_model=true", "train.ref_model_sync_steps=64",
                     "train.ref_model_mixup_alpha=0.5", "train.collapse_direction=fall", "train.collapse_ratio=1.25",
                     "train.stop_on_collapse=true", "train.collapse_window=5"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "follows the policy: every 64 optimizer steps ref <- 0.5 x policy + 0.5 x ref" in text
    assert ("warns and stops after that step's checkpoint (train.stop_on_collapse) when sample_nll below 1/1.25 x "
            "the median of its previous 5 steps") in text
    assert "never within" not in text  # (64 <= the run's 260 optimizer steps)
    assert cli.main([*base, "model.use_peft=true", "train.sync_ref_model=true", "train.collapse_window=0"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "the base with a second adapter that follows the policy" in text and "lora_A and lora_B" in text
    assert "never within the 260 optimizer steps of this run" in text  # (TRL's default 512 > 260)
    assert "off (train.collapse_window 0): sample_nll (and kl) are still logged, nothing fires" in text
