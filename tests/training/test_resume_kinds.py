"""Resume equality beyond the diffusion default: an AR run (grpo) and HAPO (whose adaptive temperature
reads the previous step's entropy statistics from the checkpoint): 2 steps straight = 1 step + --resume."""

from __future__ import annotations

import json

import pytest
import torch

from dlmrl.training.trainer import train
from tests.helpers import crash_then_resume
from tests.training.test_trainer import params, small_config

AR = {"model.kind": "ar", "model.name_or_path": "tiny-sudoku-ar", "task.answer_mode": "full",
      "eval.before": False, "eval.after": False}


@pytest.mark.parametrize(("algorithm", "mu"), [("grpo", 1), ("hapo", 2)])
def test_ar_run_resumes_exactly(algorithm, mu, tmp_path, monkeypatch):
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    kw = {**AR, "num_iterations": mu}
    train(small_config("tiny-sudoku-ar", full, algorithm=algorithm, **kw), progress=False)
    crash_then_resume(monkeypatch, lambda resume: train(
        small_config("tiny-sudoku-ar", crashed, algorithm=algorithm, **kw), resume=resume, progress=False), 1)
    a, b = params(full), params(crashed)
    assert a.keys() == b.keys()
    for k in a:  # bit for bit: the resumed steps rerun the same code on the same reloaded state
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)

    def logged(path):
        keys = ("reward_mean", "loss", "completions_total", "nfe_sampling_total")
        return [{k: r[k] for k in keys} for r in map(json.loads, (path / "metrics.jsonl").read_text().splitlines())]

    assert logged(crashed) == logged(full)
