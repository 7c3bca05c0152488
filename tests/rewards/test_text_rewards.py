"""GSM8K, Countdown and d1's format rewards on typical outputs: values worked out by hand (exact floats)."""

from __future__ import annotations

import re

import pytest

from dlmrl.rewards import REWARDS
from dlmrl.rewards.countdown import countdown_reward, countdown_score, evaluate_expression
from dlmrl.rewards.extract import d1_answer, last_answer_pair, last_boxed
from dlmrl.rewards.format import (
    boxed_in_answer,
    int_format,
    soft_format,
    strict_format,
    xml_count,
    xmlcount_reward,
)
from dlmrl.rewards.gsm8k import gsm8k_correctness, gsm8k_gold, gsm8k_reward, parse_number

WELL_FORMED = "<reasoning>\nr\n</reasoning>\n<answer>\n72\n</answer>\n"


# -- extraction ---------------------------------------------------------------------------------------------
def test_extraction_rules():
    assert d1_answer("a <answer> 7 </answer> b") == "7"
    assert d1_answer("<answer>1</answer><answer>2") == "2"  # after the last opening tag
    assert d1_answer("no tags 5") == "no tags 5"
    assert last_answer_pair("<answer>1</answer> x <answer>2</answer> <answer>3") == "2"
    assert last_answer_pair("<answer>1") is None
    assert last_boxed(r"\boxed{1} then \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{1} then \boxed{\frac{1}{2}") is None  # the last box decides, even cut off
    assert last_boxed(r"so \boxed 5$ done") == "5"
    assert last_boxed(r"\fbox{x}") == "x"
    assert last_boxed("nothing") is None


# -- GSM8K --------------------------------------------------------------------------------------------------
def test_gsm8k_gold_removes_commas_and_checks_the_number():
    assert gsm8k_gold("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 1,234") == "1234"
    assert gsm8k_gold("-3") == "-3"
    with pytest.raises(ValueError, match="no numeric final answer"):
        gsm8k_gold("#### about seven")


@pytest.mark.parametrize("text, gold, expected", [
    ("<answer>72</answer>", "72", 2.0),
    ("<answer>\n72\n</answer>", "72", 2.0),
    ("<answer> 1,234 </answer>", "1234", 2.0),
    ("<answer>-3</answer>", "-3", 2.0),
    ("<answer>-3</answer>", "3", 0.0),
    ("<answer>\\boxed{72}</answer>", "72", 2.0),
    ("<answer>$72.00</answer>", "72", 2.0),
    ("<answer>72.</answer>", "72", 2.0),
    ("<answer>0.5</answer>", "0.50", 2.0),
    ("<answer>72 apples</answer>", "72", 0.0),
    ("<answer>12,34</answer>", "1234", 0.0),  # not a thousands grouping
    ("<answer>71</answer>", "72", 0.0),
    ("<answer>70</answer> wait <answer>72</answer>", "72", 2.0),
    ("<answer>72", "72", 2.0),  # cut off before </answer>: d1 still reads it
    ("The answer is 72", "72", 0.0),
    ("72", "72", 2.0),
    ("", "72", 0.0),
])
def test_gsm8k_correctness(text, gold, expected):
    assert gsm8k_correctness(text, gold) == expected


def test_parse_number():
    assert parse_number("1,234,567.5") * 2 == 2469135
    assert parse_number("−4") == -4  # U+2212
    assert parse_number("1e5") is None and parse_number("1/2") is None and parse_number("٣") is None


def test_gsm8k_reward_trl_shape():
    completions = ["<answer>18</answer>", [{"role": "assistant", "content": "<answer>18</answer>"}], "x"]
    assert gsm8k_reward(None, completions, answer=["#### 18"] * 3) == [2.0, 2.0, 0.0]
    with pytest.raises(ValueError, match="align"):
        gsm8k_reward(None, completions, answer=["18"])


# -- d1 format components -------------------------------------------------------------------------------------
def test_xml_count_values():
    assert xml_count(WELL_FORMED) == 0.5
    # 3 trailing characters: -0.003 for each closing-tag count
    assert round(xml_count(WELL_FORMED + "xyz"), 9) == 0.494
    assert xml_count("<answer>72</answer>") == 0.0
    assert xml_count("<reasoning>\nr\n</reasoning>\n") == 0.25
    assert xmlcount_reward(None, [WELL_FORMED, "x"]) == [0.5, 0.0]


