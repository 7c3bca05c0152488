"""The dataset task from YAML and the command line: 2 steps on both policy kinds with a user reward named by an
import string, registered by an ``--import`` module or by a ``dlmrl.plugins`` entry point; the clear errors
before any model loads; and the default job unchanged by the new ways in (bit-identical parameters)."""

from __future__ import annotations

import importlib.metadata
import json
import re
import sys

import pytest
import torch
from safetensors.torch import load_file

from dlmrl import cli, plugins
from dlmrl.data.sudoku import load_test_split
from tests.tolerances import rounding_tol

PUZZLES = load_test_split()[:12]
SMALL = ["max_steps=2", "prompts_per_step=2", "num_generations=2", "save_steps=1", "learning_rate=1e-3",
         "warmup_steps=0", "eval.batch_size=4", "--no-progress"]

REWARD_MODULE = '''
def cells_right(prompts, completions, solution, **columns):
    """Fraction of the 16 cells equal to the solution column."""
    return [sum(a == b for a, b in zip(c, s)) / 16 for c, s in zip(completions, solution)]


def short(prompts, completions, **columns):
    return [0.0]
'''

PLUGIN_MODULE = '''
from dlmrl.rewards import REWARDS
from {reward_module} import cells_right

def register():
    REWARDS.register("cells_right_registered")(cells_right)
'''


