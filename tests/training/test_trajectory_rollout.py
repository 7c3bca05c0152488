"""The sampler's trajectory through the trainer: rollouts carry it, rows/cat/anchors keep it, the trainer scores
it (trajectory presets, DAPO's resampling, DaGRPO's anchors), and a trajectory run resumes exactly."""

from __future__ import annotations

import json

import pytest
import torch

from dlmrl.config import Config, ConfigError, apply_overrides, validate
from dlmrl.data.tasks import SudokuTask
from dlmrl.kinds import kind_of
from dlmrl.models.loading import load_policy
from dlmrl.models.sampler import generate, left_to_right_reveal_steps
from dlmrl.training import trainer
from dlmrl.training.anchors import add_anchors
from dlmrl.training.rollout import Rollout, rollout_diffusion
from tests.helpers import crash_then_resume, save_tiny_checkpoint
from tests.training.test_anchors import ALL_WRONG_A, TOK, batch
from tests.training.test_trainer import params, small_config


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("base"))


def test_rollouts_carry_the_samplers_record_through_rows_and_cat(base):
    policy = load_policy(str(base))
    cfg = small_config(base, "unused")
    task = SudokuTask(policy.tokenizer, policy.mask_token_id)
    examples = task.train_batch(2, 0, 0)
    ro = rollout_diffusion(policy, task, cfg, examples, torch.Generator().manual_seed(0))
    enc = task.encode(examples).repeat(3)
    out = generate(policy, enc.prompt_ids, enc.prompt_mask, gen_length=16, block_length=16, steps=4,
                   temperature=1.0, canvas=enc.canvas, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ro.reveal_step, out.reveal_step) and torch.equal(ro.completion, out.canvas)
    assert ((ro.reveal_step >= 0) == ro.completion_mask).all()
    picked = ro.rows(torch.tensor([4, 1]))
    assert torch.equal(picked.reveal_step, ro.reveal_step[[4, 1]])
    both = Rollout.cat([ro, picked], 0)
    assert torch.equal(both.reveal_step, torch.cat([ro.reveal_step, picked.reveal_step]))
    bare = Rollout(ro.examples, ro.prompt_ids, ro.prompt_mask, ro.completion, ro.completion_mask, ro.nfe, ro.group_ids)
    with pytest.raises(ValueError, match="reveal_step is set on some parts only"):
        Rollout.cat([ro, bare], 0)


def test_an_anchor_row_gets_the_left_to_right_order_in_the_samplers_schedule():
    task = SudokuTask(TOK, TOK.mask_token_id)
    ro = batch(task, "diffusion", [ALL_WRONG_A, ALL_WRONG_A, "1234341221434331", "1214341221434331"])
    ro.reveal_step = torch.where(ro.completion_mask, 0, -1)  # (a record: every blank at step 0)
    schedule = lambda m: left_to_right_reveal_steps(m, 16, 4)
    out, n = add_anchors(ro, task, 0.0, kind_of("diffusion"), TOK.eos_token_id, TOK.pad_token_id, lambda r, _: r, schedule)
    assert n == 1
    # EX_A's 5 blanks (0, 1, 5, 10, 15) over 4 steps: 2, 1, 1, 1, left to right
    assert out.reveal_step[-1].tolist() == [0, 0, -1, -1, -1, 1, -1, -1, -1, -1, 2, -1, -1, -1, -1, 3]
    assert torch.equal(out.reveal_step[:4], ro.reveal_step)
    with pytest.raises(ValueError, match="pass reveal_steps"):
        add_anchors(ro, task, 0.0, kind_of("diffusion"), TOK.eos_token_id, TOK.pad_token_id, lambda r, _: r)


@pytest.mark.parametrize(("algorithm", "extra"), [
    ("gdpo", {"estimator.name": "trajectory", "estimator.merge": 2}),
    ("dapo", {"estimator.name": "trajectory"}),  # dynamic sampling: resampled rounds keep their records
    ("dagrpo", {"estimator.name": "trajectory", "train.seed": 3}),  # anchors scored along their own order
    ("grpo", {"estimator.name": "trajectory", "estimator.order": "left_to_right"}),
])
def test_trajectory_scoring_runs_with_every_rollout_side_part(algorithm, extra, base, tmp_path):
    cfg = small_config(base, tmp_path, algorithm=algorithm, **{"eval.before": False, "eval.after": False}, **extra)
    trainer.train(cfg, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["loss"] is not None for r in rows)
    nfe = [r["nfe_scoring"] for r in rows]
    if extra.get("estimator.order") == "left_to_right":
        assert all(5 <= x <= 10 for x in nfe)  # one canvas per blank (6-10, fewer rows kept)
    else:
        assert all(x <= 4 / extra.get("estimator.merge", 1) for x in nfe)  # at most ceil(4 steps / merge)


def test_a_trajectory_run_resumes_exactly(tmp_path, monkeypatch):
    kw = {"algorithm": "tracerl", "num_iterations": 2, "eval.before": False, "eval.after": False}
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    trainer.train(small_config("tiny-sudoku", full, **kw), progress=False)
    crash_then_resume(monkeypatch, lambda resume: trainer.train(small_config("tiny-sudoku", crashed, **kw),
                                                                resume=resume, progress=False), 1)
    a, b = params(full), params(crashed)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)


def test_trajectory_with_guidance_is_refused():
    cfg = Config()
    apply_overrides(cfg, ["estimator.name=trajectory", "sampling.cfg_scale=1.0"])
    with pytest.raises(ConfigError, match="sampling.cfg_scale"):
        validate(cfg)
