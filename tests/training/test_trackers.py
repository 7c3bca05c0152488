"""``train.report_to``: TensorBoard event files through accelerate's tracker (metrics.jsonl as well); a tracker whose
package is missing fails validation with the package to install."""

from __future__ import annotations

import pytest

from dlmrl import cli
from dlmrl.config import Config, ConfigError, apply_overrides, validate, validation

SMALL = ["max_steps=2", "prompts_per_step=2", "num_generations=2", "eval.before=false", "eval.after=false",
         "save_steps=2", "--no-progress"]


def test_tensorboard_writes_event_files_next_to_metrics_jsonl(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert cli.main(["train", "--output-dir", str(out), "report_to=tensorboard", *SMALL]) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    logdir = out / "dlmrl"
    events = EventAccumulator(str(logdir)).Reload()
    scalars = events.Tags()["scalars"]
    assert {"reward_mean", "nfe_sampling", "lr"} <= set(scalars)
    assert [e.step for e in events.Scalars("reward_mean")] == [1, 2]
    assert any(p.name == "hparams.yml" for p in logdir.rglob("*"))  # the config, flattened


def test_off_by_default_and_unknown_or_missing_trackers_fail_up_front(tmp_path, monkeypatch):
    assert Config().train.report_to == "none"
    cfg = Config()
    apply_overrides(cfg, ["report_to=mlflow"])
    with pytest.raises(ConfigError, match="train.report_to.*unknown tracker 'mlflow'"):
        validate(cfg)
    monkeypatch.setattr(validation, "tracker_available", lambda name: False)
    cfg = Config()
    apply_overrides(cfg, ["report_to=wandb"])
    with pytest.raises(ConfigError, match="'wandb' needs the wandb package.*pip install wandb"):
        validate(cfg)
    assert cli.main(["train", "--output-dir", str(tmp_path / "x"), "report_to=wandb", *SMALL]) == 2
    assert not (tmp_path / "x").exists()  # nothing started
