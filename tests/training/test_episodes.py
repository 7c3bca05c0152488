"""Flow-GRPO episode rollouts: a scripted stub policy through the feedback environment (rows per turn,
ids, final rewards, NFE, prompts), the flow_grpo advantage on them, and config validation of env/turns."""

from __future__ import annotations

import math

import pytest
import torch

from dlmrl.config import Config, ConfigError, apply_overrides, validate
from dlmrl.data.sudoku import SudokuExample
from dlmrl.data.tasks import SudokuTask
from dlmrl.envs import make_env
from dlmrl.models.tokenizer import build_char_tokenizer
from dlmrl.objectives.advantage_registry import AdvantageInputs
from dlmrl.objectives.presets import get_algorithm
from dlmrl.training.episodes import encode_observations, rollout_episodes, trajectory_rewards

TOK = build_char_tokenizer()
TASK = SudokuTask(TOK, TOK.mask_token_id, answer_mode="full")
EX = SudokuExample("0034301221034320", "1234341221434321")  # blanks 0, 1, 5, 10, 15
SOLVED = "1234341221434321"


class ScriptedPolicy:
    """Answers from a script: call k gives ``script[k][row]`` (then EOS); records the prompts it saw."""

    device = torch.device("cpu")
    tokenizer = TOK

    def __init__(self, script):
        self.script, self.prompts, self.seeds = script, [], []

    def generate(self, prompt_ids, prompt_mask, max_new_tokens, temperature=1.0, generator=None, temperature_fn=None):
        answers = self.script[len(self.prompts)]
        self.prompts.append([TOK.decode(p[m]) for p, m in zip(prompt_ids, prompt_mask)])
        self.seeds.append(int(torch.randint(0, 1000, (1,), generator=generator)))
        assert len(answers) == len(prompt_ids)
        rows = [TOK.convert_tokens_to_ids(list(a)) + [TOK.eos_token_id] for a in answers]
        comp = torch.tensor([r + [TOK.pad_token_id] * (max_new_tokens - len(r)) for r in rows])
        mask = torch.arange(max_new_tokens)[None, :] < torch.tensor([len(r) for r in rows])[:, None]
        return comp, mask


def test_two_episodes_by_hand():
    # episode 0 solves at turn 1; episode 1: 0.8, 0.8, then a short answer (0.4) at the last turn
    policy = ScriptedPolicy([[SOLVED, "1134341221434321"], ["1334341221434321"], ["12"]])
    ro = rollout_episodes(policy, TASK, lambda: make_env("sudoku_feedback", TASK, 3), [EX], 2,
                          torch.Generator().manual_seed(0), max_new_tokens=17)
    # the prompts the policy saw: both episodes start on the puzzle; episode 1 then sees the feedback puzzle
    assert policy.prompts == [["[BOS]0034301221034320="] * 2, ["[BOS]1034341221434321="],
                              ["[BOS]1034341221434321="]]
    assert len(ro) == 4  # one row per turn: 1 + 3
    assert ro.trajectory_ids.tolist() == [0, 1, 1, 1] and ro.group_ids.tolist() == [0, 0, 0, 0]
    assert ro.rewards.tolist() == pytest.approx([1.0, 0.4, 0.4, 0.4])  # the trajectory's final reward per turn
    assert torch.equal(ro.train_rewards, ro.rewards)
    assert TASK.decode(ro.completion) == [SOLVED, "1134341221434321", "1334341221434321", "12"]
    assert ro.completion_mask.sum(-1).tolist() == [17, 17, 17, 3]
    assert ro.nfe == 17 + 17 + 3  # the longest response of each turn's batch
    assert ro.sampling_passes() == 2 * 17 + 17 + 3  # rows × longest response, per turn
    # each row's prompt is its turn's observation, left-padded like a task batch
    first = TASK.encode([EX])
    assert torch.equal(ro.prompt_ids[0], first.prompt_ids[0]) and ro.prompt_mask.all()
    assert TOK.decode(ro.prompt_ids[2]) == "[BOS]1034341221434321="
    assert ro.examples == [EX] * 4 and trajectory_rewards(ro).tolist() == pytest.approx([1.0, 0.4])
    # flow_grpo: z-score over the 2 trajectories (mean 0.7, Bessel std 0.3·√2), broadcast to the turns
    adv = get_algorithm("flow_grpo").advantages(AdvantageInputs(ro.train_rewards, 2, group_ids=ro.group_ids,
                                                                trajectory_ids=ro.trajectory_ids))
    a = 0.3 / (0.3 * math.sqrt(2) + 1e-4)
    torch.testing.assert_close(adv, torch.tensor([a, -a, -a, -a]))
    # turn_weighted (the authors' code) pools the 4 turn rows instead
    tw = get_algorithm("flow_grpo", advantage_options={"turn_weighted": True}).advantages(
        AdvantageInputs(ro.train_rewards, 2, group_ids=ro.group_ids, trajectory_ids=ro.trajectory_ids))
    std = math.sqrt(((1 - 0.55) ** 2 + 3 * (0.4 - 0.55) ** 2) / 3)
    torch.testing.assert_close(tw, torch.tensor([0.45, -0.15, -0.15, -0.15]) / (std + 1e-4))


