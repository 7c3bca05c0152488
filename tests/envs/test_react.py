"""The ReAct parser and formatter: hand cases, tricky strings, fuzzing, round trips."""

from __future__ import annotations

import itertools
import math
import random
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from dlmrl.envs.tools.react import (
    _MARKER,
    Action,
    Step,
    Trace,
    format_prompt,
    format_trace,
    parse_action,
    parse_trace,
)

LOOKUP = 'lookup[{"entity": "Lumi", "relation": "directed_by"}]'


def test_a_complete_trace():
    text = ("I will look it up.\n"
            "Thought: I need the director of Lumi.\n"
            f"Action: {LOOKUP}\n"
            "Observation: Ada Moro\n"
            "Thought: I have the answer.\n"
            "Final Answer: Ada Moro\n")
    trace = parse_trace(text)
    assert trace == Trace((Step("I need the director of Lumi.", Action.of("lookup", {"entity": "Lumi",
                                                                                      "relation": "directed_by"}),
                                "Ada Moro"), Step("I have the answer.")), "Ada Moro", "I will look it up.")
    assert format_trace(trace) == text
    assert format_prompt("Who?") == "Question: Who?\n"


def test_nested_braces_and_brackets_in_json():
    a = parse_action('lookup[{"entity": "a{b}[c]", "n": {"m": [1, {"k": "]"}]}}]')
    assert a.ok and a.name == "lookup" and a.arguments == {"entity": "a{b}[c]", "n": {"m": [1, {"k": "]"}]}}
    multi = parse_trace('Action: search[{\n  "query": "x"\n}]\nObservation: none')
    assert multi.steps[0].action.arguments == {"query": "x"} and multi.steps[0].observation == "none"
    spaced = parse_action(' search [ {"query": "x"} ] then I wait')  # text after the closing ] is ignored
    assert spaced.ok and spaced.arguments == {"query": "x"}


def test_actions_that_do_not_parse():
    cases = {
        'lookup{"entity": "x"}': (None, "expected tool[{json arguments}]"),
        "": (None, "expected tool[{json arguments}]"),
        "look up[{}]": (None, "expected tool[{json arguments}]"),
        'lookup[{"entity": "x"}': ("lookup", "missing ']' after the arguments"),
        'lookup[{"entity": "x"} extra]': ("lookup", "missing ']' after the arguments"),
        "lookup[": ("lookup", "arguments are not valid JSON"),
        "lookup[{'entity': 'x'}]": ("lookup", "arguments are not valid JSON"),  # Python, not JSON: never evaluated
        "lookup[" + "[" * 50_000: ("lookup", "arguments are not valid JSON"),  # json's recursion limit
        'search["x"]': ("search", "arguments must be a JSON object"),
        "search[]": ("search", "arguments are not valid JSON"),
    }
    for raw, (name, error) in cases.items():
        a = parse_action(raw)
        assert (a.name, a.arguments, a.error, a.raw) == (name, None, error, raw), raw


def test_the_first_final_answer_wins_and_ends_the_trace():
    t = parse_trace("Final Answer: Kavo\nFinal Answer: Tesu\n")
    assert t.final_answer == "Kavo" and t.steps == ()
    t = parse_trace(f"Thought: a\nFinal Answer: Kavo  \nmore text\nAction: {LOOKUP}\nFinal Answer: Tesu")
    assert t.final_answer == "Kavo" and t.steps == (Step("a"),)  # the action after it is ignored
    assert parse_trace("Final Answer:").final_answer == ""  # present but empty
    assert parse_trace("Thought: the Final Answer: is Kavo").final_answer is None  # not at a line start


def test_markers_and_grouping():
    t = parse_trace("  Thought :  spaced\n\tAction: x\naction: lower case is text\nObservation: o\n"
                    "Observation: o2\nAction: y\nAction: z\nThought: t\nline two\n")
    assert [(s.thought, s.action and s.action.raw, s.observation) for s in t.steps] == [
        ("spaced", "x\naction: lower case is text", "o"), (None, None, "o2"), (None, "y", None), (None, "z", None),
        ("t\nline two", None, None)]
    assert [a.raw for a in t.actions] == ["x\naction: lower case is text", "y", "z"]
    assert parse_trace("") == Trace() and parse_trace("no markers\n") == Trace(preamble="no markers")
    crlf = parse_trace("Thought: a\r\nAction: search[{\"query\": \"q\"}]\r\nFinal Answer: b\r\n")
    assert parse_trace("\u2028Action: x").preamble == "\u2028Action: x"  # U+2028 is no line break here
    assert crlf.steps[0].thought == "a" and crlf.actions[0].ok and crlf.final_answer == "b"


