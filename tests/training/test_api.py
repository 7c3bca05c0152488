"""The Python API (``from dlmrl import Trainer``): 2 steps on both policy kinds with a reward defined here and a
``Dataset`` built here; per-reward metrics, callbacks, evaluate, save, resume; the clear errors, before any model
is loaded where they can be."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file

from dlmrl import Callback, Trainer
from dlmrl.config import ConfigError
from dlmrl.data.sudoku import load_test_split
from dlmrl.plugins import PluginError
from dlmrl.rewards.functions import RewardFunctionError

README = Path(__file__).resolve().parents[2] / "README.md"
PUZZLES = load_test_split()[:12]


def sudoku_dataset(start: int, n: int) -> Dataset:
    rows = PUZZLES[start : start + n]
    return Dataset.from_dict({"prompt": [e.puzzle + "=" for e in rows], "solution": [e.solution for e in rows]})


def cells_right(prompts, completions, solution, **columns):
    """Fraction of the 16 cells equal to the solution column."""
    return [sum(a == b for a, b in zip(c, s)) / 16 for c, s in zip(completions, solution)]


def ones_where_known(prompts, completions, **columns):
    """Not applicable (None) to every other completion: left out of the sum and of its statistics."""
    return [float(c.count("1")) / 16 if i % 2 == 0 else None for i, c in enumerate(completions)]


def solved(prompts, completions, solution, **columns) -> float:
    return sum(c == s for c, s in zip(completions, solution)) / len(completions)


def small(out, **extra) -> dict:
    return {"train.max_steps": 2, "train.prompts_per_step": 2, "train.num_generations": 2, "train.save_steps": 1,
            "train.learning_rate": 1e-3, "train.warmup_steps": 0, "eval.batch_size": 4, "output_dir": str(out),
            **extra}


class Recorder(Callback):
    def __init__(self):
        self.logged, self.steps, self.evaluations = [], [], []

    def on_log(self, record):
        self.logged.append(record)

    def on_step_end(self, step, record):
        self.steps.append(step)

    def on_evaluate(self, metrics):
        self.evaluations.append(metrics)


def state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("model", ["tiny-sudoku", "tiny-sudoku-ar"])
def test_two_steps_with_a_reward_and_a_dataset_of_our_own(model, tmp_path):
    rec = Recorder()
    trainer = Trainer(model, reward_funcs=[cells_right, ones_where_known], train_dataset=sudoku_dataset(0, 8),
                      eval_dataset=sudoku_dataset(8, 4), eval_metric=solved, config=small(tmp_path / "run"),
                      callbacks=[rec])
    assert trainer.config.model.kind == ("ar" if model.endswith("-ar") else "diffusion")
    assert trainer.config.train.algorithm == ("grpo" if model.endswith("-ar") else "gdpo")
    before = state(trainer.model)
    summary = trainer.train(progress=False)
    after = state(trainer.model)
    assert any(not torch.equal(before[k], after[k]) for k in before), "training must change parameters"

    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # TRL's per-function names; the summed reward as before
        for key in ("rewards/cells_right/mean", "rewards/cells_right/std", "rewards/ones_where_known/mean"):
            assert r[key] is not None and 0 <= r[key] <= 1, (key, r)
        assert r["solve_rate"] is None  # (reward functions: no reward means "solved")
    assert rec.steps == [1, 2] and [r["step"] for r in rec.logged] == [1, 2]
    assert len(rec.evaluations) == 2  # before and after
    assert summary["eval_after"]["primary_metric"] == "solved" and summary["eval_after"]["num_examples"] == 4
    assert set(summary["eval_after"]) >= {"mean_reward", "rewards/cells_right/mean", "solved"}

    metrics = trainer.evaluate()
    assert metrics["solved"] == summary["eval_after"]["solved"] and len(rec.evaluations) == 3
    saved = trainer.save(tmp_path / "saved")
    weights = load_file(str(saved / "model.safetensors"))
    assert all(torch.equal(weights[k], after[k]) for k in weights)
    reloaded = Trainer(str(saved), reward_funcs=[cells_right], train_dataset=sudoku_dataset(0, 2),
                       config={"model.kind": trainer.config.model.kind, "output_dir": str(tmp_path / "again")})
    assert all(torch.equal(v, after[k]) for k, v in reloaded.model.state_dict().items())


class StopAt(Callback):
    """Fails after step ``step`` (after its checkpoint): a crash mid-run."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, step, record):
        if step == self.step:
            raise RuntimeError("simulated crash")


