"""Property tests: for any completion string, every text reward returns a float within 100 ms of CPU time,
never raises and never evaluates code.

Strings come from hypothesis (arbitrary Unicode, and sequences of the fragments the parsers look at: tags,
braces, operators, digits) plus fixed adversarial ones: exponent towers, deep nesting, 10^6 characters, many
unclosed tags. During each call ``builtins.eval``/``exec`` raise, and ``compile`` raises unless it only
builds an AST (``ast.parse``), so a reward that evaluated code would fail. The MATH reward's math-verify
runs in a worker process; ``test_math_reward.py`` checks that process separately. The MATH verifier here
has a 50 ms timeout, so a check that hangs sympy still returns in time (its worker is killed).

The budget is this process's CPU time (``time.process_time``), which another job on the machine does not
inflate: 100 ms, or for a long input 30 times a linear regex scan of the same text timed on the same machine
(a slower machine scans slower too; only super-linear work, which a 10^6-character input turns into minutes,
crosses it). Wall time is held to a loose bound that only a hang would pass. The figures to quote come from
``benchmarks/reliability.py``, run alone.
"""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dlmrl.audit import no_code_evaluation
from dlmrl.rewards.countdown import countdown_reward
from dlmrl.rewards.format import (
    boxed_in_answer_reward,
    int_format_reward,
    soft_format_reward,
    strict_format_reward,
    xmlcount_reward,
)
from dlmrl.rewards.gsm8k import gsm8k_reward
from dlmrl.rewards.math_reward import math_reward
from dlmrl.rewards.math_verifier import MathVerifier

pytest.importorskip("math_verify")

BUDGET_S = 0.1  # CPU seconds per call (the property's figure; the slowest reward measured 17 ms here), at least
LINEAR_SLACK = 30  # × a linear scan of the text (the rewards measured ≤ 3×); quadratic work on 10^6 chars: ≥ 1e4×
HANG_S = 5.0  # wall seconds per call: 100× the verifier's 50 ms timeout; only a hang (or a stuck kill) reaches it
FRAGMENTS = ["<answer>", "</answer>", "<reasoning>", "</reasoning>", "\\boxed{", "\\boxed ", "{", "}", "(", ")",
             "**", "^", "!", "9", "30", "100", "93", "+", "-", "*", "/", "=", "####", ",", ".", "\n", " ", "$",
             "\\frac", "x", "é", "٣", "\x00", "\\times", "_"]
ADVERSARIAL = [
    "9**9**9**9",
    "<answer>9**9**9**9</answer>",
    "<answer>\\boxed{9^{9^{9^{9}}}}</answer>",
    "\\boxed{9^{9^{9^{9}}}}",
    "<answer>" + "(" * 100_000 + "1" + ")" * 100_000 + "</answer>",
    "\\boxed{" + "{" * 100_000 + "1" + "}" * 100_000 + "}",
    "<answer>" + "-" * 1_000_000 + "1</answer>",
    "x" * 1_000_000,
    "<answer>" * 125_000,
    "<reasoning>" + "</reasoning><answer>" * 50_000,  # quadratic for d1's soft-format regex
    "<reasoning>\n" + "a" * 999_000 + "\n</reasoning>\n<answer>\n72\n</answer>\n",
    "\\boxed{" * 100_000,
    "<answer>\\boxed{" + "1+" * 400_000 + "1}</answer>",
    "<answer>__import__('os').system('echo pwned')</answer>",
    "<answer>30 - (100 - 93)</answer>",
    "\\boxed{(10^{10})!}",
    "\\boxed{" + "\\frac{1}{" * 200 + "2" + "}" * 200 + "}",
    "<answer>٣٠-(١٠٠-٩٣)</answer>",
    "\ud800\udfff\U0010ffff",
]


def linear_scan_seconds(text: str) -> float:
    """CPU seconds of a linear-time regex scan over ``text`` (the least of 3): this machine's unit of linear work."""
    best = float("inf")
    for _ in range(3):
        c0 = time.process_time()
        re.findall(r"[<>{}()\\^!*/=#$0-9]", text)
        best = min(best, time.process_time() - c0)
    return best


@pytest.fixture(scope="module")
def verifier():
    v = MathVerifier(timeout=0.05, num_workers=2).start()
    time.sleep(0.1)  # (the second worker forked too)
    yield v
    v.close()


def check_all(text: str, verifier: MathVerifier) -> None:
    calls = {
        "gsm8k": lambda: gsm8k_reward(None, [text], answer=["#### 72"]),
        "countdown": lambda: countdown_reward(None, [text], nums=[[30, 100, 93]], target=[23]),
        "math": lambda: math_reward(None, [text], answer=["\\frac{1}{2}"], verifier=verifier),
        "xmlcount": lambda: xmlcount_reward(None, [text]),
        "soft_format": lambda: soft_format_reward(None, [text]),
        "strict_format": lambda: strict_format_reward(None, [text]),
        "int_format": lambda: int_format_reward(None, [text]),
        "boxed_in_answer": lambda: boxed_in_answer_reward(None, [text]),
    }
    def timed(call):
        t0, c0 = time.perf_counter(), time.process_time()
        with no_code_evaluation():
            out = call()
        return out, time.perf_counter() - t0, time.process_time() - c0

    budget = None
    for name, call in calls.items():
        out, wall, cpu = timed(call)
        if cpu >= BUDGET_S:  # (a pathological input is slow every time; a one-off pause, GC or a pool thread, is not)
            cpu = min(cpu, timed(call)[2])
            budget = max(BUDGET_S, LINEAR_SLACK * linear_scan_seconds(text)) if budget is None else budget
        assert cpu < (budget or BUDGET_S), f"{name} took {cpu * 1000:.0f} ms of CPU on {text[:60]!r} (twice)"
        assert wall < HANG_S, f"{name} took {wall:.1f} s on {text[:60]!r}"
        assert len(out) == 1 and type(out[0]) is float, (name, out)


PROPERTY = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@PROPERTY
@given(st.text(max_size=300))
def test_any_unicode_string(verifier, text):
    check_all(text, verifier)


@PROPERTY
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join))
def test_any_sequence_of_parser_fragments(verifier, text):
    check_all(text, verifier)


@PROPERTY
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=40).map(lambda xs: "<answer>\\boxed{" + "".join(xs) + "}</answer>"))
def test_any_boxed_answer(verifier, text):
    check_all(text, verifier)


@pytest.mark.parametrize("text", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_strings(verifier, text):
    check_all(text, verifier)


@example("<answer>30-(100-93)</answer>")
@PROPERTY
@given(st.text(alphabet="0123456789+-*/() ", max_size=40))
def test_countdown_expressions_are_judged_without_eval(text):
    """Random arithmetic: the score is 1.0, 0.1 (never 0: an answer pair is there) and never raises."""
    with no_code_evaluation():
        (score,) = countdown_reward(None, [f"<answer>{text}</answer>"], nums=[[30, 100, 93]], target=[23])
    assert score in (1.0, 0.1)
