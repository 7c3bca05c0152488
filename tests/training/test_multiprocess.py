"""Two CPU processes (gloo) under ``accelerate launch``: a data-parallel run reaches the parameters, metrics and
evaluation of a 1-process run with the same global batch, through ``python -m dlmrl.cli`` and the ``dlmrl``
console script alike.

Tolerance: the processes score their rows in smaller batches and the gradient is summed in another order, so
parameters agree to rounding, not bit for bit; the rollouts themselves (every random draw of a row is its
whole-batch draw) are identical, which the equal rewards check. Equality is the claim, so the runs are compared
in float64 (``model.dtype=float64``); see :data:`TOLERANCE` for the bound.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dlmrl.config import ConfigError, default_job_config
from dlmrl.training.trainer import train

BIN = Path(sys.executable).parent
AR = ["model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "task.answer_mode=full"]
LR = 1e-3
COMMON = ["max_steps=2", "prompts_per_step=4", "num_generations=4", "warmup_steps=0", f"learning_rate={LR}",
          "save_steps=1", "eval.before=false", "model.dtype=float64"]
#: Max |θ_two − θ_one| after two AdamW steps. A reordered sum of n terms changes by at most ~n·u·Σ|terms| (u the
#: unit roundoff), and AdamW amplifies a gradient change δ by up to lr/ε_adam per step (∂/∂g [g/(|g|+ε)] = ε/(|g|+ε)²
#: ≤ 1/ε at the first step; lr/ε = 1e-3/1e-8 = 1e5): the amplified error scales with u. In float32 (u = 2^-24)
#: these runs differed by up to 1.4e-5 on the machines tried, so a float32 tolerance is a guess at other machines'
#: rounding. In float64 (u = 2^-53, 2^29 ≈ 5e8 times smaller) the same reorderings give ~3e-14; 1e-9 leaves a
#: factor of ~3e4 for other kernels and thread counts, and stays 1e6 below the parameters' movement in the second
#: step (~lr = 1e-3; checked below, so the comparison is not vacuous).
TOLERANCE = 1e-9


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(program: list[str], overrides: list[str], out: Path) -> subprocess.CompletedProcess:
    """``accelerate launch --cpu --num_processes 2 <program> train ...`` in a subprocess."""
    cmd = [str(BIN / "accelerate"), "launch", "--cpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
           *program, "train", f"output_dir={out}", "--no-progress", *overrides]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def one_process(overrides: list[str], out: Path) -> dict:
    """The run ``dlmrl train <overrides>`` makes, in this process."""
    return train(default_job_config([f"output_dir={out}", *overrides]), progress=False)


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def assert_same_run(two: Path, one: Path) -> None:
    a, b = load_file(str(two / "final_model" / "model.safetensors")), load_file(str(one / "final_model" / "model.safetensors"))
    diff = max((a[k] - b[k]).abs().max().item() for k in b)
    print(f"max |two processes - one process| = {diff:.3g}")
    assert diff < TOLERANCE, diff
    base_moved = max((b[k] - load_file(str(one / "checkpoints" / "step-1" / "model.safetensors"))[k]).abs().max().item()
                     for k in b)
    assert all(t.dtype == torch.float64 for t in b.values())  # (the comparison ran in float64)
    # not vacuous: the second step moved the parameters by about lr (AdamW's first steps are ~lr per parameter)
    assert base_moved > 0.1 * LR > 1e3 * TOLERANCE
    for r2, r1 in zip(rows(two), rows(one), strict=True):
        for key in ("reward_mean", "reward_std", "rows_scored", "completions_total", "nfe_sampling", "lr"):
            assert r2[key] == r1[key], key
        for key in ("loss", "grad_norm", "kl"):
            assert r2[key] == pytest.approx(r1[key], rel=1e-4, abs=1e-6), key
    for step in ("step-1", "step-2"):  # every process's RNG state saved, the run state once
        names = {p.name for p in (two / "checkpoints" / step).iterdir()}
        assert {"random_states_0.pkl", "random_states_1.pkl", "custom_checkpoint_0.pkl", "model.safetensors"} <= names


def test_two_processes_match_one_process_gdpo(tmp_path):
    """The default diffusion job (GDPO), with micro-batched scoring and μ = 2 (each process runs a different
    number of backward chunks; gradients are averaged once per update)."""
    overrides = [*COMMON, "eval.after=false", "num_iterations=2", "estimator.micro_batch=5"]
    launch(["-m", "dlmrl.cli"], overrides, tmp_path / "two")
    one_process(overrides, tmp_path / "one")
    assert_same_run(tmp_path / "two", tmp_path / "one")


@pytest.mark.slow  # (two launched processes: ~20-27 s on a 2-core CI machine; `pytest -m slow`)
def test_two_processes_match_one_process_with_trajectory_scoring(tmp_path):
    """TraceRL's trajectory estimator: each process scores its rows along their own sampled orders (the record is
    gathered with the rollout), micro-batched, μ = 2."""
    overrides = [*COMMON, "eval.after=false", "algorithm=tracerl", "num_iterations=2", "estimator.micro_batch=5"]
    launch(["-m", "dlmrl.cli"], overrides, tmp_path / "two")
    one_process(overrides, tmp_path / "one")
    assert_same_run(tmp_path / "two", tmp_path / "one")
    assert all(r["nfe_scoring"] <= 4 for r in rows(tmp_path / "one"))


@pytest.mark.slow  # (two launched processes: ~20-27 s on a 2-core CI machine; `pytest -m slow`)
def test_two_processes_match_one_process_on_the_block_model(tmp_path):
    """The block kind: each process decodes its share of the rows with the exact-cache block sampler (the whole
    batch's random draws) and scores them in composite passes along the block trajectory, micro-batched, μ = 2."""
    block = ["model.kind=block", "model.name_or_path=tiny-sudoku-block", "model.block_size=4", "task.answer_mode=full",
             "sampling.steps=8", "estimator.name=trajectory", "estimator.merge=1"]
    overrides = [*COMMON, *block, "eval.after=false", "algorithm=tracerl", "num_iterations=2",
                 "estimator.micro_batch=5"]
    launch(["-m", "dlmrl.cli"], overrides, tmp_path / "two")
    one_process(overrides, tmp_path / "one")
    assert_same_run(tmp_path / "two", tmp_path / "one")
    assert all(r["nfe_scoring"] == 2 for r in rows(tmp_path / "one"))  # (8 steps over 4 blocks: 2 per block)


@pytest.mark.slow  # (two launched processes: ~20-27 s on a 2-core CI machine; `pytest -m slow`)
def test_two_processes_train_the_uniform_kind(tmp_path):
    """model.kind uniform (DiffusionGemma) under accelerate's DDP: each process samples only its share of the
    prompts (with its share's seed, so not a one-process run's draws: no equality to compare with) and scores it
    with the trajectory likelihood in step passes (micro_batch 3, a different number of backward calls per process);
    the gradients are averaged once per update. The run finishes, every row is scored, and the replayed likelihood
    equals each share's record (the gap at float32 tolerance, as test_uniform_kind derives it)."""
    uniform = ["--config", "configs/grpo_sudoku_tiny_uniform.yaml", "eval.before=false", "eval.after=false",
               "train.max_steps=2", "train.prompts_per_step=4", "train.num_generations=4", "train.save_steps=1",
               "estimator.micro_batch=3"]
    launch(["-m", "dlmrl.cli"], uniform, tmp_path / "two")
    records = rows(tmp_path / "two")
    assert [r["rows_scored"] for r in records] == [16, 16]
    assert all(r["rollout_logp_gap_max"] < 1e-3 and r["grad_norm"] > 0 for r in records)
    assert (tmp_path / "two" / "final_model" / "model.safetensors").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("count", "mu"), [(2, 1), (4, 2)])