def test_resume_continues_a_stopped_run_to_the_same_parameters(tmp_path):
    def trainer(out, callbacks=()):
        return Trainer("tiny-sudoku", reward_funcs=[cells_right], train_dataset=sudoku_dataset(0, 8),
                       config=small(out, **{"train.max_steps": 3}), callbacks=list(callbacks))

    trainer(tmp_path / "full").train(progress=False)
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer(tmp_path / "crashed", [StopAt(2)]).train(progress=False)
    assert (tmp_path / "crashed" / "checkpoints" / "step-2").is_dir()
    trainer(tmp_path / "crashed").train(resume=True, progress=False)
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer(tmp_path / "elsewhere", [StopAt(1)]).train(progress=False)
    trainer(tmp_path / "unused").train(resume_from=tmp_path / "elsewhere", progress=False)
    full = load_file(str(tmp_path / "full" / "final_model" / "model.safetensors"))
    for run in ("crashed", "elsewhere"):
        resumed = load_file(str(tmp_path / run / "final_model" / "model.safetensors"))
        assert all(torch.equal(full[k], resumed[k]) for k in full), run
        steps = [json.loads(x)["step"] for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        assert steps == [1, 2, 3]



def test_a_dataset_without_the_prompt_column_stops_before_any_model_loads(no_model_load):
    data = Dataset.from_dict({"question": ["1="], "solution": ["1"]})
    with pytest.raises(ValueError, match=r"train_dataset: no prompt column 'prompt'; its columns are 'question', "
                                         r"'solution'"):
        Trainer("tiny-sudoku", reward_funcs=[cells_right], train_dataset=data)
    with pytest.raises(ValueError, match=r"eval_dataset: no prompt column 'prompt'"):
        Trainer("tiny-sudoku", reward_funcs=[cells_right], train_dataset=sudoku_dataset(0, 2), eval_dataset=data)


def test_a_wrong_import_string_stops_before_any_model_loads(no_model_load):
    with pytest.raises(PluginError, match=r"reward_funcs entry 1 'dlmrl.rewards:no_such_reward': module "
                                          r"'dlmrl.rewards' imports, but 'dlmrl.rewards' has no attribute "
                                          r"'no_such_reward'"):
        Trainer("tiny-sudoku", reward_funcs=[cells_right, "dlmrl.rewards:no_such_reward"],
                train_dataset=sudoku_dataset(0, 2))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"config": {"train.max_step": 2}}, ConfigError, r"unknown config key 'train.max_step'"),
    ({"config": {"task.name": "gsm8k"}}, ConfigError, r"config key 'task.name': the Python API trains on"),
    ({"config": {"model.kind": "ar"}}, ConfigError, r"config key 'model.kind': the model is a diffusion policy"),
    ({"eval_metric": solved}, ValueError, r"eval_metric: needs an eval_dataset"),
    ({"eval_dataset": sudoku_dataset(8, 2), "config": {"eval.num_puzzles": 3}}, ConfigError,
     r"config key 'eval.num_puzzles': 3 examples asked, eval_dataset has 2"),
    ({"reward_weights": [1.0, 2.0]}, ValueError, r"reward_weights: 2 weights for 1 reward functions"),
    ({"callbacks": [object()]}, TypeError, r"has none of the methods on_log, on_step_end, on_evaluate"),
])
def test_other_mistakes_stop_before_any_model_loads(no_model_load, kwargs, error, match):
    with pytest.raises(error, match=match):
        Trainer("tiny-sudoku", reward_funcs=[cells_right], train_dataset=sudoku_dataset(0, 2), **kwargs)


def test_a_column_a_reward_needs_missing_from_a_dataset_stops_before_any_model_loads(no_model_load):
    """cells_right reads the solution column: an eval dataset without it is refused now, not at the first scoring
    (a bare TypeError after the whole "before" evaluation)."""
    with pytest.raises(RewardFunctionError, match=r"reward function 'cells_right' needs a column 'solution' .*"
                                                  r"\(eval_dataset has the columns none besides the prompt\)"):
        Trainer("tiny-sudoku", reward_funcs=[cells_right], train_dataset=sudoku_dataset(0, 2),
                eval_dataset=Dataset.from_dict({"prompt": ["1234="]}))


