"""Rollouts that scale: ``sampling.rollout_batch_size`` samples a process's rows in several calls with the same
completions, records and random state as one call (diffusion, block and AR kinds, multi-turn episodes), and
``sampling.stop_at_eos`` ends rows at the block holding their EOS (the block kind's default) with fewer passes."""

from __future__ import annotations

import pytest
import torch

from dlmrl.config import Config, ConfigError, apply_overrides, validate
from dlmrl.data.task import TaskBatch
from dlmrl.data.tasks import SudokuTask
from dlmrl.training.rollout import rollout_ar, rollout_diffusion, sampling_calls, stops_at_eos
from tests.models.test_stop_at_eos import LENGTHS, EosPolicy, eos_forward
from tests.tolerances import SHIPPED_TERMS, forward_tol, rounding_tol


def config(*overrides: str) -> Config:
    cfg = Config()
    apply_overrides(cfg, ["prompts_per_step=3", "num_generations=3", *overrides])
    return cfg


# (float64 models: a call of fewer rows runs its rows in another batch shape, whose logits may round otherwise;
# float64 keeps every draw and threshold decision away from a rounding-level tie)
@pytest.fixture(scope="module")
def diffusion():
    from dlmrl.models.loading import load_policy

    return load_policy(dtype="float64")


@pytest.fixture(scope="module")
def block():
    from dlmrl.models.loading import load_block_policy

    return load_block_policy("tiny-sudoku-block", dtype="float64")


@pytest.fixture(scope="module")
def ar():
    from dlmrl.models.ar import load_ar_policy

    return load_ar_policy("tiny-sudoku-ar", dtype="float64")


def test_sampling_calls_cover_the_rows_in_order():
    assert sampling_calls(0, 9, 0) == [(0, 9)]
    assert sampling_calls(0, 9, 4) == [(0, 4), (4, 8), (8, 9)]
    assert sampling_calls(3, 9, 4) == [(3, 7), (7, 9)]
    assert sampling_calls(3, 9, 6) == [(3, 9)] and sampling_calls(2, 2, 4) == []


def same_diffusion_rows(a, b):
    """Completions, masks and the sampler's records equal; log-probs within a float32 rounding of float64 values
    that may differ by a batch shape's rounding (≤ forward_tol; |log p| ≤ 16 here)."""
    assert torch.equal(a.completion, b.completion) and torch.equal(a.completion_mask, b.completion_mask)
    assert torch.equal(a.reveal_step, b.reveal_step) and torch.equal(a.row_nfe, b.row_nfe)
    assert b.token_logprobs.abs().max() <= 16
    tol = rounding_tol(scale=16, n=1) + forward_tol(scale=16, terms=SHIPPED_TERMS)
    torch.testing.assert_close(a.token_logprobs, b.token_logprobs, atol=tol, rtol=0)


@pytest.mark.parametrize(("kind", "overrides"), [
    ("diffusion", []),
    ("diffusion", ["sampling.remasking=random", "sampling.block_length=8"]),
    ("diffusion", ["sampling.threshold=0.6"]),
    ("block", ["sampling.steps=16"]),
    ("block", ["sampling.steps=16", "sampling.threshold=0.6"]),
    ("ar", []),
])
@pytest.mark.parametrize("size", [2, 4])
def test_a_rollout_in_several_calls_is_the_one_call_rollout(kind, overrides, size, diffusion, block, ar):
    policy = {"diffusion": diffusion, "block": block, "ar": ar}[kind]
    mode = [] if kind == "diffusion" else ["task.answer_mode=full"]
    task = SudokuTask(policy.tokenizer, policy.tokenizer.mask_token_id or 0,
                      answer_mode="infill" if kind == "diffusion" else "full")
    examples = task.train_batch(3, 0, 0)

    def sample(rows_per_call, prompts=None):
        cfg = config(*mode, *overrides, f"sampling.rollout_batch_size={rows_per_call}")
        gen = torch.Generator().manual_seed(4)
        if kind == "ar":
            ro = rollout_ar(policy, task, cfg, examples, gen, prompts=prompts)
        else:
            ro = rollout_diffusion(policy, task, cfg, examples, gen, prompts=prompts)
        return ro, torch.rand(3, generator=gen)

    (one, after), (split, split_after) = sample(0), sample(size)
    assert torch.equal(split_after, after)  # (the step's generator ends where one call leaves it)
    assert split.nfe == one.nfe
    if kind == "ar":
        assert torch.equal(split.completion, one.completion)
        assert torch.equal(split.completion_mask, one.completion_mask)
        assert split.sampling_passes() <= one.sampling_passes()  # (each call ends when its own rows have)
        return
    same_diffusion_rows(split, one)
    assert split.sampling_passes() == one.sampling_passes()
    # a process's share of prompts 1-2 in calls of `size` rows: the whole batch's rows 3-8
    share, _ = sample(size, prompts=(1, 3))
    same_diffusion_rows(share, one.rows(torch.arange(3, 9)))


