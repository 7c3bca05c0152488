"""MTR's trace reward on hand-written traces, every value computed by hand (weights 1.0 and 0.2 unless set)."""

from __future__ import annotations

import pytest

from dlmrl.envs.tools import MTRTraceReward, kb_tools
from tests.envs.tool_world import SIM

R = MTRTraceReward(kb_tools())
CHECKED = MTRTraceReward(kb_tools(), simulator=SIM)  # observations must be the simulator's answers
DIRECTOR = 'Action: lookup[{"entity": "Lumi", "relation": "directed_by"}]\n'
FILMED = 'Action: lookup[{"entity": "Lumi", "relation": "filmed_in"}]\n'


def parts(score):
    return (score.answer, score.valid, score.observed, score.grounded, score.n_actions)


def test_a_complete_correct_trace_scores_1_2():
    trace = ("Thought: I need the director of Lumi.\n" + DIRECTOR + "Observation: Ada Moro\n"
             'Action: lookup[{"entity": "Ada Moro", "relation": "born_in"}]\nObservation: Kavo\n'
             "Thought: I have the answer.\nFinal Answer: Kavo\n")
    for reward in (R, CHECKED):
        s = reward.score(trace, "Kavo")
        assert parts(s) == (1.0, 1.0, 1.0, 1.0, 2) and s.consistency == 1.0 and s.reward == pytest.approx(1.2)
    assert s.as_dict()["final_answer"] == "Kavo"


def test_no_action():
    s = R.score("Thought: I just know.\nFinal Answer: Tesu", "Tesu")
    # valid = observed = 0 without actions, nothing grounds the answer: consistency 0
    assert parts(s) == (1.0, 0.0, 0.0, 0.0, 0) and s.reward == pytest.approx(1.0)
    assert R.score("", "Tesu").reward == 0.0


def test_no_final_answer_keeps_the_credit_of_its_actions():
    s = R.score(DIRECTOR + "Observation: Ada Moro\n", "Tesu")
    assert parts(s) == (0.0, 1.0, 1.0, 0.0, 1) and s.final_answer is None
    assert s.reward == pytest.approx(0.2 * 2 / 3)
    empty = R.score(DIRECTOR + "Observation: Ada Moro\nFinal Answer:\n", "Tesu")  # an empty answer: same
    assert parts(empty) == parts(s) and empty.final_answer == ""


def test_invalid_and_unobserved_actions():
    trace = ('Action: fetch[{"url": "x"}]\nObservation: Error: unknown tool \'fetch\' (tools: lookup, search)\n'
             + FILMED + "Final Answer: Kavo\n")
    s = R.score(trace, "Tesu")
    # valid 1/2 (fetch is undeclared), observed 1/2 (the lookup has none), the only observation is an error
    assert parts(s) == (0.0, 0.5, 0.5, 0.0, 2) and s.reward == pytest.approx(0.2 * (1 / 3))
    malformed = R.score('Action: lookup{"entity": "Lumi"}\nObservation: Error: malformed\n', "x")
    assert parts(malformed) == (0.0, 0.0, 1.0, 0.0, 1)
    schema = R.score('Action: lookup[{"entity": "Lumi", "relation": "mayor"}]\nObservation: ?\n', "x")
    assert schema.valid == 0.0


def test_grounding_is_a_token_run_of_an_observation():
    s = R.score(FILMED + "Observation: Kavo\nFinal Answer: kavo.\n", "Tesu")  # wrong but grounded
    assert parts(s) == (0.0, 1.0, 1.0, 1.0, 1) and s.reward == pytest.approx(0.2)
    assert R.score(DIRECTOR + "Observation: Ada Moro\nFinal Answer: Moro", "x").grounded == 1.0
    assert R.score(DIRECTOR + "Observation: Ada Moro\nFinal Answer: Ada Mor", "x").grounded == 0.0
    # an observation that follows no action grounds nothing
    assert R.score("Observation: Tesu\nFinal Answer: Tesu", "Tesu").grounded == 0.0


def test_f1_option_and_weights():
    f1 = MTRTraceReward(kb_tools(), metric="f1")
    s = f1.score(DIRECTOR + "Observation: Ada Moro\nFinal Answer: Ada", "Ada Moro")
    assert s.answer == pytest.approx(2 / 3) and s.reward == pytest.approx(2 / 3 + 0.2)  # P 1, R 1/2
    heavy = MTRTraceReward(kb_tools(), w_ans=2.0, w_cons=1.0)
    assert heavy.score(DIRECTOR + "Observation: Ada Moro\n", "x").reward == pytest.approx(2 / 3)
    assert R.score("Final Answer: tesu", ["Kavo", "Tesu"]).answer == 1.0  # several gold answers
    for kwargs, match in (({"metric": "acc"}, "metric"), ({"w_cons": -1.0}, "weights")):
        with pytest.raises(ValueError, match=match):
            MTRTraceReward(kb_tools(), **kwargs)
    with pytest.raises(ValueError, match="no gold"):
        R.score("Final Answer: x", [])


def test_a_simulator_rejects_made_up_observations():
    forged = DIRECTOR + "Observation: Tesu\nFinal Answer: Tesu\n"
    assert R.score(forged, "Tesu").reward == pytest.approx(1.2)  # without a simulator, any observation counts
    s = CHECKED.score(forged, "Tesu")  # the simulator says Ada Moro: not observed, so not grounded either
    assert parts(s) == (1.0, 1.0, 0.0, 0.0, 1) and s.reward == pytest.approx(1 + 0.2 / 3)
    spaced = CHECKED.score(DIRECTOR + "Observation:   Ada   Moro \nFinal Answer: Ada Moro", "Ada Moro")
    assert spaced.observed == 1.0  # equal up to whitespace


def test_grounding_in_thoughts_option():
    trace = "Thought: It is Tesu.\nFinal Answer: Tesu"
    assert R.score(trace, "Tesu").grounded == 0.0
    s = MTRTraceReward(kb_tools(), ground_in_thoughts=True).score(trace, "Tesu")
    assert s.grounded == 1.0 and s.reward == pytest.approx(1 + 0.2 / 3)


def test_trl_shape():
    completions = ["Final Answer: Tesu", [{"role": "assistant", "content": FILMED + "Observation: Kavo\n"}]]
    assert R([None, None], completions, answer=["Tesu", "Kavo"], extra=[1, 2]) == pytest.approx([1.0, 0.2 * 2 / 3])
    assert [s.valid for s in R.score_batch(completions, ["Tesu", "Kavo"])] == [0.0, 1.0]


def test_a_search_never_grounds_the_answer():
    # a miss echoes the query (an error observation now), and a hit lists names matching it: searching for an
    # answer first would otherwise ground any answer (the reward hack a review found)
    miss = ('Thought: x\nAction: search[{"query": "Bogus"}]\nObservation: Error: no entity matches \'Bogus\'\n'
            'Final Answer: Bogus\n')
    s = CHECKED.score(miss, "Gold")
    assert (s.valid, s.observed, s.grounded) == (1.0, 1.0, 0.0)
    hit = 'Thought: x\nAction: search[{"query": "a"}]\nObservation: Ada Moro (person); Kavo (city)\nFinal Answer: Kavo\n'
    s = CHECKED.score(hit, "Gold")
    assert (s.valid, s.observed, s.grounded) == (1.0, 1.0, 0.0)
    assert MTRTraceReward(kb_tools(), simulator=SIM, ground_exclude=()).score(hit, "Gold").grounded == 1.0
