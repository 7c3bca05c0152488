"""Multi-hop questions (templates, generation, the split by entity) and EM/F1, by hand."""

from __future__ import annotations

import re

import pytest

from dlmrl.envs.tools import KnowledgeBase, ScriptedAgent, ToolSimulator, split_questions
from dlmrl.envs.tools.multihop import generate_questions, question_text, relation_chains
from dlmrl.envs.tools.qa_metrics import exact_match, f1_score, normalize_answer
from tests.envs.tool_world import KB as HAND_KB

KB = KnowledgeBase.generate(0)
SPLIT = split_questions(KB, seed=0)


def test_question_text_by_hand():
    assert question_text(["directed_by", "born_in", "located_in"], "Lumi") == \
        "In which country is the city where the director of Lumi was born?"
    assert question_text(["located_in", "capital"], "Kavo") == "What is the capital of the country where Kavo is?"
    assert question_text(["written_by"], "Sela") == "Who wrote Sela?"
    with pytest.raises(ValueError, match="at least one relation"):
        question_text([], "Lumi")


def test_chains_are_typed_and_skip_the_way_back():
    assert ("capital", "located_in") not in relation_chains(2)
    assert len(relation_chains(2)) == 7 and len(relation_chains(3)) == 6


def test_questions_on_the_hand_made_world():
    qs = generate_questions(HAND_KB, "train", hops=(2, 3))
    by_chain = sorted(q.chain for q in qs)
    # Kavo -> Tesu -> Kavo (its own capital) and the 3-hop chains through Tesu's capital revisit Kavo: dropped
    assert by_chain == [("Ada Moro", "Kavo", "Tesu"), ("Lumi", "Ada Moro", "Kavo"), ("Lumi", "Ada Moro", "Kavo", "Tesu"),
                        ("Lumi", "Kavo", "Tesu")]
    q = next(q for q in qs if q.hops == 3)
    assert (q.question, q.answer, q.topic) == ("In which country is the city where the director of Lumi was born?",
                                               "Tesu", "Lumi")
    assert generate_questions(HAND_KB, "test") == []
    with pytest.raises(ValueError, match="asked for 5"):
        generate_questions(HAND_KB, "train", n=5)
    with pytest.raises(ValueError, match="split must be"):
        generate_questions(HAND_KB, "dev")


def test_generation_is_deterministic():
    assert split_questions(KB, seed=0) == SPLIT
    assert generate_questions(KB, "train", seed=1) != SPLIT["train"]  # another order
    assert sorted(map(str, generate_questions(KB, "train", seed=1))) == sorted(map(str, SPLIT["train"]))
    assert {q.hops for q in SPLIT["train"]} == {q.hops for q in SPLIT["test"]} == {2, 3}
    assert len(generate_questions(KB, "test", n=10)) == 10


def test_split_by_entity():
    """Every entity of a question's chain belongs to the question's split, so no test topic, intermediate
    entity or answer occurs in a train question, and no test name word occurs in any training text
    (train questions and the scripted agent's traces on them, observations included)."""
    train, test = SPLIT["train"], SPLIT["test"]
    assert train and test
    for q in train + test:
        assert {KB.entities[n].split for n in q.chain} == {q.split} and q.answer == q.chain[-1]
    train_entities = {n for q in train for n in q.chain}
    assert not train_entities & {n for q in test for n in q.chain}
    assert not {q.answer for q in test} & train_entities
    agent = ScriptedAgent(ToolSimulator(kb=KB))
    training_text = " ".join(q.question + "\n" + agent.completion(q) for q in train).lower()
    training_words = set(re.findall(r"[a-z]+", training_text))
    test_words = KB.words(n for q in test for n in q.chain)
    assert test_words and not test_words & training_words
    assert KB.words(train_entities) <= training_words  # the check is not vacuous


def test_normalisation_and_exact_match_by_hand():
    assert normalize_answer("  The Kavo-City!  ") == "kavocity"  # SQuAD deletes punctuation (no space)
    assert normalize_answer("An apple a day") == "apple day"
    assert exact_match("the Kavo.", "Kavo") == 1.0 and exact_match("Kavo City", "Kavo") == 0.0
    assert exact_match("tesu", ["Kavo", "Tesu"]) == 1.0
    with pytest.raises(ValueError, match="no gold"):
        exact_match("Kavo", [])


def test_f1_by_hand():
    assert f1_score("Ada Moro", "Moro") == pytest.approx(2 / 3)  # P 1/2, R 1
    assert f1_score("x y y", "y y z") == pytest.approx(2 / 3)  # 2 shared tokens: P = R = 2/3
    assert f1_score("Kavo", ["Tesu", "Kavo Tesu"]) == pytest.approx(2 / 3)  # the best gold
    assert f1_score("Kavo", "Tesu") == 0.0
    assert f1_score("the", "Kavo") == 0.0  # empty after normalisation
    assert f1_score("", "a") == 1.0  # both empty after normalisation (SQuAD v2.0's convention)