def test_strict_soft_and_int_format():
    assert strict_format(WELL_FORMED) == 0.5
    assert strict_format(WELL_FORMED + "xyz") == 0.0
    assert strict_format("<reasoning>\nline 1\nline 2\n</reasoning>\n<answer>\n72\n</answer>\n") == 0.0  # (d1: one line)
    assert soft_format("<reasoning>r</reasoning> <answer>72</answer>") == 0.5
    assert soft_format("<reasoning>r</reasoning>\n\n<answer>72</answer> tail") == 0.5  # \s* crosses newlines
    assert soft_format(WELL_FORMED) == 0.0  # d1's pattern has no DOTALL: multi-line reasoning fails
    assert soft_format("x<reasoning>r</reasoning><answer>72</answer>") == 0.0  # anchored at the start
    assert int_format(WELL_FORMED) == 0.5
    assert int_format("<answer>-3</answer>") == 0.0 and int_format("<answer>7.5</answer>") == 0.0
    assert int_format("<answer>\n</answer>") == 0.0 and int_format("<answer>²</answer>") == 0.0


def test_soft_format_agrees_with_d1_regex():
    pattern = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>")
    pieces = ["<reasoning>", "</reasoning>", "<answer>", "</answer>", "\n", " ", "x", "\t"]
    import itertools

    for n in range(1, 6):
        for combo in itertools.product(pieces, repeat=n):
            text = "".join(combo)
            for t in (text, "<reasoning>" + text):
                assert soft_format(t) == (0.5 if pattern.match(t) else 0.0), t


def test_boxed_in_answer_values():
    assert boxed_in_answer("<answer>\\boxed{1}</answer>") == 1.0
    assert boxed_in_answer("<answer>1</answer>") == 0.75
    assert boxed_in_answer("\\boxed{1}") == 0.5
    assert boxed_in_answer("1") == 0.25


# -- Countdown -----------------------------------------------------------------------------------------------
NUMS, TARGET = [30, 100, 93], 23


@pytest.mark.parametrize("text, expected", [
    ("<answer>30-(100-93)</answer>", 1.0),
    ("<reasoning>\n...\n</reasoning>\n<answer>\n30 - (100 - 93)\n</answer>", 1.0),
    ("<answer>\\boxed{30 - (100 - 93)}</answer>", 1.0),
    ("<answer>30 - (100 - 93) = 23</answer>", 1.0),
    ("<answer>(30)-((100)-(93))</answer>", 1.0),
    ("<answer>-(100-93-30)</answer>", 1.0),
    ("<answer>30+100-93</answer>", 0.1),  # 37
    ("<answer>30+100</answer>", 0.1),  # a number missing
    ("<answer>30-(100-93)+0</answer>", 0.1),  # a number that is not given
    ("<answer>30-(100-93)*1</answer>", 0.1),
    ("<answer>30.0-(100-93)</answer>", 0.1),  # float literal
    ("<answer>30**1-(100-93)</answer>", 0.1),
    ("<answer>__import__('os').system('true')</answer>", 0.1),
    ("<answer></answer>", 0.1),
    ("<answer>30-(100-93)", 0.0),  # no closing tag: no expression
    ("30-(100-93)", 0.0),
])
def test_countdown_score(text, expected):
    assert countdown_score(text, NUMS, TARGET) == expected


def test_countdown_exact_arithmetic_and_division_by_zero():
    assert countdown_score("<answer>3*(1/3)</answer>", [1, 3, 3], 1) == 1.0  # exact, not 0.999...
    assert countdown_score("<answer>6/3*4</answer>", [6, 3, 4], 8) == 1.0
    assert countdown_score("<answer>4/(3-3)</answer>", [3, 3, 4], 8) == 0.1
    assert evaluate_expression("2 × 3 ÷ 1", [2, 3, 1]) == 6
    assert evaluate_expression("2 \\times 3 \\div 1", [2, 3, 1]) == 6
    assert evaluate_expression("(" * 300 + "1" + ")" * 300, [1]) is None  # over 256 characters


def test_countdown_reward_columns():
    texts = ["<answer>30-(100-93)</answer>", "<answer>1</answer>", "none"]
    assert countdown_reward(None, texts, nums=[NUMS] * 3, target=[TARGET] * 3) == [1.0, 0.1, 0.0]
    assert countdown_reward(None, texts[:1], numbers=[NUMS], target=[TARGET]) == [1.0]
    with pytest.raises(ValueError, match="nums"):
        countdown_reward(None, texts, target=[TARGET] * 3)


def test_rewards_registry_names():
    assert {"gsm8k", "math", "countdown", "sudoku", "xmlcount", "soft_format", "strict_format", "int_format",
            "boxed_in_answer"} <= set(REWARDS.names())
