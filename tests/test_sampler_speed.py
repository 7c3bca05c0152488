"""benchmarks/sampler_speed.py and benchmarks/gpu_rollout.py at toy size on the CPU: every mode runs side by side,
the JSON holds what the README table quotes, and the figures are consistent with what the modes do."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TOY = ["--hidden", "32", "--layers", "2", "--heads", "2", "--intermediate", "64", "--vocab", "64", "--gen-length", "32",
       "--block-length", "8", "--prompt-length", "8", "--repeats", "1", "--threads", "1"]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_sampler_speed_runs_every_mode_and_sudoku_accuracy(tmp_path, one_thread):
    out = tmp_path / "speed.json"
    load("sampler_speed").main([*TOY, "--batch", "1", "2", "--puzzles", "16", "--head-scale", "1", "--steps", "32",
                                "--output", str(out)])
    result = json.loads(out.read_text())
    modes = ["plain", "threshold", "prefix", "dual", "threshold+dual"]
    assert [(r["batch"], r["mode"]) for r in result["speed"]] == [(b, m) for b in (1, 2) for m in modes]
    for r in result["speed"]:
        # the JSON rounds seconds to 3 places (±0.5 ms) and tokens/s to 2 (±0.005), from the same unrounded time:
        # the recorded rate lies between the rates of the seconds' rounding interval (the faster the machine, the
        # wider that is relatively; a fixed relative tolerance would fail on a fast one)
        tokens, s = r["batch"] * 32, r["seconds"]
        lowest = tokens / (s + 5e-4) - 0.005
        highest = tokens / (s - 5e-4) + 0.005 if s > 5e-4 else math.inf
        assert lowest <= r["tokens_per_second"] <= highest, r
        # random weights never reach confidence 0.9: the threshold reveals the most confident token per pass, which
        # is the plain schedule at one token per step, token for token
        if r["mode"] == "threshold":
            assert r["nfe_mean"] == 32 and r["tokens_equal_to_plain"] == 1.0
        if r["mode"] == "plain":
            assert r["speedup"] == 1.0 and r["nfe_mean"] == 32
    sudoku = {(r["block_length"], r["mode"]): r for r in result["sudoku"]}
    assert set(sudoku) == {(b, m) for b in (16, 4) for m in modes}
    assert all(0 <= r["cell_accuracy"] <= 1 and r["puzzles"] == 16 for r in sudoku.values())
    assert sudoku[(16, "plain")]["nfe"] == 4 and sudoku[(16, "threshold")]["nfe"] > 1


def test_gpu_rollout_runs_at_toy_size_on_the_cpu(tmp_path, one_thread):
    module = load("gpu_rollout")
    assert module.DEFAULTS["hidden"] == 4096 and module.DEFAULTS["vocab"] == 126464 and module.DEFAULTS["batch"] == [16]
    out = tmp_path / "gpu.json"
    # (float64: the block check compares the cached and uncached greedy tokens exactly, which an argmax within a
    # float32 rounding of a tie could flip on another machine)
    module.main([*TOY, "--device", "cpu", "--dtype", "float32", "--block-dtype", "float64", "--batch", "2",
                 "--output", str(out)])
    result = json.loads(out.read_text())
    assert result["benchmark"] == "gpu_rollout" and result["sudoku"] == []
    assert [r["mode"] for r in result["speed"]] == ["plain", "threshold", "prefix", "dual", "threshold+dual"]
    assert result["settings"]["layers"] == 2 and result["machine"]["gpu"] is None
    # the block kind on the same shape: the exact cache decodes the uncached reference's tokens
    block = json.loads((tmp_path / "gpu_block.json").read_text())
    assert block["settings"]["hidden"] == result["settings"]["hidden"] and block["scoring"] is None
    assert [r["mode"] for r in block["rollouts"]["rows"]] == ["exact cache", "uncached"]
    assert block["rollouts"]["same_tokens"] == 1.0


def test_fast_rollouts_side_by_side_runs_each_variant_and_keeps_earlier_runs(tmp_path, one_thread):
    module = load("fast_rollouts_sudoku")
    out = tmp_path / "fast.json"
    small = ["max_steps=1", "prompts_per_step=2", "num_generations=2", "eval.num_puzzles=8", "save_steps=1"]
    common = ["--runs-dir", str(tmp_path / "runs"), "--output", str(out), *small]
    module.main(["--variants", "plain", "threshold+dual", *common])
    module.main(["--variants", "dual", *common])  # (a later call adds its runs to the file)
    result = json.loads(out.read_text())
    assert [r["variant"] for r in result["runs"]] == ["plain", "dual", "threshold+dual"]
    fast = result["runs"][2]
    assert fast["overrides"][-2:] == ["sampling.threshold=0.9", "sampling.cache=dual"]
    assert 1 <= fast["nfe_sampling_mean"] <= 16 and result["runs"][0]["nfe_sampling_mean"] == 4
    assert {r["variant"] for r in result["table"]} == {"plain", "dual", "threshold+dual"}