def test_groups_are_questions_and_the_step_generator_drives_every_turn():
    ex2 = SudokuExample("1204341221434301", "1234341221434321")
    script = [[SOLVED, "?", "?", SOLVED], ["?", "?"], ["?", "?"]]
    runs = []
    for _ in range(2):
        policy = ScriptedPolicy(script)
        ro = rollout_episodes(policy, TASK, lambda: make_env("sudoku_retry", TASK, 3), [EX, ex2], 2,
                              torch.Generator().manual_seed(7), max_new_tokens=17)
        runs.append(policy.seeds)
    assert ro.trajectory_ids.tolist() == [0, 1, 1, 1, 2, 2, 2, 3]
    assert ro.group_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert ro.rewards.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert runs[0] == runs[1] and len(set(runs[0])) > 1  # one generator, advanced turn by turn


def test_an_environment_that_never_ends_is_an_error():
    class Endless:
        max_turns = 2

        def reset(self, example):
            return "0034301221034320="

        def step(self, text):
            return "0034301221034320=", False, 0.0

    policy = ScriptedPolicy([["?"], ["?"], ["?"]])
    with pytest.raises(RuntimeError, match="max_turns"):
        rollout_episodes(policy, TASK, Endless, [EX], 1, torch.Generator(), 17)


def test_observations_encode_like_the_task():
    ids, mask = encode_observations(TOK, ["0034301221034320=", "1="])
    assert torch.equal(ids[0], TASK.encode([EX]).prompt_ids[0])
    assert mask[1].tolist() == [False] * 15 + [True] * 3 and ids[1, :15].eq(TOK.pad_token_id).all()


@pytest.mark.parametrize(("overrides", "key", "match"), [
    (["env=sudoku_retyr"], "train.env", "unknown environment"),
    (["max_turns=0"], "train.max_turns", ">= 1"),
    (["algorithm=grpo", "env=sudoku_retry"], "train.env", "tools inside the rollout need one that appends"),
    (["model.kind=diffusion", "model.name_or_path=tiny-sudoku", "task.answer_mode=infill"], "train.algorithm",
     "runs on ar"),
])
def test_env_settings_are_validated(overrides, key, match):
    cfg = Config()
    apply_overrides(cfg, ["algorithm=flow_grpo", "model.kind=ar", "model.name_or_path=tiny-sudoku-ar",
                          "task.answer_mode=full", *overrides])
    with pytest.raises(ConfigError, match=match) as err:
        validate(cfg)
    assert key in str(err.value)


def test_dagrpo_takes_any_advantage_now_that_every_estimator_reads_group_ids():
    cfg = Config()
    apply_overrides(cfg, ["algorithm=dagrpo", "scale_rewards=group"])
    validate(cfg)  # (group advantages over the anchors' groups of G + 1: tests/objectives/test_advantage_registry.py)
