"""The synthetic knowledge base, the tool declarations and the simulated tool actor, by hand."""

from __future__ import annotations

import re

import pytest

from dlmrl.envs.tools import Entity, KnowledgeBase, ToolSet, ToolSimulator, kb_tools
from dlmrl.envs.tools.knowledge_base import RELATIONS
from dlmrl.envs.tools.react import parse_action
from dlmrl.envs.tools.simulator import ToolAnswerError, is_error
from tests.envs.tool_world import ENTITIES, FACTS, KB, SIM


def test_generation_is_deterministic_per_seed():
    a, b, c = KnowledgeBase.generate(3), KnowledgeBase.generate(3), KnowledgeBase.generate(4)
    assert a.entities == b.entities and a.facts == b.facts
    assert a.facts != c.facts and set(a.entities) != set(c.entities)


def test_generated_world_invariants():
    kb = KnowledgeBase.generate(0, sizes={"person": 20, "city": 8, "country": 4}, test_fraction=0.25)
    names = list(kb.entities)
    words = [w for n in names for w in n.lower().split()]
    assert len(words) == len(set(words))  # every name word belongs to one entity
    assert all(re.fullmatch(r"[A-Z][a-z]+( [A-Z][a-z]+)?", n) for n in names)
    assert len(kb.of("person", "test")) == 5 and len(kb.of("person", "train")) == 15
    assert len(kb.of("country", "test")) == 1 and len(kb.of("city", "test")) == 2
    for e in kb.entities.values():  # every subject carries every relation of its type, within its split
        for rel in RELATIONS.values():
            if rel.subject == e.type:
                obj = kb.entities[kb.facts[(e.name, rel.name)]]
                assert obj.type == rel.object and obj.split == e.split
    for country in kb.of("country"):
        assert kb.get(kb.get(country.name, "capital"), "located_in") == country.name
    with pytest.raises(ValueError, match="fewer cities"):
        KnowledgeBase.generate(0, sizes={"city": 4, "country": 8})
    with pytest.raises(ValueError, match="unknown entity type"):
        KnowledgeBase.generate(0, sizes={"planet": 3})
    with pytest.raises(ValueError, match="test_fraction"):
        KnowledgeBase.generate(0, test_fraction=1.0)


def test_hand_made_knowledge_base_is_checked():
    with pytest.raises(ValueError, match="crosses"):
        KnowledgeBase({**ENTITIES, "Rila": Entity("Rila", "city", "test")}, {**FACTS, ("Ada Moro", "born_in"): "Rila"})
    with pytest.raises(ValueError, match="links person -> city, not person -> country"):
        KnowledgeBase(ENTITIES, {("Ada Moro", "born_in"): "Tesu"})
    with pytest.raises(ValueError, match="unknown relation"):
        KnowledgeBase(ENTITIES, {("Ada Moro", "likes"): "Tesu"})
    assert KB.entity("  ada   MORO ").name == "Ada Moro" and KB.entity("Ada") is None
    assert KB.relations_of("Lumi") == ("directed_by", "filmed_in") and KB.relations_of("nobody") == ()


def test_valid_calls_are_answered_from_the_knowledge_base():
    assert SIM.respond("lookup", {"entity": "Lumi", "relation": "directed_by"}) == ("Ada Moro", None)
    assert SIM("lookup", '{"entity": "ada moro", "relation": "born_in"}') == "Kavo"  # a JSON string, any case
    assert SIM("search", {"query": "av"}) == "Kavo (city)"
    assert SIM("search", {"query": "a"}) == "Ada Moro (person); Kavo (city)"
    # a miss is an error observation: its text echoes the query, which must not ground an answer searched for first
    assert SIM.respond("search", {"query": "zz"}) == ("Error: no entity matches 'zz'", "no_match")


@pytest.mark.parametrize("name, arguments, kind, text", [
    ("fetch", {"url": "x"}, "unknown_tool", "Error: unknown tool 'fetch' (tools: lookup, search)"),
    ("lookup", '{"entity": "Kavo",', "bad_json", "Error: arguments are not valid JSON"),
    ("lookup", "[" * 100_000, "bad_json", "Error: arguments are not valid JSON"),  # too deep for json
    ("lookup", {"entity": "Kavo"}, "schema", "Error: invalid arguments for lookup: 'relation' is a required property"),
    ("lookup", {"entity": "Kavo", "relation": "mayor"}, "schema",
     "Error: invalid arguments for lookup at relation: 'mayor' is not one of"),
    ("lookup", {"entity": "", "relation": "capital"}, "schema", "Error: invalid arguments for lookup at entity"),
    ("lookup", {"entity": "Kavo", "relation": "capital", "x": 1}, "schema",
     "Error: invalid arguments for lookup: Additional properties"),
    ("lookup", "[1, 2]", "schema", "Error: invalid arguments for lookup: not a JSON object"),
    ("lookup", {"entity": "Rome", "relation": "capital"}, "unknown_entity", "Error: unknown entity 'Rome'"),
    ("lookup", {"entity": "Lumi", "relation": "born_in"}, "no_fact",
     "Error: Lumi (film) has no born_in (it has: directed_by, filmed_in)"),
])
def test_invalid_calls_get_error_observations(name, arguments, kind, text):
    obs = SIM.respond(name, arguments)
    assert obs.error == kind and obs.text.startswith(text) and is_error(obs.text)
    assert len(obs.text) < 200