def test_two_processes_match_one_process_with_several_optimizer_steps_per_batch(count, mu, tmp_path):
    """TraceRL's structure (train.steps_per_generation): 2 mini-batches of 2 groups, each process scoring one group
    of each, weighted by its share of the mini-batch's loss normaliser; or 4 of one group, where the process without
    a row of it runs one row of weight 0, in μ = 2 passes over the same split. The trajectory estimator with its KL
    toward the rollout policy and the truncated-IS weights sliced per mini-batch."""
    overrides = [*COMMON, "eval.after=false", "algorithm=tracerl", f"num_iterations={mu}",
                 f"steps_per_generation={count}", "estimator.micro_batch=5", "rollout_is_cap=2"]
    launch(["-m", "dlmrl.cli"], overrides, tmp_path / "two")
    one_process(overrides, tmp_path / "one")
    assert_same_run(tmp_path / "two", tmp_path / "one")
    assert all(r["kl"] > 0 for r in rows(tmp_path / "one"))  # (from the second optimizer step on, the KL acts)


@pytest.mark.slow  # (two launched processes: ~20-27 s on a 2-core CI machine; `pytest -m slow`)
def test_two_processes_match_one_process_ar_grpo_through_the_console_script(tmp_path):
    """An AR preset with a KL term (GRPO, β 0.04) launched through the ``dlmrl`` script, evaluation after."""
    overrides = [*COMMON, *AR, "algorithm=grpo", "eval.num_puzzles=16"]
    done = launch([str(BIN / "dlmrl")], overrides, tmp_path / "two")
    summary = one_process(overrides, tmp_path / "one")
    assert_same_run(tmp_path / "two", tmp_path / "one")
    assert rows(tmp_path / "two")[-1]["kl"] > 0
    written = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert written["eval_after"] == summary["eval_after"]  # every process evaluates the same model the same way
    assert done.stdout.count("wrote ") == 1  # (the main process reports)


