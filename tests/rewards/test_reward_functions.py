"""Reward functions as TRL takes them: None handled as TRL does (nansum, nanmean, nanstd), lengths and values
checked with errors that name the function, names resolved from the registry or import strings."""

from __future__ import annotations

import functools
import math
import sys

import pytest
import torch

from dlmrl.plugins import PluginError
from dlmrl.rewards.functions import RewardFunctionError, RewardFunctions, resolve_reward_func


def first(prompts, completions, **columns):
    return [1.0, None, 3.0, None]


def second(prompts, completions, **columns):
    return [10.0, 20.0, None, None]


def test_none_rows_are_left_out_of_the_weighted_sum_and_the_statistics_as_trl_does():
    funcs = RewardFunctions([first, second], weights=[1.0, 0.5])
    with pytest.warns(UserWarning, match="1 of 4 completions got None from every reward function"):
        table = funcs.table(["p"] * 4, ["a", "b", "c", "d"], {})
    assert torch.isnan(table).tolist() == [[False, False], [True, False], [False, True], [True, True]]
    # TRL: (rewards_per_func * reward_weights).nansum(dim=1); a row where every function said None gets 0
    assert funcs.combine(table).tolist() == [1.0 + 5.0, 10.0, 3.0, 0.0]
    m = funcs.metrics(table)
    assert m["rewards/first/mean"] == 2.0 and m["rewards/second/mean"] == 15.0  # nanmean
    assert m["rewards/first/std"] == pytest.approx(math.sqrt(2.0))  # nanstd, Bessel-corrected: ((1-2)² + (3-2)²) / 1
    assert m["rewards/second/std"] == pytest.approx(math.sqrt(50.0))


def test_statistics_of_a_function_that_returned_too_few_values_are_none():
    funcs = RewardFunctions([lambda p, c, **k: [None, 2.0]])
    with pytest.warns(UserWarning, match="1 of 2 completions got None"):
        m = funcs.metrics(funcs.table(["p", "q"], ["a", "b"], {}))
    assert m == {"rewards/<lambda>/mean": 2.0, "rewards/<lambda>/std": None}


def test_columns_arrive_as_keyword_lists_aligned_with_the_completions():
    seen = {}

    def exact(prompts, completions, answer, **rest):
        seen.update(prompts=prompts, rest=rest)
        return [float(c == a) for c, a in zip(completions, answer)]

    funcs = RewardFunctions(exact)
    table = funcs.table(["p1", "p2"], ["7", "8"], {"answer": ["7", "9"], "id": [1, 2]})
    assert table[:, 0].tolist() == [1.0, 0.0]
    assert seen == {"prompts": ["p1", "p2"], "rest": {"id": [1, 2]}}


def test_a_wrong_length_names_the_function_and_both_lengths():
    def short(prompts, completions, **columns):
        return [1.0]

    with pytest.raises(RewardFunctionError, match=r"reward function 'short' returned 1 values for 3 completions "
                                                  r"\(expected 3"):
        RewardFunctions([short]).table(["p"] * 3, ["a", "b", "c"], {})


@pytest.mark.parametrize("value, match", [("1.0", "returned str '1.0'; it must return a list of 2"),
                                          (["x", 1.0], "returned str 'x' for completion 0; expected a float or None"),
                                          (3.0, "returned float 3.0; it must return a list")])
def test_values_that_are_not_numbers_are_refused(value, match):
    with pytest.raises(RewardFunctionError, match=match):
        RewardFunctions([lambda p, c, **k: value]).table(["p", "q"], ["a", "b"], {})


def test_an_empty_batch_calls_no_function():
    def boom(prompts, completions, **columns):
        raise AssertionError("called on an empty batch")

    assert RewardFunctions([boom]).table([], [], {}).shape == (0, 1)


def test_names_follow_trl_and_repeats_get_a_suffix():
    funcs = RewardFunctions([first, first, functools.partial(second), "gsm8k"])
    assert funcs.names == ("first", "first_2", "second", "gsm8k")


def test_weights_are_checked():
    with pytest.raises(ValueError, match=r"reward_weights: 1 weights for 2 reward functions \(first, second\)"):
        RewardFunctions([first, second], [1.0])
    with pytest.raises(ValueError, match="reward_weights entry 0: expected a finite number"):
        RewardFunctions([first], [float("nan")])
    with pytest.raises(ValueError, match="give at least one reward function"):
        RewardFunctions([])