@pytest.mark.parametrize("raw, kind", [
    ('lookup{"entity": "Kavo"}', "malformed_action"),
    ("", "malformed_action"),
    ('fetch[{"url": "x"}]', "unknown_tool"),
    ('fetch[{"url": ', "unknown_tool"),  # an unknown tool is reported first, whatever its arguments
    ('lookup[{"entity": "Kavo", "relation": "capital"}', "bad_json"),  # missing ]
    ('lookup[{"entity": "Kavo" "relation"}]', "bad_json"),
    ('lookup["Kavo"]', "schema"),
    ('lookup[{"entity": "Kavo"}]', "schema"),
])
def test_parsed_actions_that_fail(raw, kind):
    assert SIM.run(parse_action(raw)).error == kind


def test_parsed_action_answered():
    assert SIM.run(parse_action(' lookup [ {"entity": "Tesu", "relation": "capital"} ] and more')).text == "Kavo"


def test_user_simulator_hook():
    calls = []

    def actor(name, arguments):
        calls.append((name, arguments))
        return f"simulated {name}"

    sim = ToolSimulator(kb_tools(), answer_fn=actor)
    assert sim("search", {"query": "anything"}) == "simulated search"
    assert sim("lookup", {"entity": "Nobody", "relation": "capital"}) == "simulated lookup"  # no KB check
    assert sim("lookup", {"entity": "Nobody"}).startswith("Error: invalid arguments")  # schema still checked
    assert sim("fetch", {}).startswith("Error: unknown tool")
    assert calls == [("search", {"query": "anything"}), ("lookup", {"entity": "Nobody", "relation": "capital"})]
    weather = {"type": "function", "function": {"name": "weather", "description": "the weather",
                                                "parameters": {"type": "object"}}}
    assert ToolSimulator([weather], answer_fn=lambda n, a: "sunny")("weather", "{}") == "sunny"
    with pytest.raises(TypeError, match="must return a str"):
        ToolSimulator([weather], answer_fn=lambda n, a: 3)("weather", {})
    with pytest.raises(ToolAnswerError, match=r"tool 'weather': answer_fn must return a str, got int 3"):
        ToolSimulator([weather], answer_fn=lambda n, a: 3)("weather", {})
    with pytest.raises(ToolAnswerError, match=r"tool 'weather': answer_fn returned text that is not valid Unicode "
                                              r"\(surrogates not allowed: '\\udcff' at character 4 of"):
        ToolSimulator([weather], answer_fn=lambda n, a: "bad \udcff")("weather", {})
    with pytest.raises(ValueError, match="pass answer_fn"):
        ToolSimulator([weather], kb=KB)
    with pytest.raises(ValueError, match="needs a knowledge base"):
        ToolSimulator()


def test_declarations_are_checked():
    good = kb_tools()
    tools = ToolSet(good)
    assert tools.names == ("lookup", "search") and tools.signature("lookup") == "lookup(entity, relation)"
    assert tools.declarations == good and tools.declarations is not good
    bad_name = {"type": "function", "function": {"name": "no spaces", "description": "", "parameters": {}}}
    bad_schema = {"type": "function", "function": {"name": "f", "description": "", "parameters": {"type": "nope"}}}
    for decl, match in ((bad_name, "invalid tool declaration"), (bad_schema, "invalid parameters schema"),
                        ({"type": "tool", "function": good[0]["function"]}, "invalid tool declaration"),
                        (good[0], "declared twice")):
        with pytest.raises(ValueError, match=match):
            ToolSet([good[0], decl] if match == "declared twice" else [decl])


def test_a_look_alike_declaration_cannot_crash_the_knowledge_base():
    loose = {"type": "function", "function": {"name": "lookup", "description": "", "parameters": {"type": "object"}}}
    sim = ToolSimulator([loose], kb=KB)
    obs = sim.respond("lookup", {"entity": 3})
    assert obs == ("Error: invalid arguments for lookup: needs string entity, relation", "schema")
    assert sim("lookup", {"entity": "Kavo", "relation": "located_in"}) == "Tesu"