def test_episodes_in_several_calls_are_the_one_call_episodes(ar):
    from dlmrl.envs import make_env
    from dlmrl.training.episodes import rollout_episodes

    task = SudokuTask(ar.tokenizer, ar.tokenizer.mask_token_id or 0, answer_mode="full")
    examples = task.train_batch(2, 0, 0)

    def play(rows_per_call):
        gen = torch.Generator().manual_seed(2)
        ro = rollout_episodes(ar, task, lambda: make_env("sudoku_retry", task, 2), examples, 2, gen, 17,
                              rows_per_call=rows_per_call)
        return ro, torch.rand(2, generator=gen)

    (one, after), (split, split_after) = play(0), play(2)
    assert torch.equal(split.completion, one.completion) and torch.equal(split.completion_mask, one.completion_mask)
    assert torch.equal(split.trajectory_ids, one.trajectory_ids) and torch.equal(split.rewards, one.rewards)
    assert split.nfe == one.nfe and split.sampling_passes() <= one.sampling_passes()
    assert torch.equal(split_after, after)


# -- early stop at EOS through the rollout --------------------------------------------------------------------


class EosTask:
    """Four prompts of :data:`~tests.models.test_stop_at_eos.LENGTHS` real tokens (examples are their indices) and
    a 16-token canvas, all of it written; decodes to the tokens up to the first EOS."""

    gen_length = 16

    def __init__(self, policy):
        from tests.models.block_helpers import padded_prompts

        self.ids, self.mask = padded_prompts(policy, LENGTHS, seed=3)
        self.mask_id, self.eos = policy.mask_token_id, policy.eos_token_id

    def encode(self, examples, device="cpu"):
        i = torch.tensor(examples)
        canvas = torch.full((len(examples), self.gen_length), self.mask_id)
        return TaskBatch(list(examples), self.ids[i].to(device), self.mask[i].to(device), canvas.to(device),
                         torch.ones_like(canvas, dtype=torch.bool).to(device))


@pytest.fixture(scope="module")
def eos_block():
    from dlmrl.models.block_policy import block_policy_from
    from tests.models.block_helpers import tiny_block_policy

    base = tiny_block_policy(seed=2)
    base.model.double()
    return block_policy_from(base, 4, forward=eos_forward(base.eos_token_id))