@pytest.fixture
def user_code(tmp_path, monkeypatch, request):
    """Data files and a reward module (unique names per test) on sys.path; registrations and modules are undone."""
    from dlmrl.rewards import REWARDS

    tag = re.sub(r"\W", "_", request.node.name)  # (a module name)
    mod = f"user_rewards_{tag}"
    (tmp_path / f"{mod}.py").write_text(REWARD_MODULE)
    (tmp_path / f"{mod}_plugin.py").write_text(PLUGIN_MODULE.format(reward_module=mod) + "\nregister()\n")
    (tmp_path / f"{mod}_ep.py").write_text(PLUGIN_MODULE.format(reward_module=mod))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_loaded", set())
    for name, rows in (("train", PUZZLES[:8]), ("test", PUZZLES[8:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(
            json.dumps({"prompt": e.puzzle + "=", "solution": e.solution}) + "\n" for e in rows))
    saved = dict(REWARDS._items)
    yield tmp_path, mod
    REWARDS._items.clear()
    REWARDS._items.update(saved)
    for name in [m for m in sys.modules if m.startswith(mod)]:
        del sys.modules[name]


def write_config(path, kind: str, reward_funcs: str, test: bool = True, **task) -> str:
    model = "kind: ar\n  name_or_path: tiny-sudoku-ar" if kind == "ar" else "name_or_path: tiny-sudoku"
    lines = [f"model:\n  {model}", "task:", "  name: dataset", f"  train_file: {path / 'train.jsonl'}"]
    if test:
        lines.append(f"  test_file: {path / 'test.jsonl'}")
    lines += [f"  {k}: {v}" for k, v in task.items()]
    lines += [f"reward_funcs: {reward_funcs}", "reward_weights: [1.0, 0.5]" if "," in reward_funcs else "",
              f"train:\n  algorithm: {'grpo' if kind == 'ar' else 'gdpo'}", "eval:\n  num_puzzles: 0"]
    (path / "run.yaml").write_text("\n".join(lines) + "\n")
    return str(path / "run.yaml")


@pytest.mark.parametrize("kind", ["diffusion", "ar"])
@pytest.mark.parametrize("how", ["import string", "--import", "entry point"])
def test_two_steps_from_yaml_with_a_user_reward(kind, how, user_code, monkeypatch, capsys):
    tmp, mod = user_code
    extra = []
    if how == "import string":
        funcs = f"[{mod}:cells_right, xmlcount]"
    else:
        funcs = "[cells_right_registered]"
        if how == "--import":
            extra = ["--import", f"{mod}_plugin"]
        else:
            ep = importlib.metadata.EntryPoint("mine", f"{mod}_ep:register", plugins.ENTRY_POINT_GROUP)
            monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [ep] if group else [])
    out = tmp / "run"
    rc = cli.main(["train", "--config", write_config(tmp, kind, funcs), "--output-dir", str(out), *SMALL, *extra])
    assert rc == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    name = "cells_right" if how == "import string" else "cells_right_registered"
    assert [r["step"] for r in rows] == [1, 2] and all(r[f"rewards/{name}/mean"] is not None for r in rows)
    if how == "import string":
        assert all("rewards/xmlcount/mean" in r for r in rows)
        # the summed reward is 1.0 * cells_right + 0.5 * xmlcount (TRL's reward_weights)
        # (float32 means over the 4 rows, of rewards ≤ 1.5: ≤ 4 roundings each, the weight and the sum 2 more)
        assert rows[0]["reward_mean"] == pytest.approx(
            rows[0]["rewards/cells_right/mean"] + 0.5 * rows[0]["rewards/xmlcount/mean"], abs=rounding_tol(1.5, 10))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval_after"]["primary_metric"] == "mean_reward" and summary["eval_after"]["num_examples"] == 4
    before = load_file(str(out / "checkpoints" / "step-1" / "model.safetensors"))
    after = load_file(str(out / "final_model" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_a_registered_reward_is_unknown_without_its_import(user_code, capsys):
    tmp, _ = user_code
    rc = cli.main(["train", "--config", write_config(tmp, "diffusion", "[cells_right_registered]"), "--dry-run"])
    assert rc == 2 and "unknown reward 'cells_right_registered'" in capsys.readouterr().err



def test_a_wrong_import_string_names_the_key_module_and_attribute_before_any_model_loads(user_code, no_model_load,
                                                                                         capsys):
    tmp, mod = user_code
    config = write_config(tmp, "diffusion", f"[{mod}:exact_match]")
    assert cli.main(["train", "--config", config, "--output-dir", str(tmp / "run")]) == 2
    err = capsys.readouterr().err
    assert f"run.yaml line 7: config key 'train.reward_funcs': entry 0 '{mod}:exact_match': module '{mod}' imports, " \
           f"but '{mod}' has no attribute 'exact_match'" in err, err
    config = write_config(tmp, "diffusion", "[no_such_package.rewards:exact_match]")
    assert cli.main(["train", "--config", config]) == 2
    assert "cannot import module 'no_such_package.rewards' (module 'no_such_package' is not installed or not on " \
           "sys.path)" in capsys.readouterr().err
    assert cli.main(["train", "--config", config, "--import", "no_such_module"]) == 2
    assert "dlmrl train: --import no_such_module: cannot import module 'no_such_module'" in capsys.readouterr().err


def test_a_dataset_without_the_prompt_column_names_it_before_any_model_loads(user_code, no_model_load, capsys):
    tmp, mod = user_code
    (tmp / "train.jsonl").write_text(json.dumps({"question": "1=", "solution": "1"}) + "\n")
    config = write_config(tmp, "diffusion", f"[{mod}:cells_right]")
    assert cli.main(["train", "--config", config]) == 2
    err = capsys.readouterr().err
    assert "config key 'task.train_file':" in err and "train.jsonl: no prompt column 'prompt' (task.prompt_column); " \
                                                      "its columns are 'question', 'solution'" in err, err


def test_a_column_a_reward_needs_missing_from_the_data_is_refused_by_dry_run(user_code, no_model_load, capsys):
    """cells_right(prompts, completions, solution, ...) on data without a solution column: refused up front (it
    passed --dry-run and raised a bare TypeError after the whole "before" evaluation)."""
    tmp, mod = user_code
    (tmp / "test.jsonl").write_text(json.dumps({"prompt": "1=", "answer": "1"}) + "\n")
    config = write_config(tmp, "diffusion", f"[{mod}:cells_right]")
    assert cli.main(["train", "--config", config, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "config key 'train.reward_funcs': reward function 'cells_right' needs a column 'solution' (its parameter " \
           f"solution has no default), which the data does not have ({tmp / 'test.jsonl'} has the columns " \
           "'answer')" in err, err


def test_a_reward_of_the_wrong_length_stops_the_run_naming_it(user_code, capsys):
    tmp, mod = user_code
    config = write_config(tmp, "diffusion", f"[{mod}:short]")
    assert cli.main(["train", "--config", config, "--output-dir", str(tmp / "run"), *SMALL]) == 2
    assert "dlmrl train: reward function 'short' returned 1 values for 4 completions (expected 4" in \
           capsys.readouterr().err


def test_dry_run_shows_the_reward_functions(user_code, capsys):
    tmp, mod = user_code
    assert cli.main(["train", "--config", write_config(tmp, "diffusion", f"[{mod}:cells_right, xmlcount]"),
                     "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "name: dataset" in out and f"spec: {mod}:cells_right" in out and "weight: 0.5" in out
    assert "prompt_column: prompt" in out


def default_job(out, *overrides) -> list[str]:
    return ["train", "max_steps=3", "prompts_per_step=4", "num_generations=4", "eval.before=false",
            "eval.after=false", "save_steps=10", "--no-progress", "--output-dir", str(out), *overrides]


def loaded_and_given(cfg, tmp_path) -> tuple[dict, dict]:
    """The final parameters of ``train(cfg)`` (it loads the model and builds the task) and of ``train`` given the
    policy and task it would build."""
    from dlmrl.training.run_setup import build_task, load_configured_policy
    from dlmrl.training.trainer import train

    cfg.output_dir = str(tmp_path / "loaded")
    train(cfg, progress=False)
    cfg.output_dir = str(tmp_path / "given")
    policy = load_configured_policy(cfg)
    train(cfg, progress=False, policy=policy, task=build_task(cfg, policy))
    return tuple(load_file(str(tmp_path / run / "final_model" / "model.safetensors")) for run in ("loaded", "given"))


def test_the_default_job_trains_the_same_parameters_through_every_way_in(tmp_path):
    """`dlmrl train` (3 steps, small batch) against the function with the same config, and against the function
    given the policy and task it would build: bit-identical parameters."""
    from dlmrl.config import default_job_config

    assert cli.main(default_job(tmp_path / "cli")) == 0
    overrides = [o for o in default_job(tmp_path)[1:] if "=" in o]  # (the same job, for the function)
    cfg = default_job_config(overrides)
    loaded, given = loaded_and_given(cfg, tmp_path)
    ref = load_file(str(tmp_path / "cli" / "final_model" / "model.safetensors"))
    assert all(torch.equal(ref[k], loaded[k]) and torch.equal(ref[k], given[k]) for k in ref)


def test_a_given_ar_policy_with_a_kl_reference_trains_as_a_loaded_one(tmp_path):
    """grpo (beta 0.04): the reference of a given policy is a frozen copy of it, the loaded model otherwise."""
    from dlmrl.config import build_preset, default_job_config

    cfg = default_job_config(["model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "task.answer_mode=full",
                              "algorithm=grpo", "max_steps=2", "prompts_per_step=2", "num_generations=4",
                              "num_iterations=2", "eval.before=false", "eval.after=false"])
    assert "logp_ref" in build_preset(cfg).objective.required_inputs  # (a reference model is used)
    a, b = loaded_and_given(cfg, tmp_path)
    assert all(torch.equal(a[k], b[k]) for k in a)


def readme_block(heading: str, lang: str) -> str:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    return re.search(rf"```{lang}\n(.*?)```", text[text.index(heading):], re.DOTALL).group(1)


@pytest.fixture
def readme_run(tmp_path, monkeypatch):
    """The README's my_rewards.py and my_run.yaml written into a fresh folder (the current one), with data files."""
    heading = "### The same from YAML and the command line"
    (tmp_path / "my_rewards.py").write_text(readme_block(heading, "python"))
    (tmp_path / "my_run.yaml").write_text(readme_block(heading, "yaml"))
    for name, rows in (("train", PUZZLES[:8]), ("test", PUZZLES[8:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(
            {"prompt": e.puzzle + "=", "puzzle": e.puzzle, "solution": e.solution}) + "\n" for e in rows))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # (the command puts the current folder on it)
    sys.modules.pop("my_rewards", None)
    yield tmp_path
    sys.modules.pop("my_rewards", None)


@pytest.mark.parametrize("kind", ["diffusion", "ar"])
def test_the_readme_yaml_runs_as_written(kind, readme_run, capsys):
    ar = ["model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "algorithm=grpo"] if kind == "ar" else []
    assert cli.main(["train", "--config", "my_run.yaml", *SMALL, *ar]) == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (readme_run / "runs" / "my_yaml_run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and {"rewards/cells_right/mean", "rewards/sudoku/mean"} <= set(rows[-1])


def test_the_readme_wrong_import_string_message(readme_run, no_model_load, capsys):
    text = (readme_run / "my_run.yaml").read_text().replace("my_rewards:cells_right", "my_rewards:cell_right")
    (readme_run / "my_run.yaml").write_text(text)
    assert cli.main(["train", "--config", "my_run.yaml"]) == 2
    assert ("config error: my_run.yaml line 7: config key 'train.reward_funcs': entry 0 'my_rewards:cell_right': "
            "module 'my_rewards' imports, but 'my_rewards' has no attribute 'cell_right'") in capsys.readouterr().err
