"""DaGRPO's off-policy anchors: rows built by hand-checkable rules for both policy kinds, their loss and
gradient weight through the trainer's loss function, and trainer runs where every group gets one."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dlmrl.data.sudoku import SudokuExample
from dlmrl.data.tasks import SudokuTask
from dlmrl.kinds import kind_of
from dlmrl.models.tokenizer import build_char_tokenizer
from dlmrl.objectives.advantage_registry import AdvantageInputs
from dlmrl.objectives.pairwise import ngram_jaccard
from dlmrl.objectives.presets import get_algorithm
from dlmrl.training import trainer, update
from dlmrl.training.anchors import add_anchors
from dlmrl.training.rollout import Rollout
from tests.objectives.util import F32_RTOL
from tests.training.test_trainer import small_config

TOK = build_char_tokenizer()
SOLUTION = "1234341221434321"
EX_A = SudokuExample("0034301221034320", SOLUTION)  # blanks 0, 1, 5, 10, 15
EX_B = SudokuExample("1204341221434301", SOLUTION)  # blanks 2, 14


def ids(text: str) -> list[int]:
    return TOK.convert_tokens_to_ids(list(text))


def batch(task, kind: str, answers: list[str]) -> Rollout:
    """Two prompts (EX_A, EX_B) × G = 2 rows with the given answers, rewarded by the task."""
    examples = [EX_A, EX_A, EX_B, EX_B]
    enc = task.encode(examples)
    if kind == "ar":
        L = 17
        comp = torch.tensor([ids(a) + [TOK.eos_token_id] + [TOK.pad_token_id] * (L - len(a) - 1) for a in answers])
        mask = torch.arange(L)[None, :] <= torch.tensor([len(a) for a in answers])[:, None]
    else:
        comp = torch.where(enc.completion_mask, torch.tensor([ids(a) for a in answers]), enc.canvas)
        mask = enc.completion_mask
    r = torch.tensor(task.rewards(examples, task.decode(comp)), dtype=torch.float32)
    return Rollout(examples, enc.prompt_ids, enc.prompt_mask, comp, mask, nfe=4, group_ids=torch.arange(len(r)) // 2,
                   rewards=r, train_rewards=r - 0.5)


WRONG_A = "4434341221434321"  # cells 0 and 1 wrong, 5, 10, 15 right (reward 0.6 on EX_A)
ALL_WRONG_A = "2134321221334324"  # every blank of EX_A wrong (0, 1, 5, 10, 15)


@pytest.mark.parametrize("kind", ["ar", "diffusion"])
def test_a_group_with_no_reward_above_the_threshold_gets_its_solution_as_an_anchor(kind):
    task = SudokuTask(TOK, TOK.mask_token_id, answer_mode="full" if kind == "ar" else "infill")
    # group 0 (EX_A): rewards 0 and 0 -> anchor; group 1 (EX_B): one cell of two right (0.5) -> none
    ro = batch(task, kind, [ALL_WRONG_A, ALL_WRONG_A, "1234341221434331", "1214341221434331"])
    assert ro.rewards.tolist() == [0.0, 0.0, 0.5, 0.0]
    out, n = add_anchors(ro, task, 0.0, kind_of(kind), TOK.eos_token_id, TOK.pad_token_id, lambda r, lengths: r * 10 + lengths)
    assert n == 1 and len(out) == 5
    assert out.anchor.tolist() == [False] * 4 + [True]
    assert out.group_ids.tolist() == [0, 0, 1, 1, 0] and out.trajectory_ids.tolist() == [0, 1, 2, 3, 4]
    assert out.examples[4] is EX_A and torch.equal(out.prompt_ids[4], ro.prompt_ids[0])
    if kind == "ar":  # the solution's 16 tokens, then EOS; all 17 scored
        assert out.completion[4].tolist() == ids(SOLUTION) + [TOK.eos_token_id]
        assert out.completion_mask[4].all()
        length = 17
    else:  # the solution on the canvas; only EX_A's blanks are scored
        assert out.completion[4].tolist() == ids(SOLUTION)
        assert torch.nonzero(out.completion_mask[4]).squeeze(-1).tolist() == [0, 1, 5, 10, 15]
        length = 5
    assert out.rewards.tolist() == [0.0, 0.0, 0.5, 0.0, 1.0]  # scored by the task reward
    assert out.train_rewards[4].item() == 10.0 + length and torch.equal(out.train_rewards[:4], ro.train_rewards)
    # a threshold every group clears: no anchor, the rollout unchanged
    same, n = add_anchors(ro, task, -1.0, kind_of(kind), TOK.eos_token_id, TOK.pad_token_id, lambda r, lengths: r)
    assert n == 0 and same is ro


def test_a_short_reference_is_followed_by_eos_and_a_long_one_is_left_out_with_a_warning():
    task = SudokuTask(TOK, TOK.mask_token_id, answer_mode="full")
    ro = batch(task, "ar", [ALL_WRONG_A] * 4)
    short = Rollout(ro.examples, ro.prompt_ids, ro.prompt_mask, ro.completion[:, :10], ro.completion_mask[:, :10], 4,
                    ro.group_ids,
                    rewards=ro.rewards, train_rewards=ro.train_rewards)
    with pytest.warns(UserWarning, match="1 reference solution"):  # (EX_B's group has 0.5: no anchor)
        same, n = add_anchors(short, task, 0.0, kind_of("ar"), TOK.eos_token_id, 0, lambda r, n: r)
    assert n == 0 and same is short

    class ShortReference(SudokuTask):
        def sft_answer(self, example):
            return "12"

    task = ShortReference(TOK, TOK.mask_token_id, answer_mode="infill")
    ro = batch(task, "diffusion", [ALL_WRONG_A] * 4)
    out, n = add_anchors(ro, task, 0.0, kind_of("diffusion"), TOK.eos_token_id, 0, lambda r, n: r)
    # "12" then EOS laid on the canvas; EX_A's blanks 0, 1, 5, 10, 15 take it, the givens stay
    eos = TOK.eos_token_id
    expected = ids("0034301221034320")
    for pos, tok in zip([0, 1, 5, 10, 15], ids("12") + [eos] * 3):
        expected[pos] = tok
    assert n == 1 and out.completion[4].tolist() == expected
    assert torch.equal(out.completion_mask[4], ro.completion_mask[0])


def test_the_anchor_row_counts_with_weight_0_1_and_is_never_clipped():
    """A DaGRPO group of two identical failures plus the anchor, through group_loss_fn (grpo loss)."""
    preset = get_algorithm("dagrpo")
    comp = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [9, 9, 9, 9]])
    mask = torch.tensor([[True, True, True, True], [True, True, True, True], [True, True, False, False]])
    groups, anchor = torch.tensor([0, 0, 0]), torch.tensor([False, False, True])
    rewards = torch.tensor([0.0, 0.0, 1.0])
    sim = ngram_jaccard(comp, mask, groups)
    assert sim[0, 1] == 1.0 and sim[0, 2] == 0.0
    adv = preset.advantages(AdvantageInputs(rewards, 2, group_ids=groups, similarity=sim))
    # the failures are identical (d = 0 < τ): each pairs with the anchor only; std = sqrt(1/3)
    s = math.sqrt(1 / 3) + 1e-4
    torch.testing.assert_close(adv, torch.tensor([-1 / s, -1 / s, 1 / s]))

    logp = torch.full((3, 4), -1.0, requires_grad=True)
    loss_fn = update.group_loss_fn(preset.objective, None, adv, mask, 1.0, group_ids=groups, anchor=anchor)
    loss, _ = loss_fn(logp)
    # grpo: mean over the 3 sequences of the token mean of -w·r·A, r = 1; w = 0.1 on the anchor
    assert loss.item() == pytest.approx((1 / s + 1 / s - 0.1 / s) / 3, rel=F32_RTOL)  # (float32 hand check)
    loss.backward()
    hand = torch.tensor([[1 / s / 4] * 4, [1 / s / 4] * 4, [-0.1 / s / 2] * 2 + [0.0, 0.0]]) / 3
    torch.testing.assert_close(logp.grad, hand)

    # a later μ update whose old log-probs are far off: the failures' ratios clip (no gradient), the
    # anchor's ratio stays π/sg[π] = 1 and keeps its 0.1-weighted gradient
    logp = torch.full((3, 4), -3.0, requires_grad=True)
    old = torch.tensor([[-1.0] * 4, [-1.0] * 4, [-9.0] * 4])  # failures: r = e^-2 < 1 - ε with A < 0
    loss, _ = update.group_loss_fn(preset.objective, old, adv, mask, 1.0, group_ids=groups, anchor=anchor)(logp)
    loss.backward()
    assert logp.grad[:2].abs().max() == 0
    torch.testing.assert_close(logp.grad[2], hand[2])


def exact_only(self, examples, texts):
    """Reward 1 for the solved grid only: the tiny random model never solves, so every group gets an anchor."""
    return [float(t[:16] == e.solution) for e, t in zip(examples, texts)]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from tests.helpers import save_tiny_checkpoint

    return save_tiny_checkpoint(tmp_path_factory.mktemp("base"))


def test_trainer_adds_an_anchor_to_every_failed_group_and_trains_on_groups_of_g_plus_one(base, tmp_path, monkeypatch):
    monkeypatch.setattr(SudokuTask, "rewards", exact_only)
    seen = []
    original = update.group_loss_fn

    def spy(objective, old, advantages, mask, row_weight=1.0, **inputs):
        seen.append((inputs["group_ids"].clone(), inputs["anchor"].clone(), advantages.clone()))
        return original(objective, old, advantages, mask, row_weight, **inputs)

    monkeypatch.setattr(update, "group_loss_fn", spy)
    trainer.train(small_config(base, tmp_path, algorithm="dagrpo", num_iterations=1,
                                             **{"eval.before": False, "eval.after": False}),
                  progress=False)
    log = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["anchors"] for r in log] == [2, 2]  # 2 prompts per step, none solved
    assert [r["rows_scored"] for r in log] == [8, 8]  # groups of G + 1 = 4
    assert [r["completions_sampled"] for r in log] == [6, 6] and log[1]["completions_total"] == 12  # anchors not
    for groups, anchor, adv in seen:
        assert groups.tolist() == [0, 0, 0, 1, 1, 1, 0, 1] and anchor.tolist() == [False] * 6 + [True, True]
        assert (adv[anchor] > 0).all() and (adv[~anchor] <= 0).all()