def test_registry_names_and_import_strings_resolve(tmp_path, monkeypatch):
    from dlmrl.rewards import REWARDS

    assert resolve_reward_func("gsm8k") == ("gsm8k", REWARDS.get("gsm8k"))
    (tmp_path / "user_rewards_a.py").write_text("def exact_match(prompts, completions, **kw):\n"
                                                "    return [1.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    name, fn = resolve_reward_func("user_rewards_a:exact_match")
    assert name == "exact_match" and fn([], ["a"]) == [1.0]
    assert resolve_reward_func("user_rewards_a.exact_match")[1] is fn  # TRL's dotted form
    sys.modules.pop("user_rewards_a", None)


def test_bad_names_say_what_is_wrong(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"entry 0: unknown reward 'gsm8'\. Did you mean 'gsm8k'\?.*an import "
                                         r"string module:function"):
        RewardFunctions(["gsm8"], what="")
    with pytest.raises(PluginError, match=r"cannot import module 'no_such_pkg.rewards' \(module 'no_such_pkg' is not "
                                          r"installed or not on sys.path\)"):
        resolve_reward_func("no_such_pkg.rewards:exact_match")
    (tmp_path / "user_rewards_b.py").write_text("LIMIT = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match=r"module 'user_rewards_b' imports, but 'user_rewards_b' has no attribute "
                                          r"'exact_match'"):
        resolve_reward_func("user_rewards_b:exact_match")
    with pytest.raises(TypeError, match="'user_rewards_b:LIMIT' is a int, not a function"):
        resolve_reward_func("user_rewards_b:LIMIT")
    sys.modules.pop("user_rewards_b", None)


def test_a_row_that_makes_a_function_raise_gets_none_and_the_others_are_scored():
    """One bad row never stops a run: the batch call raises, each row is tried alone, the raising row gets None
    (NaN) with a warning naming its location; a function that fails on every row still raises."""
    def picky(prompts, completions, gold, **_):
        return [float(len(c)) / int(g) for c, g in zip(completions, gold)]  # (int("") raises)

    funcs = RewardFunctions([picky])
    with pytest.warns(UserWarning, match=r"raised on 1 of 3 rows.*data.jsonl line 2: ValueError"), \
            pytest.warns(UserWarning, match="1 of 3 completions got None from every reward function"):
        table = funcs.table(["p"] * 3, ["ab", "abc", "abcd"], {"gold": ["1", "", "2"]},
                            ["data.jsonl line 1", "data.jsonl line 2", "data.jsonl line 3"])
    assert table[:, 0].tolist()[0] == 2.0 and math.isnan(table[1, 0]) and table[2, 0] == 2.0
    with pytest.raises(ValueError):
        funcs.table(["p"] * 2, ["a", "b"], {"gold": ["", ""]})


def test_math_and_gsm8k_rewards_give_none_for_an_unusable_gold_and_report_it_when_the_data_loads():
    from dlmrl.rewards import gsm8k_reward, math_reward

    assert gsm8k_reward(None, ["<answer>4</answer>", "<answer>4</answer>"], answer=["#### 4", "#### "]) == [2.0, None]
    assert math_reward(None, ["\\boxed{4}", "\\boxed{4}"], answer=["4", "  "]) == [2.0, None]
    funcs = RewardFunctions(["math", "gsm8k"])
    with pytest.warns(UserWarning) as seen:
        funcs.check_rows({"answer": ["4", "", None]}, ["f line 1", "f line 2", "f line 3"])
    text = [str(w.message) for w in seen]
    assert any("'math' cannot score 2 of 3 rows" in t and "f line 2: field 'answer': empty gold answer" in t
               and "f line 3: field 'answer': missing or null" in t for t in text), text
    assert any("'gsm8k' cannot score 2 of 3 rows" in t for t in text), text


def _needs_solution(prompts, completions, solution, **columns):
    return [1.0] * len(completions)


def _no_kwargs(prompts, completions, solution):
    return [1.0] * len(completions)


def _one_positional(completions, **columns):
    return [1.0] * len(completions)


def _optional(prompts, completions, solution=None, *, hint="", **columns):
    return [1.0] * len(completions)


@pytest.mark.parametrize("fn, columns, match", [
    (_needs_solution, ["answer"], (r"'_needs_solution' needs a column 'solution' \(its parameter solution has no "
                                   r"default\), which the data does not have \(data.jsonl has the columns 'answer'\)")),
    (_needs_solution, [], r"\(data.jsonl has the columns none besides the prompt\)"),
    (_no_kwargs, ["solution", "id"], r"'_no_kwargs' has no parameter for the column 'id' and no \*\*kwargs"),
    (_one_positional, [], r"'_one_positional' takes 1 positional parameter, not the two \(prompts, completions\)"),
])
def test_a_signature_that_cannot_take_the_columns_is_refused_naming_the_function_and_column(fn, columns, match):
    """Checked when the data loads (it was a bare TypeError at the first scoring, after the "before" evaluation)."""
    with pytest.raises(RewardFunctionError, match=match):
        RewardFunctions([fn]).check_signatures(columns, "data.jsonl")


def test_signatures_that_fit_the_columns_pass():
    RewardFunctions([_needs_solution, _optional, _no_kwargs]).check_signatures(["solution"], "d")
    RewardFunctions([_optional, functools.partial(_needs_solution, solution=[1])]).check_signatures([], "d")