FRAGMENTS = ["Thought:", "Action:", "Observation:", "Final Answer:", "  Action :", "action:", "Final Answer", "\n",
             "\n", " ", "lookup[", "search[", "]", "[", "{", "}", '"', "\\", ":", ",", '{"entity": "', '"}]', "null",
             "1e999", "-0", "[[[[", "}}}}", "NaN", "\r\n", "\u2028", "\x00", "é", "🙂", "\ud800", "Kavo", "Tesu"]


def fuzz_string(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randrange(40)):
        parts.append(rng.choice(FRAGMENTS) if rng.random() < 0.8 else chr(rng.randrange(0x110000)))
    return "".join(parts)


def cpu_seconds(text: str, repeats: int = 1) -> float:
    """The least of ``repeats`` timings of ``parse_trace(text)`` in this process's CPU time (another job on the
    machine does not inflate it; the least of several drops a one-off pause, a pathological input is slow every
    time)."""
    best = math.inf
    for _ in range(repeats):
        start = time.process_time()
        parse_trace(text)
        best = min(best, time.process_time() - start)
    return best


def test_ten_thousand_fuzzed_strings_never_raise_and_are_fast():
    # No wall-clock budget (the suite runs on unknown machines): each bound is relative to this machine's own
    # speed, measured in the same test, and wide enough that only super-linear parsing crosses it.
    rng = random.Random(0)
    times, texts = [], []
    for _ in range(10_000):
        s = fuzz_string(rng)
        start = time.process_time()
        t = parse_trace(s)
        times.append(time.process_time() - start)
        texts.append(s)
        assert isinstance(t, Trace) and all(isinstance(a, Action) for a in t.actions)
        assert parse_trace(format_trace(t)) == t
    # a fuzz string is ≤ 40 fragments (≤ 40× the shortest): linear parsing keeps every one within ~40× the mean;
    # catastrophic backtracking on a few hundred characters costs ≥ 1e4× (measured: the slowest is ~10× the mean)
    mean = sum(times) / len(times)
    slowest = max(range(len(times)), key=times.__getitem__)
    tick = time.get_clock_info("process_time").resolution  # (a coarse clock reads a short call as 0 or a tick)
    assert cpu_seconds(texts[slowest], repeats=3) < 1000 * mean + 10 * tick, texts[slowest][:80]
    # linear in the length: 10× the text costs ~10× the time (measured 7×), quadratic would cost 100×; the bound
    # is their geometric mean, √(10 · 100) ≈ 32 (each timing the least of 3)
    def big(n: int) -> str:
        return ("Thought: " + "x" * n + "\nAction: lookup[" + "[" * n + "\n") * 3

    assert len(parse_trace(big(200_000)).actions) == 3
    ratio = cpu_seconds(big(200_000), repeats=3) / max(cpu_seconds(big(20_000), repeats=3), 10 * tick)
    assert ratio < math.sqrt(10 * 100), ratio


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.text() | st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), max_size=30).map("".join))
def test_any_string_parses_and_reformats_to_the_same_trace(s):
    t = parse_trace(s)
    assert parse_trace(format_trace(t)) == t


_LINE = st.text(st.characters(exclude_characters="\n\r", exclude_categories=("Cs",)), max_size=20).map(str.strip)
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6)
                     | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                     max_leaves=6)
_ACTION = (st.builds(Action.of, st.from_regex(r"[A-Za-z0-9_.-]{1,8}", fullmatch=True),
                     st.dictionaries(st.text(max_size=4), _JSON, max_size=3))
           | _LINE.map(parse_action))
_STEP = st.builds(Step, st.none() | _LINE, st.none() | _ACTION, st.none() | _LINE).filter(
    lambda s: (s.thought, s.action, s.observation) != (None, None, None))


def _slots(step: Step) -> list[int]:
    return [i for i, v in enumerate((step.thought, step.action, step.observation)) if v is not None]


def _canonical(steps: list[Step]) -> bool:
    """No step could be merged into the one before it (the parser starts a step only when it must)."""
    return all(_slots(b)[0] <= _slots(a)[-1] for a, b in itertools.pairwise(steps))


@settings(max_examples=100, derandomize=True, deadline=None)
@given(st.lists(_STEP, max_size=5).filter(_canonical), st.none() | _LINE,
       _LINE.filter(lambda p: not _MARKER.match(p)))
def test_formatted_traces_parse_back(steps, final, preamble):
    trace = Trace(tuple(steps), final, preamble)
    assert parse_trace(format_trace(trace)) == trace
