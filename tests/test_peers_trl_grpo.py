"""benchmarks/peers/trl_grpo_step.py without TRL: the argument checks, the clear error naming ``pip install trl``
when TRL is absent, the DAPO budget against dlmrl's own, the prompts and reward TRL is given against dlmrl's task,
and the aggregation of repeats (checked by hand). Nothing here imports TRL or runs a training step."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
import torch

from tests.helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("benchmarks/peers/trl_grpo_step.py")


@pytest.fixture(scope="module")
def tokenizer(bench):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bench.model_path())  # (the shipped asset: local, nothing downloaded)


def test_missing_trl_names_pip_install(bench, monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "trl_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        bench.main(["--steps", "2", "--repeats", "1", "--output", str(tmp_path / "r.json")])
    assert "pip install trl" in str(e.value)
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("argv", [["--steps", "1"], ["--repeats", "0"], ["--threads", "0"], ["--lr", "2"],
                                  ["--preset", "ppo"]])
def test_bad_arguments_refused(bench, argv):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2


def test_preset_settings_match_dlmrl(bench):
    """The completion budget and DAPO's overlong cache TRL gets are the ones dlmrl's AR kind and trainer use."""
    from dlmrl.kinds import kind_of
    from dlmrl.objectives.presets import ALGORITHMS

    for name in ("grpo", "dapo"):
        preset = ALGORITHMS.get(name)()
        s = bench.preset_settings(name)
        assert s["max_completion_length"] == kind_of("ar").generation_budget(16, preset)
        assert s["beta"] == preset.objective.beta and s["loss_type"] == preset.objective.loss_type
        assert s["epsilon"] == preset.objective.epsilon
        assert s["epsilon_high"] == (preset.objective.epsilon_high or preset.objective.epsilon)
        if preset.overlong_cache_fraction is None:
            assert s["overlong_cache"] is None
        else:  # (dlmrl.training.sample_step.shaped_rewards' L_cache)
            assert s["overlong_cache"] == max(1, round(preset.overlong_cache_fraction * s["max_completion_length"]))
    assert bench.preset_settings("dapo")["max_completion_length"] == 22  # ceil(17 / 0.8)


def test_prompts_are_dlmrl_training_prompts(bench, tokenizer):
    from dlmrl.data.tasks import SudokuTask

    _, examples, prompts = bench.sudoku_prompts(tokenizer, seed=3, steps=2)
    own = SudokuTask(tokenizer, tokenizer.mask_token_id, answer_mode="full")
    assert examples == own.train_batch(64, 3, 0) + own.train_batch(64, 3, 1)
    vocab = tokenizer.get_vocab()
    e = examples[70]
    expected = [vocab["[BOS]"]] + [vocab[c] for c in e.puzzle] + [vocab["="]]
    assert tokenizer(text=prompts[70])["input_ids"] == expected


def test_reward_is_dlmrl_reward_on_token_ids(bench, tokenizer):
    """TRL's reward function on the ids up to EOS gives what dlmrl's task gives on its padded completion canvas;
    and, by hand: the solution scores 1, a non-digit token is a wrong cell that shifts nothing, 17 cells score 0."""
    from dlmrl.data.tasks import SudokuTask

    task = SudokuTask(tokenizer, tokenizer.mask_token_id, answer_mode="full")
    ex = task.train_batch(1, 0, 0)[0]
    vocab, eos, pad = tokenizer.get_vocab(), tokenizer.eos_token_id, tokenizer.pad_token_id
    digits = [vocab[c] for c in ex.solution]
    blank = ex.blanks[0]
    wrong = list(digits)
    wrong[blank] = vocab["|"]  # (a separator token: one wrong cell)
    rows = [digits + [eos], wrong + [eos], digits + [digits[0]], digits[:5] + [eos]]  # (TRL's ids, EOS included)
    got = bench.SudokuCellAccuracy(task)([None] * 4, [None] * 4, rows, [ex.puzzle] * 4, [ex.solution] * 4)
    canvas = torch.full((4, 17), pad)
    for i, r in enumerate(rows):
        canvas[i, : len(r)] = torch.tensor(r)
    assert got == task.rewards([ex] * 4, task.decode(canvas))
    n = len(ex.blanks)
    short = sum(1 for b in ex.blanks if b < 5) / n
    assert got == [1.0, (n - 1) / n, 0.0, short]


def _run(seconds, reward, kl):
    return {"seconds_step": seconds, "reward": reward, "kl": kl}


def test_summary_by_hand(bench):
    repeats = []
    for d, t, rd, rt, kd, kt in ((2.0, 4.0, 0.5, 0.4, 0.1, 0.2), (3.0, 3.0, 0.6, 0.5, 0.3, 0.2),
                                 (1.0, 4.0, 0.7, 0.6, 0.2, 0.2)):
        pair = {"dlmrl": _run([9.0, d, d], [rd - 0.1, rd + 0.1], [0.0, kd]),
                "trl": _run([9.0, t, t], [rt, rt], [0.0, kt])}
        for tool in ("dlmrl", "trl"):
            pair[tool]["summary"] = bench.per_run_summary(pair[tool])
        pair["ratio"] = pair["dlmrl"]["summary"]["median_seconds_step"] / pair["trl"]["summary"]["median_seconds_step"]
        repeats.append(pair)
    assert repeats[0]["dlmrl"]["summary"]["median_seconds_step"] == 2.0  # (the 9 s warm-up step left out)
    s = bench.summarize(repeats)
    assert s["median_seconds_step"] == {"dlmrl": 2.0, "trl": 4.0}
    assert s["ratio_dlmrl_over_trl"] == {"min": 0.25, "median": 0.5, "max": 1.0}
    r = s["mean_reward"]
    assert r["dlmrl_mean"] == pytest.approx(0.6) and r["trl_mean"] == pytest.approx(0.5)
    se = math.sqrt(statistics.stdev([0.5, 0.6, 0.7]) ** 2 / 3 * 2)  # (both sides' spread is 0.1)
    assert r["standard_error"] == pytest.approx(se) and r["within_noise"] is (0.1 <= 2 * se)
    k = s["final_kl"]
    assert k["dlmrl_mean"] == pytest.approx(0.2) and k["trl_sd"] == 0.0
    assert k["within_noise"] is True  # (0.0 difference)
    one = bench.summarize(repeats[:1])
    assert one["mean_reward"]["within_noise"] is None  # (no noise estimate from one repeat)
    text = bench.format_summary(s, 3)
    assert "0.25x" in text and "median 0.50x" in text


def test_no_kl_gives_no_verdict(bench):
    a = bench.agreement([None, None], [0.1, 0.2], "trl")
    assert a["within_noise"] is None and a["difference"] is None


def test_the_output_file_follows_the_preset(bench):
    assert bench.parse_args(["--preset", "dapo"]).output.endswith("peers_trl_dapo.json")
    assert bench.parse_args([]).output.endswith("peers_trl_grpo.json")
    assert bench.parse_args(["--output", "x.json"]).output == "x.json"
