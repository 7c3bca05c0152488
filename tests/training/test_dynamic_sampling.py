"""DAPO dynamic sampling with resampling: the loop fills the batch, stops at the round limit, draws fresh
prompts; through the trainer: rounds, counts and NFE logged, the rollout budget, resume equality."""

from __future__ import annotations

import json

import pytest
import torch

from dlmrl.config import Config, ConfigError, apply_overrides, validate
from dlmrl.data.sudoku import SudokuExample
from dlmrl.data.tasks import SudokuTask
from dlmrl.training import trainer
from dlmrl.training.dynamic_sampling import fill_informative_groups, fresh_prompts
from dlmrl.training.rollout import Rollout
from tests.training.test_trainer import params, small_config

G = 2


def fake(rewards: list[list[float]], tag: int, prompt_len: int = 2, nfe: int = 5) -> Rollout:
    """A rollout of ``len(rewards)`` prompts × G rows whose completion holds (tag, prompt, member)."""
    n = len(rewards) * G
    comp = torch.tensor([[tag, i // G, i % G] for i in range(n)])  # (n, 3)
    r = torch.tensor([x for grp in rewards for x in grp], dtype=torch.float32)
    return Rollout([(tag, i // G) for i in range(n)], torch.full((n, prompt_len), 7), torch.ones(n, prompt_len, dtype=torch.bool),
                   comp, torch.ones(n, 3, dtype=torch.bool), nfe, torch.arange(n) // G, rewards=r,
                   train_rewards=r.clone())


def test_resampling_fills_the_batch_in_draw_order_and_trims_the_surplus():
    calls = []

    def more(r):
        calls.append(r)
        # round 1: one flat group, then three informative ones (only two are still needed)
        return fake([[0.5, 0.5], [1.0, 0.0], [0.0, 0.2], [0.3, 0.4]], tag=r, prompt_len=4, nfe=6)

    first = fake([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]], tag=0)
    out, st = fill_informative_groups(first, more, num_groups=3, num_generations=G, max_extra_rounds=3, pad_id=9)
    assert calls == [1]
    assert (st.rounds, st.completions, st.groups_dropped, st.nfe) == (2, 6 + 8, 2 + 1, 5 + 6)
    assert st.passes == 6 * 5 + 8 * 6 and out.passes == st.passes  # rows × NFE of each round
    # kept: round 0's group 1, then round 1's groups 1 and 2 (its group 3 is surplus)
    assert out.completion[:, :2].tolist() == [[0, 1], [0, 1], [1, 1], [1, 1], [1, 2], [1, 2]]
    assert out.rewards.tolist() == [0.0, 1.0, 1.0, 0.0, 0.0, pytest.approx(0.2)]
    assert out.group_ids.tolist() == [0, 0, 1, 1, 2, 2] and out.nfe == 11
    # prompts of different lengths are left-padded with pad_id, masked out
    assert out.prompt_ids.shape == (6, 4) and out.prompt_ids[0].tolist() == [9, 9, 7, 7]
    assert out.prompt_mask[0].tolist() == [False, False, True, True] and out.prompt_mask[2].all()
    assert out.examples == [(0, 1), (0, 1), (1, 1), (1, 1), (1, 2), (1, 2)]
    assert len(st.rewards) == 14  # every sampled completion's reward, for logging


def test_resampling_stops_at_the_round_limit_and_trains_on_what_it_has():
    calls = []

    def more(r):
        calls.append(r)
        return fake([[0.0, 0.0], [0.0, 0.0]], tag=r) if r != 2 else None  # round 2 found no new prompt

    first = fake([[1.0, 0.0], [1.0, 1.0]], tag=0)
    out, st = fill_informative_groups(first, more, num_groups=2, num_generations=G, max_extra_rounds=3, pad_id=0)
    assert calls == [1, 2, 3]
    assert (st.rounds, st.completions, st.groups_dropped, st.nfe, st.passes) == (4, 4 + 4 + 4, 1 + 2 + 2, 15, 60)
    assert len(out) == 2 and out.rewards.tolist() == [1.0, 0.0]
    # 0 extra rounds: drop only
    out, st = fill_informative_groups(first, more, num_groups=2, num_generations=G, max_extra_rounds=0, pad_id=0)
    assert calls == [1, 2, 3] and st.rounds == 1 and len(out) == 2
    # nothing informative at all: an empty batch
    out, st = fill_informative_groups(fake([[1.0, 1.0]], 0), lambda r: None, 1, G, 1, 0)
    assert len(out) == 0 and st.rounds == 2 and st.groups_dropped == 1


class ListTask:
    """train_batch from a fixed pool, like a task with a small train_file."""

    def __init__(self, pool):
        self.pool = pool

    def train_batch(self, n, seed, step):
        import random

        rng = random.Random(f"{seed}-{step}")
        return [rng.choice(self.pool) for _ in range(n)]


def test_fresh_prompts_are_deterministic_new_and_never_repeat_within_the_step():
    from dlmrl.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    task = SudokuTask(tok, tok.mask_token_id)
    main = task.train_batch(8, 0, 5)
    seen = {repr(e) for e in main}
    r1 = fresh_prompts(task, 8, 0, 5, 1, set(seen))
    assert r1 == fresh_prompts(task, 8, 0, 5, 1, set(seen))  # a function of (seed, step, round)
    assert len(r1) == 8 and not {repr(e) for e in r1} & seen
    assert r1 != fresh_prompts(task, 8, 0, 5, 2, set(seen)) and r1 != task.train_batch(8, 0, 6)
    # a pool of 3 examples: only unseen ones come back, then none
    pool = [SudokuExample("0234341221434321", "1234341221434321"), SudokuExample("1034341221434321", "1234341221434321"),
            SudokuExample("1204341221434321", "1234341221434321")]
    seen = {repr(pool[0])}
    got = fresh_prompts(ListTask(pool), 10, 0, 0, 1, seen)
    assert sorted(map(repr, got)) == sorted(map(repr, pool[1:])) and len(seen) == 3
    assert fresh_prompts(ListTask(pool), 10, 0, 0, 2, seen) == []


CELL_REWARDS = SudokuTask.rewards


def half_right(self, examples, texts):
    """Reward 1 when at least half the blanks are right, else 0: many groups of equal rewards (DAPO resamples)."""
    return [float(r >= 0.5) for r in CELL_REWARDS(self, examples, texts)]


def rows(path):
    return [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]


def dapo_config(out, **extra):
    return small_config("tiny-sudoku", out, **{"algorithm": "dapo", "eval.before": False, "eval.after": False,
                                               "num_iterations": 1, "prompts_per_step": 3, **extra})


def test_dapo_resamples_logs_and_resumes_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(SudokuTask, "rewards", half_right)
    full = tmp_path / "full"
    trainer.train(dapo_config(full), progress=False)
    log = rows(full)
    assert max(r["rollout_rounds"] for r in log) > 1, "the shipped model should leave some groups all equal"
    assert all(r["rows_scored"] > 0 for r in log)  # (so the resumed run below has updates to get right)
    for r in log:
        assert r["completions_sampled"] == r["rollout_rounds"] * 3 * 3  # every round samples 3 prompts × G
        assert r["nfe_sampling"] == r["rollout_rounds"] * 4  # 4 denoising steps per round
        assert r["sampling_passes"] == r["rollout_rounds"] * 9 * 4
        assert r["rows_scored"] <= 9
    assert [r["completions_total"] for r in log] == [log[0]["completions_sampled"],
                                                     log[0]["completions_sampled"] + log[1]["completions_sampled"]]
    assert log[1]["nfe_sampling_total"] == log[0]["nfe_sampling"] + log[1]["nfe_sampling"]

    crashed = tmp_path / "crashed"
    original = SudokuTask.train_batch

    def crash_at_step_1(self, n, seed, step):
        if step == 1 and seed < 1000:  # (the main batch of step 1; extra rounds use derived seeds)
            raise RuntimeError("simulated crash")
        return original(self, n, seed, step)

    monkeypatch.setattr(SudokuTask, "train_batch", crash_at_step_1)
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.train(dapo_config(crashed), progress=False)
    monkeypatch.setattr(SudokuTask, "train_batch", original)
    trainer.train(dapo_config(crashed), resume=True, progress=False)
    a, b = params(full), params(crashed)
    for k in a:  # bit for bit: the resumed steps rerun the same code on the same reloaded state
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    keys = ("completions_total", "nfe_sampling_total", "rollout_rounds", "groups_dropped", "reward_mean")
    assert [{k: r[k] for k in keys} for r in rows(crashed)] == [{k: r[k] for k in keys} for r in log]


NO_EVAL = {"eval.before": False, "eval.after": False}


def test_max_completions_stops_at_the_end_of_the_step_that_reaches_it(base, tmp_path):
    out = tmp_path / "run"
    summary = trainer.train(small_config(base, out, max_steps=5, max_completions=7, **NO_EVAL),
                            progress=False)
    # 2 prompts × G 3 = 6 completions per step: the budget of 7 is reached at the end of step 2
    assert [r["completions_total"] for r in rows(out)] == [6, 12]
    assert summary["steps"] == 2 and summary["stop_reason"] == "max_completions"
    assert summary["completions_total"] == 12
    assert (out / "checkpoints" / "step-2").exists()
    # resuming a run whose budget is spent trains no further step
    again = trainer.train(small_config(base, out, max_steps=5, max_completions=7, **NO_EVAL),
                          resume=True, progress=False)
    assert again["steps"] == 2 and len(rows(out)) == 2


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from tests.helpers import save_tiny_checkpoint

    return save_tiny_checkpoint(tmp_path_factory.mktemp("base"))


@pytest.mark.parametrize(("key", "value", "match"), [
    ("max_completions", "-1", "train.max_completions"), ("dynamic_sampling_max_rounds", "-2",
                                                           "train.dynamic_sampling_max_rounds"),
])
def test_rollout_budget_and_rounds_are_validated(key, value, match):
    cfg = Config()
    apply_overrides(cfg, ["algorithm=dapo", f"{key}={value}"])
    with pytest.raises(ConfigError, match=match):
        validate(cfg)


def test_the_round_limit_is_a_preset_part_the_config_overrides():
    from dlmrl.config import build_preset

    cfg = Config()
    apply_overrides(cfg, ["algorithm=dapo"])
    assert build_preset(cfg).dynamic_sampling_max_rounds == 3
    apply_overrides(cfg, ["dynamic_sampling_max_rounds=0"])
    assert build_preset(cfg).dynamic_sampling_max_rounds == 0
