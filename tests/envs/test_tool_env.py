"""The scripted agent, its SFT pairs, and tool-use episodes in both context modes."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest

from dlmrl.envs import ENVS, Environment, StepResult, make_env
from dlmrl.envs.tools import (
    KnowledgeBase,
    MTRTraceReward,
    ScriptedAgent,
    ToolEnv,
    ToolSimulator,
    format_prompt,
    parse_trace,
    sft_pairs,
    split_questions,
)
from dlmrl.envs.tools.env import NO_ACTION, cut_turn
from dlmrl.envs.tools.multihop import generate_questions
from tests.envs.test_react import fuzz_string
from tests.envs.tool_world import KB as HAND_KB
from tests.envs.tool_world import SIM as HAND_SIM

KB = KnowledgeBase.generate(0)
SIM = ToolSimulator(kb=KB)
QUESTIONS = [q for qs in split_questions(KB).values() for q in qs]
AGENT = ScriptedAgent(SIM)
# the hand-made world's 3-hop question: Lumi -> Ada Moro -> Kavo -> Tesu
LUMI = next(q for q in generate_questions(HAND_KB, "train") if q.hops == 3)
Q = "Question: In which country is the city where the director of Lumi was born?\n"
DIRECTOR = 'lookup[{"entity": "Lumi", "relation": "directed_by"}]'
BORN = 'lookup[{"entity": "Ada Moro", "relation": "born_in"}]'


def test_scripted_traces_are_correct_and_score_full_reward():
    checked = MTRTraceReward(SIM.tools, simulator=SIM)
    assert len(QUESTIONS) > 250
    for q in QUESTIONS:
        text = AGENT.completion(q)
        trace = parse_trace(text)
        assert trace == AGENT.trace(q) and trace.final_answer == q.answer
        s = checked.score(text, q.answer)
        assert (s.answer, s.consistency, s.n_actions) == (1.0, 1.0, q.hops) and s.reward == pytest.approx(1.2)


def test_scripted_episodes_in_both_modes():
    for mode in ("react", "memory"):
        for q in QUESTIONS:
            env = ToolEnv(SIM, q.hops + 1, mode)
            env.reset(q)
            results = [env.step(t) for t in AGENT.turns(q)]
            assert [r.done for r in results] == [False] * q.hops + [True]
            assert [r.reward for r in results[:-1]] == [0.0] * q.hops
            assert results[-1].reward == pytest.approx(1.2) and env.score.final_answer == q.answer
            assert env.trace == AGENT.trace(q)  # the environment's record is the agent's complete trace
            if mode == "react":
                assert results[-1].observation == format_prompt(q.question) + AGENT.completion(q)


def test_react_episode_by_hand():
    env = make_env("multihop_react", SimpleNamespace(simulator=HAND_SIM), 4)
    assert isinstance(env, Environment) and env.reset(LUMI) == Q
    # a made-up observation and anything after it are dropped; the simulator observes
    r = env.step(f"Thought: the director first.\nAction: {DIRECTOR}\nObservation: made up\nFinal Answer: x")
    t1 = f"Thought: the director first.\nAction: {DIRECTOR}\nObservation: Ada Moro\n"
    assert r == StepResult(Q + t1, False, 0.0)
    r = env.step("I am not sure")  # neither action nor final answer
    t2 = f"I am not sure\nObservation: {NO_ACTION}\n"
    assert r == StepResult(Q + t1 + t2, False, 0.0)
    r = env.step(f"Action: {BORN}\nThought: and then\nAction: search[{{\"query\": \"x\"}}]")  # only the first runs
    t3 = f"Action: {BORN}\nObservation: Kavo\n"
    assert r == StepResult(Q + t1 + t2 + t3, False, 0.0)
    r = env.step("Thought: done.\nFinal Answer: Kavo\nFinal Answer: Tesu")
    assert r.done and r.observation == Q + t1 + t2 + t3 + "Thought: done.\nFinal Answer: Kavo\n"
    # wrong answer (Tesu), 2 valid observed actions, "Kavo" grounded in an observation: 0 + 0.2 * 1
    s = env.score
    assert (s.answer, s.valid, s.observed, s.grounded) == (0.0, 1.0, 1.0, 1.0) and r.reward == pytest.approx(0.2)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("Final Answer: Tesu")


def test_memory_episode_by_hand_and_max_turns():
    env = make_env("multihop_memory", SimpleNamespace(simulator=HAND_SIM), 3)
    assert env.reset(LUMI) == Q + "Memory:\n"
    r = env.step(f"Thought: the director first.\nAction: {DIRECTOR}")
    assert r == StepResult(Q + f"Memory:\n- {DIRECTOR} -> Ada Moro\n", False, 0.0)
    r = env.step("Action: lookup[{\"entity\": \"Ada Moro\"}]")
    err = "Error: invalid arguments for lookup: 'relation' is a required property"
    assert r == StepResult(Q + f"Memory:\n- {DIRECTOR} -> Ada Moro\n- lookup[{{\"entity\": \"Ada Moro\"}}] -> {err}\n",
                           False, 0.0)
    r = env.step("nothing")  # the third turn is the last: no final answer
    assert r.done and r.observation.endswith(f"- (no action) -> {NO_ACTION}\n")
    s = env.score  # valid 1/2, observed 2/2, not grounded, no answer: 0.2 * (0.5 + 1) / 3
    assert (s.answer, s.valid, s.observed, s.grounded) == (0.0, 0.5, 1.0, 0.0) and r.reward == pytest.approx(0.1)


def test_task_reward_and_registry():
    f1 = MTRTraceReward(HAND_SIM.tools, metric="f1", w_cons=0.0)
    env = make_env("multihop_react", SimpleNamespace(simulator=HAND_SIM, trace_reward=f1), 1)
    env.reset(SimpleNamespace(question="Who?", answer="Ada Moro"))
    assert env.step("Final Answer: Ada").reward == pytest.approx(2 / 3)
    assert ENVS.get("multihop_memory").tasks == ("multihop",)
    with pytest.raises(ValueError, match="mode"):
        ToolEnv(HAND_SIM, 2, "full")
    with pytest.raises(ValueError, match="max_turns"):
        ToolEnv(HAND_SIM, 0)
    with pytest.raises(TypeError, match="question and answer"):
        ToolEnv(HAND_SIM).reset("a string")


def test_cut_turn():
    assert cut_turn("Thought: a\nObservation: b\nAction: c") == "Thought: a"
    assert cut_turn("Thought: a\nAction: c\nmore\nAction: d") == "Thought: a\nAction: c\nmore"
    assert cut_turn("Final Answer: x \ny\nAction: z") == "Final Answer: x"
    assert cut_turn("plain  \n") == "plain"


def test_fuzzed_turns_never_raise():
    rng = random.Random(1)
    for i in range(300):
        env = ToolEnv(HAND_SIM, 3, ("react", "memory")[i % 2])
        env.reset(LUMI)
        done = False
        while not done:
            obs, done, reward = env.step(fuzz_string(rng))
            assert isinstance(obs, str) and math.isfinite(reward) and 0.0 <= reward <= 1.2


def test_sft_pairs():
    qs = QUESTIONS[:20]
    whole = sft_pairs(qs, SIM)
    assert whole == [(format_prompt(q.question), AGENT.completion(q)) for q in qs]
    for mode in ("react", "memory"):
        pairs = sft_pairs(qs, SIM, mode)
        assert len(pairs) == sum(q.hops + 1 for q in qs)
        assert [c for _, c in pairs] == [t for q in qs for t in AGENT.turns(q)]
    react = sft_pairs([LUMI], HAND_SIM, "react")
    assert react[0][0] == Q and react[1][0] == Q + f"Thought: I need the director of Lumi.\nAction: {DIRECTOR}\n" \
                                                    "Observation: Ada Moro\n"
    assert react[-1][1] == "Thought: I have the answer.\nFinal Answer: Tesu\n"
    with pytest.raises(ValueError, match="form"):
        sft_pairs(qs, SIM, "chat")
    with pytest.raises(RuntimeError, match="max_turns"):
        sft_pairs([LUMI], HAND_SIM, "memory", max_turns=2)