@pytest.mark.slow  # (two launched processes: ~20-27 s on a 2-core CI machine; `pytest -m slow`)
def test_a_batch_that_does_not_split_over_the_processes_fails_before_training(tmp_path):
    cmd = [str(BIN / "accelerate"), "launch", "--cpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
           "-m", "dlmrl.cli", "train", f"output_dir={tmp_path / 'run'}", "prompts_per_step=3"]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "3 prompts do not split over 2 processes" in done.stderr
    assert not (tmp_path / "run").exists()


def test_processes_that_accelerate_did_not_join_are_refused(tmp_path, monkeypatch):
    """torchrun without --cpu on a machine without GPUs: each process would train alone into the same folder."""
    if torch.cuda.is_available():
        pytest.skip("needs a machine without GPUs")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    with pytest.raises(ConfigError, match="2 processes were launched"):
        one_process([*COMMON, "max_steps=1", "prompts_per_step=2"], tmp_path / "run")


@pytest.mark.slow  # (two launched processes: ~20-27 s on a 2-core CI machine; `pytest -m slow`)
def test_an_error_inside_the_processes_is_one_message_not_a_launcher_traceback(tmp_path):
    """A checkpoint folder whose config is readable but whose weights are missing fails in every CPU process: each
    prints its message and the launcher sums up in one line, without torch.distributed's ChildFailedError
    traceback (accelerate's own launcher still reports the failed command); a folder that holds a run is refused
    once, before any process starts."""
    import shutil

    from dlmrl.models.loading import TINY_DEFAULT, resolve_model_path

    broken = tmp_path / "no_weights"
    broken.mkdir()
    shutil.copy(Path(resolve_model_path(TINY_DEFAULT)) / "config.json", broken / "config.json")  # (no weights)
    cmd = [str(BIN / "accelerate"), "launch", "--cpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
           "-m", "dlmrl.cli", "train", f"output_dir={tmp_path / 'run'}", "--no-progress", *COMMON,
           f"model.name_or_path={broken}"]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode != 0
    assert done.stderr.count("cannot be loaded") >= 1 and "CPU process(es) stopped (process" in done.stderr
    assert "exit code 2" in done.stderr and "ChildFailedError" not in done.stderr, done.stderr[-3000:]
    # (accelerate's own traceback cannot be avoided: the process it watches says so once, naming --quiet)
    ours = done.stderr.split("RuntimeError:")[0]  # (before accelerate's launcher repeats the stderr tail)
    assert ours.count("accelerate launch --quiet leaves the traceback out") == 1, ours
    (tmp_path / "held").mkdir()
    (tmp_path / "held" / "config.yaml").write_text("{}\n")
    cmd = [c if not c.startswith("output_dir=") else f"output_dir={tmp_path / 'held'}" for c in cmd[:-1]]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, env=env)
    # (counted on our own lines: accelerate >= 1.16's launcher repeats the child's stderr tail in its own error)
    ours = [line for line in done.stderr.splitlines() if line.startswith("dlmrl train:") and "already holds a run" in line]
    assert done.returncode != 0 and len(ours) == 1, done.stderr[-3000:]
    assert "starting the 2 CPU processes" not in done.stderr


@pytest.mark.slow
def test_ctrl_c_under_accelerate_launch_stops_the_processes_without_a_traceback(tmp_path):
    """Ctrl-C reaches accelerate launch, dlmrl's process and the CPU processes together (one process group): the
    processes save a checkpoint after their step and the run stops with exit code 130 and no traceback (the
    elastic agent printed a SignalException traceback, accelerate's SIGTERM interrupting its shutdown)."""
    import signal
    import time

    out = tmp_path / "run"
    cmd = [str(BIN / "accelerate"), "launch", "--cpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
           "-m", "dlmrl.cli", "train", f"output_dir={out}", "--no-progress", "max_steps=200", "prompts_per_step=2",
           "num_generations=2", "eval.before=false", "eval.after=false", "save_steps=1000"]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        start = time.time()
        while not (out / "metrics.jsonl").exists() and time.time() - start < 240 and proc.poll() is None:
            time.sleep(0.5)
        assert (out / "metrics.jsonl").exists(), "the run did not start"
        os.killpg(proc.pid, signal.SIGINT)  # (what the terminal sends on Ctrl-C)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "Logging error" not in err, err[-3000:]
    assert "the CPU processes were stopped (signal 2)" in err
    assert list((out / "checkpoints").glob("step-*")), "no checkpoint saved"

