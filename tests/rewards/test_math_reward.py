"""MATH reward: extraction, math-verify equivalence in worker processes, timeouts, threads, no ``eval``."""

from __future__ import annotations

import builtins
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dlmrl.rewards import math_verifier
from dlmrl.rewards.math_reward import CORRECT, math_answer, math_correctness, math_gold, math_reward
from dlmrl.rewards.math_verifier import MathVerifier, MathVerifierError, too_costly

pytest.importorskip("math_verify")


@pytest.fixture(scope="module")
def verifier():
    v = MathVerifier(timeout=2.0, num_workers=2).start()
    yield v
    v.close()


def test_answer_and_gold_extraction():
    assert math_answer(r"so $\boxed{\frac{14}{3}}$.") == r"\frac{14}{3}"
    assert math_answer(r"<answer>$\frac{14}{3}$</answer>") == r"\frac{14}{3}"  # no box: the answer pair
    assert math_answer(r"\boxed{\frac{14}{3}") is None  # cut off
    assert math_answer("no answer") is None
    assert math_gold(r"We get $\boxed{(3, \frac{\pi}{2})}$.") == r"(3, \frac{\pi}{2})"
    assert math_gold(r" \frac{14}{3} ") == r"\frac{14}{3}"
    with pytest.raises(ValueError, match="empty"):
        math_gold("  ")


@pytest.mark.parametrize("text, gold, expected", [
    (r"<answer>\boxed{\dfrac{14}{3}}</answer>", r"\frac{14}{3}", 2.0),
    (r"\boxed{14/3}", r"\frac{14}{3}", 2.0),
    (r"<answer>\frac{14}{3}</answer>", r"\frac{14}{3}", 2.0),
    (r"\boxed{4.67}", r"\frac{14}{3}", 0.0),
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"(3, \frac{\pi}{2})", 2.0),
    (r"\boxed{10.0}", "10", 2.0),
    (r"\boxed{11}", "10", 0.0),
    (r"\boxed{\frac{14}{3}", r"\frac{14}{3}", 0.0),  # unbalanced
    ("<answer>\n\\boxed{28\n</answer>", "28", 0.0),  # an unclosed box inside <answer>: no answer (issue 14)
    ("<answer>\\boxed{28</answer>", "28", 0.0),
    ("I don't know", "10", 0.0),
])
def test_math_correctness(verifier, text, gold, expected):
    assert math_correctness(text, gold, verifier) == expected


def test_an_unclosed_box_in_the_answer_region_scores_zero_as_in_gsm8k(verifier):
    from dlmrl.rewards.gsm8k import gsm8k_correctness

    text = "<answer>\n\\boxed{28\n</answer>"
    assert math_answer(text) is None
    assert math_correctness(text, "28", verifier) == 0.0 == gsm8k_correctness(text, "28")
    assert math_correctness("<answer>\n\\boxed{28}\n</answer>", "28", verifier) == 2.0  # closed: right


def test_math_reward_trl_shape(verifier):
    completions = [r"\boxed{\frac12}", [{"role": "assistant", "content": r"\boxed{0.5}"}], r"\boxed{2}"]
    assert math_reward(None, completions, answer=[r"$\boxed{\frac{1}{2}}$"] * 3, verifier=verifier) == [2.0, 2.0, 0.0]


def test_too_costly_refuses_towers_without_a_worker():
    for s in (r"9^{9^{9}}", "9**9**9", r"2^{10!}", r"10^{123456}", "123456!", r"x^{(2^3)}"):
        assert too_costly(s), s
    for s in (r"2^{10}", r"\frac{x^2}{3}", "5!", r"(x+1)^{2} + y^3", r"\sqrt{2}"):
        assert not too_costly(s), s