def test_a_second_run_into_the_same_folder_is_said_before_the_model_loads_in_the_apis_words(tmp_path, monkeypatch):
    """The warning comes before the (possibly long) model load; train() refuses naming trainer.train(resume=True)
    and output_dir, not the command line's --resume / --output-dir."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("{}\n")
    import dlmrl.api

    real = dlmrl.api._policy_of
    warned_before_load = []  # (whether the warning was caught when the model started loading)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monkeypatch.setattr(dlmrl.api, "_policy_of", lambda *a: warned_before_load.append(
            any("output_dir" in str(w.message) for w in caught)) or real(*a))
        trainer = Trainer("tiny-sudoku", reward_funcs=[cells_right], train_dataset=sudoku_dataset(0, 2),
                          config=small(tmp_path / "run"))
    said = [str(w.message) for w in caught if "output_dir" in str(w.message)]
    assert len(said) == 1 and re.search(r"config key 'output_dir': .*run already holds a run, so "
                                        r"trainer.train\(\) will refuse", said[0])
    assert warned_before_load == [True]
    with pytest.raises(ConfigError, match=r"config key 'output_dir': .*run already holds a run; continue it with "
                                          r"trainer.train\(resume=True\), or give the Trainer a new output_dir") as err:
        trainer.train(progress=False)
    assert "--" not in str(err.value)


def test_a_block_model_decoding_one_step_per_block_is_warned_about_before_it_loads(no_model_load):
    """The default recipe's 4 steps on tiny-sudoku-block's 4 blocks of 4: each block revealed in one pass."""
    with pytest.warns(UserWarning, match=r"config key 'sampling.steps': 4 steps over 4 blocks .* use 16 for one "
                                         r"token per step"), pytest.raises(AssertionError, match="model was loaded"):
        Trainer("tiny-sudoku-block", reward_funcs=[cells_right], train_dataset=sudoku_dataset(0, 2))


def test_a_reward_of_the_wrong_length_names_itself_after_the_first_sampling(tmp_path):
    def short(prompts, completions, **columns):
        return [0.0] * (len(completions) - 1)

    trainer = Trainer("tiny-sudoku", reward_funcs=[short], train_dataset=sudoku_dataset(0, 4),
                      config=small(tmp_path / "run"))
    with pytest.raises(RewardFunctionError, match=r"reward function 'short' returned 3 values for 4 completions"):
        trainer.train(progress=False)


def test_a_loaded_transformers_model_or_a_policy_is_taken_as_it_is(tmp_path):
    from dlmrl.models.ar import load_ar_policy
    from dlmrl.models.loading import load_policy

    diffusion, ar = load_policy(), load_ar_policy()
    data = sudoku_dataset(0, 2)
    by_model = Trainer(diffusion.model, reward_funcs=[cells_right], train_dataset=data, tokenizer=diffusion.tokenizer)
    assert (by_model.policy.family, by_model.policy.mask_token_id) == (diffusion.family, diffusion.mask_token_id)
    by_model = Trainer(ar.model, reward_funcs=[cells_right], train_dataset=data, config={"model.kind": "ar"})
    assert by_model.policy.stop_token_ids == ar.stop_token_ids  # (the tokenizer from the model's folder)
    by_policy = Trainer(ar, reward_funcs=[cells_right], train_dataset=data)
    assert by_policy.policy is ar and by_policy.config.model.kind == "ar"
    with pytest.raises(ConfigError, match=r"config key 'model.kind': the model is a ar policy"):
        Trainer(ar, reward_funcs=[cells_right], train_dataset=data, config={"model.kind": "diffusion"})


def readme_block(heading: str) -> str:
    """The first ```python block after ``heading`` in the README."""
    text = README.read_text()
    start = text.index(heading)
    return re.search(r"```python\n(.*?)```", text[start:], re.DOTALL).group(1)


@pytest.mark.parametrize("model", ["tiny-sudoku", "tiny-sudoku-ar"])
def test_the_readme_example_runs_as_written(model, tmp_path, monkeypatch):
    code = readme_block("## Python API")
    assert '"tiny-sudoku"' in code
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code.replace('"tiny-sudoku"', f'"{model}"'), "README.md", "exec"), namespace)  # noqa: S102
    rows = [json.loads(x) for x in Path(namespace["trainer"].config.output_dir, "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and "rewards/cells_right/mean" in rows[-1]
