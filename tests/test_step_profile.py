"""benchmarks/step_profile.py at toy size: the three jobs run, the recorded model calls are the passes the step
needs (counted from the configs: the sampler's steps, the AR decoding, one reference pass and no separate
old-score pass for grpo, one scoring pass with grad), and the table adds up."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from tests.tolerances import rounding_tol

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark():
    spec = importlib.util.spec_from_file_location("step_profile", ROOT / "benchmarks" / "step_profile.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("profile")
    out = tmp / "profile.json"
    threads = torch.get_num_threads()
    try:  # (one thread: a toy step is too small to share, and a busy machine makes a second one wait)
        load_benchmark().main(["--steps", "1", "--warmup", "1", "--prompts", "2", "--generations", "2",
                               "--repeats", "1", "--threads", "1", "--runs-dir", str(tmp / "runs"), "--output", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert json.loads(out.read_text())["jobs"].keys() == {"default", "grpo_ar", "block"}
    return json.loads(out.read_text())


def test_the_default_job_records_the_sampler_steps_and_one_scoring_pass(result):
    job = result["jobs"]["default"]
    assert job["settings"]["sampling"]["steps"] == 4 and job["settings"]["estimator"]["micro_batch"] == 0
    (step,) = job["steps"]
    calls = step["calls"]
    sampling = [c for c in calls if c["phase"] == "sampling"]
    prompt_plus_canvas = sampling[0]["input"][1]
    assert len(sampling) == 4  # one full-canvas pass per denoising step (block 16 = gen_length)
    assert all(c["input"] == [4, prompt_plus_canvas] and not c["grad"] for c in sampling)
    (grad,) = [c for c in calls if c["grad"]]  # trajectory likelihood: nfe_scoring canvases per row, one call
    assert grad["phase"] == "grad" and grad["input"] == [round(step["rows_scored"] * step["nfe_scoring"]),
                                                         prompt_plus_canvas]
    assert len(calls) == 5 and all(c["model"] == "policy" for c in calls)  # gdpo: β 0, μ 1: nothing else


def test_the_block_job_records_the_cached_block_steps_and_one_composite_scoring_pass(result):
    job = result["jobs"]["block"]
    assert job["settings"]["model"]["block_size"] == 4 and job["settings"]["sampling"]["steps"] == 16
    (step,) = job["steps"]
    calls = step["calls"]
    sampling = [c for c in calls if c["phase"] == "sampling"]
    prompt = sampling[0]["input"]
    # the prompt once, then 4 steps per block feeding the block alone against the cache, and one cache pass per
    # finished block but the last
    assert prompt[0] == 4 and len(sampling) == 1 + 16 + 3
    assert all(c["input"] == [4, 4] and not c["grad"] for c in sampling[1:])
    (grad,) = [c for c in calls if c["grad"]]  # the block trajectory: 4 composite canvases per row, one call
    assert grad["input"] == [round(step["rows_scored"] * step["nfe_scoring"]), prompt[1] + 2 * 16]
    assert step["nfe_scoring"] == 4


def test_the_ar_grpo_job_records_decoding_the_reference_and_no_old_score_pass(result):
    job = result["jobs"]["grpo_ar"]
    (step,) = job["steps"]
    calls = step["calls"]
    sampling = [c for c in calls if c["phase"] == "sampling"]
    prompt = sampling[0]["input"][1]
    assert sampling[0]["cache"] == 0 and sampling[0]["input"] == [4, prompt]  # prefill
    assert [c["cache"] for c in sampling[1:]] == list(range(prompt, prompt + len(sampling) - 1))
    assert all(c["input"] == [4, 1] for c in sampling[1:]) and len(sampling) <= 17  # gen_length + EOS
    width = prompt + 17
    assert [(c["model"], c["grad"], c["input"]) for c in calls if c["phase"] != "sampling"] == [
        ("reference", False, [4, width]), ("policy", True, [step["rows_scored"], width])]


@pytest.mark.parametrize("job", ["default", "grpo_ar"])
def test_the_table_adds_up(result, job):
    table, (step,) = result["jobs"][job]["table"], result["jobs"][job]["steps"]
    phases = ("sampling", "old_ref", "grad", "optimizer", "other")
    # float64 bookkeeping, not rounded in the JSON: "other" is the step minus the phases, so the five sum back
    # to the step within a few roundings of its size (≤ 2 per term: 10), the raw total is a sum of the same few
    # numbers, the ratio one division more: 16 ulps relative
    tol = rounding_tol(scale=1, n=16, dtype=torch.float64)
    assert sum(table[k]["seconds"] for k in phases) == pytest.approx(step["seconds_step"], rel=tol)
    assert table["step"]["raw_seconds"] == pytest.approx(sum(step["raw"].values()), rel=tol)
    assert table["step"]["ratio"] == pytest.approx(step["seconds_step"] / table["step"]["raw_seconds"], rel=tol)
    assert table["sampling"]["raw_seconds"] > 0 and table["grad"]["raw_seconds"] > 0
    assert table["optimizer"]["raw_seconds"] == 0 and table["loop"]["seconds"] is None  # (no step after it)


def test_a_block_cached_sampler_is_replayed_with_its_own_caches(tmp_path):
    # the dual cache builds a key/value cache per pass (not a continuing one, as AR decoding does): the replay
    # rebuilds each from the recorded tensors, so the step's passes replay with their recorded cache lengths
    out = tmp_path / "cached.json"
    threads = torch.get_num_threads()
    try:
        load_benchmark().main(["--jobs", "default", "--steps", "1", "--warmup", "0", "--prompts", "2",
                               "--generations", "2", "--repeats", "1", "--threads", "1", "--runs-dir",
                               str(tmp_path / "runs"), "--output", str(out), "sampling.cache=dual",
                               "sampling.block_length=8", "sampling.steps=4"])
    finally:
        torch.set_num_threads(threads)
    (step,) = json.loads(out.read_text())["jobs"]["default"]["steps"]
    sampling = [c for c in step["calls"] if c["phase"] == "sampling"]
    # 2 blocks x 2 steps: each block's first pass over the whole sequence, its second over the block alone
    assert [c["cache"] for c in sampling] == [None, sampling[0]["input"][1] - 8] * 2  # (first: no cache given)
    assert [c["input"][1] for c in sampling[1::2]] == [8, 8]
    assert step["raw"]["sampling"] > 0
