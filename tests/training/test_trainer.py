"""A 2-step GDPO smoke run, resume equivalence, and Ctrl-C leaving a resumable run."""

import json
import signal

import pytest
import torch
from safetensors.torch import load_file

from dlmrl.config import Config, apply_overrides
from dlmrl.data.tasks import SudokuTask
from dlmrl.training.trainer import train
from tests.helpers import crash_then_resume, save_tiny_checkpoint


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("base"))


def small_config(base, out, **extra) -> Config:
    cfg = Config()
    overrides = {
        "model.name_or_path": str(base), "output_dir": str(out), "max_steps": 2, "prompts_per_step": 2,
        "num_generations": 3, "num_iterations": 2, "sampling.steps": 4, "eval.steps": 4,
        "eval.num_puzzles": 8, "save_steps": 1, "learning_rate": 1e-3, "warmup_steps": 0,
    }
    overrides.update(extra)
    apply_overrides(cfg, [f"{k}={v}" for k, v in overrides.items()])
    return cfg


def params(path):
    return load_file(str(path / "final_model" / "model.safetensors"))


def test_two_step_smoke_run_writes_run_files_and_changes_parameters(base, tmp_path):
    summary = train(small_config(base, tmp_path), progress=False)
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "reward_curve.png"):
        assert (tmp_path / name).exists(), name
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 <= r["reward_mean"] <= 1.0 for r in rows)
    assert 0.0 <= summary["eval_before"]["cell_accuracy"] <= 1.0
    assert 0.0 <= summary["eval_after"]["cell_accuracy"] <= 1.0
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["eval_after"]["cell_accuracy"] == summary["eval_after"]["cell_accuracy"]
    before = load_file(str(base / "model.safetensors"))
    after = params(tmp_path)
    assert any(not torch.equal(before[k], after[k]) for k in before), "training must change parameters"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1", "step-2"]


