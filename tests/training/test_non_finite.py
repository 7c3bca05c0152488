"""A training step whose rewards (every one), loss, gradient norm or weights go non-finite stops the run before its
checkpoint, naming what went non-finite (on main a NaN model trained on with reward 0 and exit 0)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dlmrl.config import Config, apply_overrides
from dlmrl.training.checkpoint import checkpoints
from dlmrl.training.finite import NonFiniteError, reward_problem, step_problem, update_problem, weight_problem
from dlmrl.training.trainer import train
from tests.helpers import save_tiny_checkpoint


def test_each_kind_of_non_finite_value_is_named():
    finite = torch.tensor([0.5, 0.0])
    assert reward_problem(finite, torch.tensor([[0.5], [math.nan]])) is None  # (one row without a reward: fine)
    assert "every reward is missing" in reward_problem(finite, torch.full((2, 1), math.nan))
    assert "every reward is non-finite" in reward_problem(torch.tensor([math.inf, math.nan]), None)
    assert update_problem([{"loss": 0.1, "grad_norm": 1.0}, {"loss": math.nan}]) == (
        "the loss of optimizer update 2 of 2 is nan")
    assert update_problem([{"loss": 0.1, "grad_norm": math.inf}]) == "the gradient norm of optimizer update 1 of 1 is inf"
    model = torch.nn.Linear(2, 2)
    assert weight_problem(model) is None
    with torch.no_grad():
        model.bias[1] = math.nan
    assert weight_problem(model) == "parameter bias has 1 non-finite entries of 2"
    assert step_problem(finite, None, [{"loss": 0.0}], model) == "parameter bias has 1 non-finite entries of 2"


def _config(base, out, **extra) -> Config:
    cfg = Config()
    overrides = {"model.name_or_path": str(base), "output_dir": str(out), "max_steps": 3, "prompts_per_step": 2,
                 "num_generations": 3, "sampling.steps": 4, "save_steps": 1, "warmup_steps": 0,
                 "eval.before": False, "eval.after": False, **extra}
    apply_overrides(cfg, [f"{k}={v}" for k, v in overrides.items()])
    return cfg


def test_a_step_with_nan_weights_stops_the_run_before_its_checkpoint(tmp_path, monkeypatch):
    """Step 2's optimizer update writes a NaN into the weights (a stand-in for an overflow): the run stops at step
    2 naming the parameter, step-1 is the newest checkpoint, and nothing of step 2 is logged."""
    from dlmrl.training import update

    base = save_tiny_checkpoint(tmp_path / "base")
    calls = {"n": 0}
    real = update.run_updates

    def poisoning(run, batch):
        result = real(run, batch)
        calls["n"] += 1
        if calls["n"] == 2:
            with torch.no_grad():
                next(run.policy.model.parameters()).view(-1)[0] = math.nan
        return result

    monkeypatch.setattr("dlmrl.training.trainer.run_updates", poisoning)
    out = tmp_path / "run"
    with pytest.raises(NonFiniteError, match=r"step 2 went non-finite: parameter .* has 1 non-finite entries .*"
                                             r"checkpoints up to step-1 hold finite values"):
        train(_config(base, out), progress=False)
    assert [p.name for p in checkpoints(out)] == ["step-1"]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


def test_a_nan_loss_stops_the_run_and_the_cli_says_so(tmp_path, capsys, monkeypatch):
    """An update whose loss is NaN (a stand-in for an overflow): the CLI exits 2 with the message, no traceback."""
    from dlmrl.cli import main
    from dlmrl.training import update

    real = update.run_updates

    def nan_loss(run, batch):
        result = real(run, batch)
        result.logs[-1]["loss"] = math.nan
        return result

    monkeypatch.setattr("dlmrl.training.trainer.run_updates", nan_loss)
    base = save_tiny_checkpoint(tmp_path / "base")
    out = tmp_path / "run"
    code = main(["train", "--no-progress", "--output-dir", str(out), f"model.name_or_path={base}", "max_steps=3",
                 "prompts_per_step=2", "num_generations=3", "sampling.steps=4", "save_steps=1", "warmup_steps=0",
                 "eval.before=false", "eval.after=false"])
    err = capsys.readouterr().err
    assert code == 2 and "step 1 went non-finite: the loss of optimizer update 1 of 1 is nan" in err
    assert "Traceback" not in err


def test_a_learning_rate_above_one_is_refused_naming_the_key():
    """1e38 crashed inside AdamW's update with torch's bare 'value cannot be converted ... without overflow'."""
    from dlmrl.config import ConfigError, validate

    cfg = Config()
    apply_overrides(cfg, ["learning_rate=1e38"])
    with pytest.raises(ConfigError, match="train.learning_rate.*must be <= 1"):
        validate(cfg)


def _strict_json(text: str):
    """``json.loads`` that refuses NaN and Infinity (what JSON readers other than Python's do)."""
    def refuse(name):
        raise ValueError(f"not valid JSON: {name}")

    return json.loads(text, parse_constant=refuse)


PROMPTS = ["3100020023101423=", "4210100030010030=", "0400100020300301="]
SOLUTIONS = ["3142423123141423", "4213134234212134", "3412124321344321"]


def test_non_finite_rewards_count_as_none_and_every_json_file_stays_valid(tmp_path):
    """A reward function returning inf for some completions and NaN for others (on main: exit 0 with
    ``"mean_reward": Infinity`` in summary.json, and NaN shown as None): both count as None by one rule, a warning
    names the function, and the run's JSON files parse strictly."""
    from datasets import Dataset

    from dlmrl import Trainer

    def cells_or_inf(prompts, completions, solution, **_):
        out = []
        for i, (c, s) in enumerate(zip(completions, solution)):
            out.append(math.inf if i % 3 == 0 else math.nan if i % 3 == 1 else
                       sum(a == b for a, b in zip(c, s)) / len(s))
        return out

    data = Dataset.from_dict({"prompt": PROMPTS, "solution": SOLUTIONS})
    out = tmp_path / "run"
    trainer = Trainer("tiny-sudoku", reward_funcs=[cells_or_inf], train_dataset=data, eval_dataset=data,
                      config={"train.max_steps": 2, "train.prompts_per_step": 2, "train.num_generations": 3,
                              "output_dir": str(out)})
    with pytest.warns(UserWarning, match=r"reward function 'cells_or_inf' returned \d+ non-finite values .* count "
                                         r"as None"):
        summary = trainer.train()
    assert math.isfinite(summary["eval_after"]["mean_reward"])
    for name in ("summary.json", "metrics.jsonl"):
        for line in ((out / name).read_text().splitlines() if name.endswith("l") else [(out / name).read_text()]):
            _strict_json(line)


def test_a_step_where_every_reward_is_missing_stops_the_run(tmp_path):
    from datasets import Dataset

    from dlmrl import Trainer

    def always_inf(prompts, completions, **_):
        return [math.inf] * len(completions)

    data = Dataset.from_dict({"prompt": PROMPTS, "solution": SOLUTIONS})
    trainer = Trainer("tiny-sudoku", reward_funcs=[always_inf], train_dataset=data,
                      config={"train.max_steps": 2, "train.prompts_per_step": 2, "train.num_generations": 3,
                              "output_dir": str(tmp_path / "run"), "eval.before": False, "eval.after": False})
    with pytest.warns(UserWarning), pytest.raises(NonFiniteError, match="step 1 went non-finite: every reward is "
                                                                        "missing"):
        trainer.train()


def test_json_ready_writes_null_for_non_finite_numbers():
    from dlmrl.training.finite import json_ready

    assert json_ready({"a": [1.0, math.inf, (math.nan, -math.inf)], "b": "x", "c": None, "d": 3}) == {
        "a": [1.0, None, [None, None]], "b": "x", "c": None, "d": 3}