def test_timeout_kills_the_worker_and_the_spare_serves(verifier):
    """A check past the timeout returns at the timeout (the worker killed, counted), and the next check is
    answered by the spare at once. The time bounds are in units of this machine's own latency for a cheap
    check, measured first (a wall-clock bound on an unknown, busy machine would be a guess); a miss is
    measured again before it fails."""
    v = MathVerifier(timeout=0.3, num_workers=2).start()

    def timed(gold: str, pred: str) -> tuple[bool, float]:
        t0 = time.monotonic()
        out = v.equivalent(gold, pred)
        return out, time.monotonic() - t0

    try:
        # the pool's latency for a cheap check, the slowest of 4 (distinct pairs: answers are cached), which
        # includes a worker's first check; the documented overhead past the timeout is "a few milliseconds"
        latency = max(timed(rf"\boxed{{{k}}}", rf"\boxed{{\frac{{{2 * k}}}{{2}}}}")[1] for k in range(3, 7))
        slack = 10 * latency
        for attempt in range(2):  # (timeouts are not cached: the same hang runs again)
            out, hang = timed(r"\boxed{1}", r"\boxed{(10^{10})!}")  # passes the pre-check, hangs sympy
            assert out is False and v.timeouts == attempt + 1 and v.lost == 0
            out, after = timed(r"\boxed{2}", rf"\boxed{{\frac{{{4 + 2 * attempt}}}{{{2 + attempt}}}}}")
            assert out is True and v.timeouts == attempt + 1  # answered, no second timeout
            if hang < v.timeout + slack and after < slack:
                break
        else:
            pytest.fail(f"past the timeout {v.timeout} s: {hang:.3f} s, then {after:.3f} s (latency {latency:.3f} s)")
    finally:
        v.close()


def test_thread_safe(verifier):
    pairs = [(r"\boxed{\frac{1}{2}}", r"\boxed{0.5}", True), (r"\boxed{3}", r"\boxed{4}", False),
             (r"\boxed{x+1}", r"\boxed{1+x}", True), (r"\boxed{\sqrt{4}}", r"\boxed{2}", True)] * 4
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda p: verifier.equivalent(p[0], p[1]), pairs))
    assert got == [p[2] for p in pairs]


def test_worker_that_cannot_start_raises_with_its_message(tmp_path, monkeypatch):
    script = tmp_path / "worker.py"
    script.write_text("import socket, sys\n"
                      "s = socket.socket(fileno=int(sys.argv[1]))\n"
                      "s.sendall(b'error ImportError: No module named math_verify\\n')\n")
    monkeypatch.setattr(math_verifier, "_WORKER", str(script))
    v = MathVerifier(timeout=0.5, num_workers=1, startup_timeout=20)
    with pytest.raises(MathVerifierError, match="No module named math_verify"):
        v.equivalent(r"\boxed{1}", r"\boxed{1}")


def test_worker_never_evaluates_completion_text(monkeypatch):
    """The worker's check (run here in-process): the completion's text never reaches ``eval``/``exec``.

    sympy itself calls them on code it generates: ``sympy.Number("2")`` (latex2sympy's numeric lexer tokens)
    goes through ``sympify`` (``eval("Integer (2 )")``), and sympy's polynomial code builds helper functions
    with ``exec``. None of that code may contain text from the completion.
    """
    from dlmrl.rewards._math_worker import make_check

    check = make_check()  # (imports first: sympy's import-time exec is not the check's)
    sources = []
    real_eval, real_exec = builtins.eval, builtins.exec

    def spy(real):
        def call(source, *args, **kwargs):
            if isinstance(source, str):
                sources.append(source)
            return real(source, *args, **kwargs)
        return call

    monkeypatch.setattr(builtins, "eval", spy(real_eval))
    monkeypatch.setattr(builtins, "exec", spy(real_exec))
    for pred in (r"\boxed{__import__('os').system('echo pwned')}", r"\boxed{open('/etc/passwd').read()}",
                 r"\boxed{\frac{1}{2}}", r"\boxed{x^2+1.5}", r"\boxed{exec('1')}", "\\boxed{eval(\"2\")}"):
        check(r"\boxed{\frac{1}{2}}", pred)
    markers = ("__import__", "system", "open", "passwd", "exec", "eval", "pwned")
    assert [s for s in sources if any(m in s for m in markers)] == []
    numbers = re.compile(r"(Integer|Float|Rational) \('?[0-9.]+'? \)")
    assert any(numbers.fullmatch(s) for s in sources)  # (the spy did see sympy's own calls)


def test_an_unparsable_gold_matches_nothing_not_even_itself(verifier):
    """math-verify reads '???' only as its own string; an identical completion must not score 2.0 against it."""
    assert math_correctness(r"<answer>\boxed{???}</answer>", "???", verifier) == 0.0
    assert not verifier.parsable("???") and verifier.parsable(r"\frac{1}{2}") and verifier.parsable("42")
    assert math_correctness(r"<answer>\boxed{42}</answer>", "42", verifier) == CORRECT


def test_a_timed_out_check_is_not_cached():
    v = MathVerifier(timeout=0.3, num_workers=2).start()
    try:
        slow = (r"\boxed{1}", r"\boxed{(10^{10})!}")
        assert v.equivalent(*slow) is False and v.timeouts == 1
        assert v.equivalent(*slow) is False and v.timeouts == 2  # checked again, not read from the cache
        assert slow not in v._cache
    finally:
        v.close()