def test_resumed_run_matches_uninterrupted_run(base, tmp_path, monkeypatch):
    full = tmp_path / "full"
    train(small_config(base, full, max_steps=4, save_steps=2, **{"eval.before": False}), progress=False)

    crashed = tmp_path / "crashed"
    crash_then_resume(monkeypatch, lambda resume: train(small_config(
        base, crashed, max_steps=4, save_steps=2, **{"eval.before": False}), resume=resume, progress=False), 3,
        after_crash=lambda: (crashed / "checkpoints" / "step-2").exists() or pytest.fail("no step-2 checkpoint"))

    a, b = params(full), params(crashed)
    for k in a:  # bit for bit: the resumed steps rerun the same code on the same reloaded state
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    steps = [json.loads(x)["step"] for x in (crashed / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_ctrl_c_saves_a_resumable_checkpoint(base, tmp_path, monkeypatch):
    original = SudokuTask.train_batch

    def interrupt_at_step_1(self, n, seed, step):
        if step == 1:
            signal.raise_signal(signal.SIGINT)
        return original(self, n, seed, step)

    monkeypatch.setattr(SudokuTask, "train_batch", interrupt_at_step_1)
    with pytest.raises(KeyboardInterrupt):
        train(small_config(base, tmp_path, max_steps=3, save_steps=10, **{"eval.before": False}), progress=False)
    assert (tmp_path / "checkpoints" / "step-2").exists()
    monkeypatch.setattr(SudokuTask, "train_batch", original)
    summary = train(small_config(base, tmp_path, max_steps=3, save_steps=10, **{"eval.before": False}),
                    resume=True, progress=False)
    assert summary["steps"] == 3


def test_unloadable_model_is_a_config_error(tmp_path):
    from dlmrl.config import ConfigError

    with pytest.raises(ConfigError, match="cannot be loaded"):
        train(small_config(tmp_path / "missing", tmp_path / "out"), progress=False)


def test_resume_without_checkpoint_is_a_clear_error(base, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(small_config(base, tmp_path), resume=True, progress=False)


def test_full_grid_answer_mode_runs(base, tmp_path):
    summary = train(small_config(base, tmp_path, max_steps=1, **{"task.answer_mode": "full"}), progress=False)
    assert 0.0 <= summary["eval_after"]["cell_accuracy"] <= 1.0


def test_cli_eval_prints_metrics(base, capsys):
    from dlmrl.cli import main

    assert main(["eval", "--model", str(base), "eval.num_puzzles=4", "eval.steps=4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_puzzles"] == 4 and 0.0 <= out["cell_accuracy"] <= 1.0


def test_a_held_out_split_smaller_than_eval_num_puzzles_stops_before_any_step(base, tmp_path, monkeypatch, capsys):
    """Hub data is counted only once the run loads it (the config check cannot): 300 puzzles asked of the 256
    held-out ones stop the run naming eval.num_puzzles, before any evaluation or step (it was the task's bare
    ValueError traceback at the first evaluation); dlmrl eval likewise."""
    from dlmrl.cli import main

    monkeypatch.setattr(SudokuTask, "check_options", classmethod(lambda cls, options: None))  # (size unknown)
    message = ("config key 'eval.num_puzzles': 300 held-out examples asked, the held-out split of task 'sudoku' has "
               "256; set eval.num_puzzles 256 or less (0 = the whole split)")
    for before in ("true", "false"):
        out = tmp_path / before
        args = ["train", f"model.name_or_path={base}", f"output_dir={out}", "max_steps=1", "prompts_per_step=2",
                "num_generations=2", "sampling.steps=4", "eval.num_puzzles=300", f"eval.before={before}",
                "--no-progress"]
        assert main(args) == 2
        assert message in capsys.readouterr().err
        assert not (out / "metrics.jsonl").exists()
    assert main(["eval", "--model", str(base), "eval.num_puzzles=300", "eval.steps=4"]) == 2
    assert message in capsys.readouterr().err


def test_fresh_run_refuses_a_folder_with_checkpoints(base, tmp_path):
    from dlmrl.config import ConfigError

    train(small_config(base, tmp_path, max_steps=1, **{"eval.before": False}), progress=False)
    with pytest.raises(ConfigError, match="--resume"):
        train(small_config(base, tmp_path, max_steps=1, **{"eval.before": False}), progress=False)


def test_resume_refuses_changed_settings(base, tmp_path):
    from dlmrl.config import ConfigError

    train(small_config(base, tmp_path, max_steps=1, **{"eval.before": False}), progress=False)
    with pytest.raises(ConfigError, match="learning_rate"):
        train(small_config(base, tmp_path, max_steps=1, learning_rate=0.5, **{"eval.before": False}),
              resume=True, progress=False)


def test_resume_may_extend_a_finished_run_but_not_end_it_below_its_steps(base, tmp_path, capsys):
    """--resume max_steps=N continues a finished run to step N (it was refused as a changed setting), with a
    warning that the schedule now spans N steps; a max_steps below the steps done is refused naming the key."""
    from dlmrl.cli import main
    from dlmrl.config import ConfigError

    train(small_config(base, tmp_path, max_steps=1, num_iterations=1, **{"eval.before": False, "eval.after": False}),
          progress=False)
    args = ["train", "--resume", "--output-dir", str(tmp_path), "--no-progress"]
    with pytest.warns(UserWarning, match=r"--resume with train.max_steps 1 -> 2 \(after 1 steps done\): the "
                                         r"learning-rate schedule \(cosine\) now spans 2 steps"):
        assert main([*args, "max_steps=2"]) == 0
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2] and json.loads((tmp_path / "summary.json").read_text())["steps"] == 2
    capsys.readouterr()
    assert main([*args, "max_steps=1"]) == 2
    assert "config key 'train.max_steps': --resume continues a run that has done 2 steps; 1 is below them (use 2 " \
           "or more)" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="these differ: train.learning_rate"):  # (other settings: still refused)
        train(small_config(base, tmp_path, max_steps=3, num_iterations=1, learning_rate=0.5,
                           **{"eval.before": False, "eval.after": False}), resume=True, progress=False)


def test_cli_resume_reads_the_runs_own_config(base, tmp_path):
    from dlmrl.cli import main

    args = [f"model.name_or_path={base}", "max_steps=2", "prompts_per_step=2", "num_generations=2",
            "eval.num_puzzles=4", "eval.steps=4", "sampling.steps=4", "--output-dir", str(tmp_path), "--no-progress"]
    assert main(["train", *args]) == 0
    # no overrides repeated: --resume continues with the saved config.yaml, not the default recipe
    assert main(["train", "--resume", "--output-dir", str(tmp_path), "--no-progress"]) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 2


def test_resume_of_a_run_stopped_before_its_first_checkpoint_starts_it_again(tmp_path):
    """Ctrl-C in the first evaluation or kill -9 before save_steps leaves config.yaml and no checkpoint: --resume
    starts the run again from step 0 with its settings (refusing others); checkpoints without config.yaml are
    refused rather than resumed with the default recipe."""
    from dlmrl.config import ConfigError, save_yaml
    from dlmrl.training.run_folder import check_run_folder

    cfg = Config()
    cfg.output_dir = str(tmp_path / "run")
    (tmp_path / "run").mkdir()
    save_yaml(cfg, tmp_path / "run" / "config.yaml")
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    assert check_run_folder(cfg, resume=True) is None
    other = Config()
    other.output_dir, other.train.learning_rate = cfg.output_dir, 0.5  # (max_steps may change: 0 steps done)
    with pytest.raises(ConfigError, match="learning_rate"):
        check_run_folder(other, resume=True)
    (tmp_path / "run" / "config.yaml").unlink()
    (tmp_path / "run" / "checkpoints" / "step-2").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no config.yaml"):
        check_run_folder(cfg, resume=True)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        check_run_folder(Config(output_dir=str(tmp_path / "empty")), resume=True)