@pytest.mark.parametrize("threshold", [None, 0.5])
def test_a_block_rollout_stops_at_eos_by_default_and_trains_on_no_later_block(eos_block, threshold):
    task = EosTask(eos_block)
    extra = [] if threshold is None else [f"sampling.threshold={threshold}"]

    def sample(*overrides):
        cfg = config("model.kind=block", "sampling.gen_length=16", "sampling.steps=8", *extra, *overrides)
        cfg.train.prompts_per_step, cfg.train.num_generations = 4, 2
        return rollout_diffusion(eos_block, task, cfg, [0, 1, 2, 3], torch.Generator().manual_seed(3))

    stopped, full = sample(), sample("sampling.stop_at_eos=false")
    assert full.completion_mask.all() and (full.row_nfe > 0).all()
    ends = torch.tensor([8, 8, 4, 8]).repeat_interleave(2)  # (EOS at canvas positions 4, 6, 2, 5: blocks 1, 1, 0, 1)
    inside = torch.arange(16)[None, :] < ends[:, None]  # (B, L)
    assert torch.equal(stopped.completion_mask, inside)  # (the blocks after a row's EOS block are no completion)
    assert torch.equal(stopped.completion[inside], full.completion[inside])
    assert torch.equal(stopped.reveal_step[inside], full.reveal_step[inside])
    assert torch.equal(stopped.token_logprobs[inside], full.token_logprobs[inside])
    assert (stopped.completion[~inside] == eos_block.eos_token_id).all() and (stopped.reveal_step[~inside] < 0).all()
    assert stopped.nfe < full.nfe and stopped.sampling_passes() < full.sampling_passes()
    # rows 4-5 (the prompt whose EOS is in block 0) in a call of their own stop after one block
    split = sample("sampling.rollout_batch_size=2")
    assert torch.equal(split.completion, stopped.completion) and torch.equal(split.completion_mask, inside)
    if threshold is None:
        assert split.row_nfe[4:6].tolist() == [stopped.row_nfe[0] // 2] * 2
        assert split.sampling_passes() < stopped.sampling_passes()
    else:  # (an ended row leaves the pass whatever it is sampled with: the counts are the rows' own)
        assert torch.equal(split.row_nfe, stopped.row_nfe)


def test_the_full_diffusion_rollout_stops_only_when_asked(eos_block):
    from tests.models.block_helpers import tiny_block_policy

    base = tiny_block_policy(seed=2)
    policy = EosPolicy(base)
    policy.device, policy.eos_token_id = torch.device("cpu"), base.eos_token_id
    task = EosTask(base)

    def sample(*overrides):
        cfg = config("sampling.gen_length=16", "sampling.block_length=4", "sampling.steps=8",
                     "sampling.temperature=0", *overrides)
        cfg.train.prompts_per_step, cfg.train.num_generations = 4, 1
        return rollout_diffusion(policy, task, cfg, [0, 1, 2, 3], torch.Generator().manual_seed(3))

    default, stopped = sample(), sample("sampling.stop_at_eos=true")
    assert default.completion_mask.all() and default.nfe == 8
    inside = torch.arange(16)[None, :] < torch.tensor([8, 8, 4, 8])[:, None]
    assert torch.equal(stopped.completion_mask, inside)
    assert torch.equal(stopped.completion[inside], default.completion[inside]) and stopped.nfe == 4


def test_which_rollouts_stop_at_eos(eos_block, diffusion, ar):
    assert stops_at_eos(config(), eos_block) and not stops_at_eos(config(), diffusion)
    assert stops_at_eos(config("sampling.stop_at_eos=true"), diffusion)
    assert not stops_at_eos(config("sampling.stop_at_eos=false"), eos_block)

    class NoEos:
        eos_token_id = None

        def sample_blocks(self):
            pass

    assert not stops_at_eos(config(), NoEos())  # (nothing to stop at: the whole canvas, as before)
    with pytest.raises(ConfigError, match="sampling.stop_at_eos.*no EOS"):
        stops_at_eos(config("sampling.stop_at_eos=true"), NoEos())


@pytest.mark.parametrize(("overrides", "key", "message"), [
    (["sampling.rollout_batch_size=-1"], "sampling.rollout_batch_size", "must be an integer >= 0"),
    (["model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "task.answer_mode=full", "algorithm=grpo",
      "sampling.stop_at_eos=false"],
     "sampling.stop_at_eos", "always ends a completion at EOS"),
])
def test_bad_rollout_settings_are_refused_naming_the_key(overrides, key, message):
    with pytest.raises(ConfigError, match=f"{key}.*{message}"):
        validate(config(*overrides))


@pytest.mark.parametrize(("setting", "key"), [("sampling.rollout_batch_size=2", "sampling.rollout_batch_size"),
                                              ("sampling.stop_at_eos=true", "sampling.stop_at_eos")])
def test_the_tool_loop_refuses_the_rollout_settings_it_does_not_apply(tmp_path, setting, key):
    from tests.training.test_multihop_train import config as multihop_config
    from tests.training.test_tool_loop import TOOL_LOOP

    with pytest.raises(ConfigError, match=f"{key}.*tools inside the rollout"):
        multihop_config("configs/mtr_multihop_tiny_ar.yaml", "tiny-multihop-ar", tmp_path, **TOOL_LOOP,
                        **dict([setting.split("=")]), **{"train.algorithm": "grpo"})


# -- the plan (--dry-run) ------------------------------------------------------------------------------------


def test_the_plan_gives_one_process_figures(tmp_path, monkeypatch):
    """Under 2 processes each samples and scores half of the batch: the plan's rollout rows, sampling calls and
    scoring canvases are one process's (the scoring canvases were the whole batch's)."""
    from dlmrl.config import default_job_config
    from dlmrl.training import distributed
    from dlmrl.training.plan import build_plan

    def plan(processes, *overrides):
        monkeypatch.setattr(distributed, "requested_cpu_processes", lambda: processes)
        cfg = default_job_config([f"output_dir={tmp_path / 'run'}", *overrides])
        return build_plan(cfg, spec=validate(cfg)), cfg

    one, cfg = plan(1)
    two, _ = plan(2, "sampling.rollout_batch_size=48")
    rows = cfg.train.prompts_per_step * cfg.train.num_generations
    assert one["sizes"]["rollout"]["rows_per_process"] == rows and one["sizes"]["rollout"]["sampling_calls_per_process"] == 1
    assert two["sizes"]["rollout"] == {"rows_per_process": rows // 2, "rows_per_sampling_call": 48,
                                       "sampling_calls_per_process": -(-rows // 2 // 48), "rollout_batch_size": 48}
    assert two["sizes"]["scoring_canvases_per_update"] * 2 == one["sizes"]["scoring_canvases_per_update"]
    assert two["sizes"]["completions_per_step"] == one["sizes"]["completions_per_step"] == rows
    assert one["sampler"]["stop_at_eos"].startswith("off")
    block, _ = plan(1, "model.kind=block", "model.name_or_path=tiny-sudoku-block", "task.answer_mode=full",
                    "sampling.steps=16")
    assert "first EOS" in block["sampler"]["stop_at_eos"] and "kind's default" in block["sampler"]["stop_at_eos"]
    assert block["sampler"]["nfe_per_completion"].startswith("at most 16")
