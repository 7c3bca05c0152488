"""GSM8K, MATH and Countdown tasks: prompts (d1 templates, chat template or plain text), left-padded batches,
canvases, decoding, deterministic data order, rewards, and their config checks."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from dlmrl.config import Config, ConfigError, TaskConfig, apply_overrides, build_task, validate
from dlmrl.config.check_data import check_data_files as _check_data_files
from dlmrl.data import (
    TASKS,
    CountdownExample,
    CountdownTask,
    GSM8KExample,
    GSM8KTask,
    MathExample,
    MathTask,
    SudokuTask,
)
from dlmrl.data.prompts import D1_SYSTEM_PROMPT
from tests.data.text_helpers import text_tokenizer

WELL_FORMED = "<reasoning>\nr\n</reasoning>\n<answer>\n72\n</answer>\n"
EX = GSM8KExample("What is 8*9?", "72", "8*9 = <<8*9=72>>72")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_registered_next_to_sudoku():
    assert {"sudoku", "gsm8k", "math", "countdown"} <= set(TASKS.names())


def test_plain_prompt_left_padding_and_canvas():
    tok = text_tokenizer()
    task = GSM8KTask(tok, tok.mask_token_id, gen_length=8, train_examples=[EX])
    short = GSM8KExample("Hi?", "1")
    b = task.encode([EX, short])
    texts = [D1_SYSTEM_PROMPT + "\n\n" + e.question + "\n" for e in (EX, short)]
    assert b.prompt_ids.shape == (2, len(texts[0]))
    assert tok.decode(b.prompt_ids[0]) == texts[0]
    pad = len(texts[0]) - len(texts[1])
    assert b.prompt_mask[1].tolist() == [False] * pad + [True] * len(texts[1])
    assert bool((b.prompt_ids[1, :pad] == tok.pad_token_id).all())
    assert tok.decode(b.prompt_ids[1, pad:]) == texts[1]
    assert b.canvas.shape == (2, 8) and bool((b.canvas == tok.mask_token_id).all())
    assert bool(b.completion_mask.all())
    assert b.repeat(3).canvas.shape == (6, 8)


def test_chat_template_and_d1_eval_prefix():
    tok = text_tokenizer(chat=True)
    task = MathTask(tok, tok.mask_token_id, prompt_template="d1", test_prompt_template="d1_eval")
    train, test = MathExample("Find x.", "1"), MathExample("Find y.", "2", split="test")
    assert task.prompt_text(train) == ("<|user|>" + D1_SYSTEM_PROMPT + "\n\nYou are a math expert. You will be given "
                                       "a question to solve. Solve it step by step. Wrap the final answer in a "
                                       "\\boxed{}. \n\nFind x.<|end|><|assistant|>")
    assert task.prompt_text(test).startswith("<|user|>You are a math expert.")
    assert task.prompt_text(test).endswith("\n\nFind y.<|end|><|assistant|><reasoning>")
    plain = MathTask(tok, tok.mask_token_id, prompt_template="plain", chat_template="off")
    assert plain.prompt_text(train) == "Find x.\n"
    with pytest.raises(ValueError, match="no chat template"):
        MathTask(text_tokenizer(), 3, chat_template="on")


def test_countdown_prompts_and_custom_template():
    tok = text_tokenizer()
    ex = CountdownExample((30, 100, 93), 23)
    d1 = CountdownTask(tok, 3).prompt_text(ex)
    assert "Using only the numbers [30, 100, 93], create an arithmetic expression that evaluates to exactly 23." in d1
    assert d1.startswith(D1_SYSTEM_PROMPT + "\n")
    custom = CountdownTask(tok, 3, prompt_template="Reach {target} with {nums}.").prompt_text(ex)
    assert custom == "Reach 23 with [30, 100, 93].\n"
    assert CountdownTask(tok, 3, prompt_template="plain").prompt_text(ex) == "Numbers: [30, 100, 93]\nTarget: 23\n"
    with pytest.raises(ValueError, match=r"unknown placeholder \{answer\}"):
        CountdownTask(tok, 3, prompt_template="{answer}")


def test_decode_stops_at_end_tokens():
    tok = text_tokenizer()
    task = GSM8KTask(tok, tok.mask_token_id)
    body = tok(WELL_FORMED, add_special_tokens=False)["input_ids"]
    junk = tok("junk", add_special_tokens=False)["input_ids"]
    rows = [body + [tok.convert_tokens_to_ids("<|eot_id|>")] + junk, body + [tok.eos_token_id] + junk,
            body + [tok.mask_token_id] * 5 + junk]
    width = max(map(len, rows))
    canvas = torch.tensor([r + [tok.eos_token_id] * (width - len(r)) for r in rows])
    from dlmrl.rewards.extract import UNFILLED

    # (mask tokens are not end tokens: they stay visible as unfilled positions)
    assert task.decode(canvas) == [WELL_FORMED, WELL_FORMED, WELL_FORMED + UNFILLED * 5 + "junk"]


def test_train_batches_deterministic_and_one_pass_per_epoch():
    tok = text_tokenizer()
    examples = [GSM8KExample(f"q{i}", str(i)) for i in range(12)]
    task = GSM8KTask(tok, 3, train_examples=examples)
    assert task.train_batch(4, 0, 1) == task.train_batch(4, 0, 1)
    assert task.train_batch(4, 0, 1) != task.train_batch(4, 1, 1)
    epoch = [e for step in range(3) for e in task.train_batch(4, 0, step)]
    assert sorted(e.question for e in epoch) == sorted(e.question for e in examples)
    assert len(task.train_batch(5, 0, 7)) == 5  # (crosses an epoch boundary)


def test_rewards_correctness_plus_d1_format_and_metrics():
    tok = text_tokenizer()
    task = GSM8KTask(tok, 3, format_rewards="d1")
    # 2.0 correct + 0.5 xmlcount + 0 soft (d1's pattern needs one-line reasoning) + 0.5 strict + 0.5 int
    assert task.rewards([EX, EX], [WELL_FORMED, "<answer>71</answer>"]) == [3.5, 0.5]
    assert GSM8KTask(tok, 3).rewards([EX], [WELL_FORMED]) == [2.0]
    assert GSM8KTask(tok, 3, format_rewards="strict_format, int_format").rewards([EX], [WELL_FORMED]) == [3.0]
    assert task.metrics([EX, EX], [WELL_FORMED, "nope"]) == {"accuracy": 0.5, "mean_reward": 1.75, "num_examples": 2}
    with pytest.raises(ValueError, match="unknown format reward 'bogus'"):
        GSM8KTask(tok, 3, format_rewards="bogus")
    cd = CountdownTask(tok, 3)
    ex = CountdownExample((30, 100, 93), 23)
    assert cd.rewards([ex] * 3, ["<answer>30-(100-93)</answer>", "<answer>30</answer>", "x"]) == [1.0, 0.1, 0.0]
    assert cd.metrics([ex] * 2, ["<answer>30-(100-93)</answer>", "<answer>30</answer>"])["accuracy"] == 0.5


def test_format_rewards_see_the_d1_eval_reasoning_prefix_placed_in_the_prompt():
    """d1_eval's prompt ends with ``<reasoning>``; the model's completion continues after it, and the format
    components judge prefix + completion (the answer as written), so a well-formed answer scores in full."""
    tok = text_tokenizer()
    task = GSM8KTask(tok, 3, prompt_template="d1_eval", format_rewards="d1")
    assert task.prompt_text(EX).endswith("<reasoning>")
    completion = WELL_FORMED.removeprefix("<reasoning>")
    assert completion != WELL_FORMED  # (the fixture starts with the prefix)
    assert task.rewards([EX], [completion]) == GSM8KTask(tok, 3, format_rewards="d1").rewards([EX], [WELL_FORMED])


def test_naming_the_default_hub_set_keeps_its_subset():
    from dlmrl.config import TaskConfig

    named = GSM8KTask.sources(TaskConfig(name="gsm8k", dataset="openai/gsm8k"))
    assert named["train"][:3] == ("openai/gsm8k", "train", "main") and named["test"][2] == "main"
    other = GSM8KTask.sources(TaskConfig(name="gsm8k", dataset="me/gsm8k-copy"))
    assert other["train"][2] is None  # (another set: only an explicit task.subset)


def test_sft_answers():
    tok = text_tokenizer()
    assert GSM8KTask(tok, 3).sft_answer(EX) == "<reasoning>\n8*9 = 72\n</reasoning>\n<answer>\n72\n</answer>"
    m = MathExample("p", "\\frac{1}{2}", "Half of it.")
    assert MathTask(tok, 3).sft_answer(m) == ("<reasoning>\nHalf of it.\n</reasoning>\n<answer>\n\\boxed{\\frac{1}{2}}"
                                               "\n</answer>")


def test_math_task_scores_with_math_verify():
    pytest.importorskip("math_verify")
    from dlmrl.rewards.math_verifier import MathVerifier

    tok = text_tokenizer()
    verifier = MathVerifier(timeout=2.0, num_workers=1)
    try:
        task = MathTask(tok, 3, verifier=verifier, format_rewards="d1")
        ex = MathExample("p", "\\frac{1}{2}")
        # correct 2.0 + boxed_in_answer 0.5 * (1 + 1)
        assert task.rewards([ex, ex], ["<answer>\\boxed{0.5}</answer>", "<answer>1/3</answer>"]) == [3.0, 0.75]
    finally:
        verifier.close()


def test_build_task_from_local_files(tmp_path):
    tok = text_tokenizer()
    train = write_jsonl(tmp_path / "train.jsonl", [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(6)])
    test = write_jsonl(tmp_path / "test.jsonl", [{"question": "t", "answer": "#### 7"}])
    cfg = TaskConfig(name="gsm8k", train_file=train, test_file=test, cache_dir=str(tmp_path / "cache"))
    task = build_task(cfg, tok, tok.mask_token_id, gen_length=24)
    assert isinstance(task, GSM8KTask) and task.gen_length == 24
    assert task.test_batch(1) == [GSM8KExample("t", "7", "", "test")]
    assert len(task.train_batch(3, 0, 0)) == 3
    with pytest.raises(ValueError, match="asked for 2 held-out"):
        task.test_batch(2)
    # the trainer delegates to build_task with sampling.gen_length
    from dlmrl.training.run_setup import build_task as trainer_build_task

    full = Config()
    full.task, full.sampling.gen_length = cfg, 32
    built = trainer_build_task(full, SimpleNamespace(tokenizer=tok, mask_token_id=tok.mask_token_id))
    assert isinstance(built, GSM8KTask) and built.gen_length == 32
    sudoku = build_task(TaskConfig(), SimpleNamespace(get_vocab=lambda: {str(d): d for d in range(10)}), 3)
    assert isinstance(sudoku, SudokuTask) and sudoku.gen_length == 16


def test_countdown_num_numbers_filter(tmp_path):
    rows = [{"nums": [1, 2, 3], "target": 6}, {"nums": [1, 2, 3, 4], "target": 10}]
    path = write_jsonl(tmp_path / "cd.jsonl", rows)
    cache = str(tmp_path / "cache")
    cfg = TaskConfig(name="countdown", train_file=path, test_file=path, num_numbers=3, cache_dir=cache)
    assert [e.nums for e in CountdownTask.load_split(cfg, "train")] == [(1, 2, 3)]
    cfg.num_numbers = 5
    with pytest.raises(ConfigError, match=r"config key 'task.train_file': .*no examples with 5 numbers"):
        _check_data_files(cfg)


def test_config_checks_name_the_field(tmp_path):
    cache = str(tmp_path / "cache")
    good = write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "#### 1"}] * 3)
    bad = write_jsonl(tmp_path / "b.jsonl", [{"question": "q", "answer": "#### 1"}, {"question": "q", "answer": "?"}])
    base = {"name": "gsm8k", "train_file": good, "test_file": good, "cache_dir": cache}
    assert _check_data_files(TaskConfig(**base)) == 3
    cases = [
        (dict(base, train_file=bad), rf"config key 'task.train_file': {bad} line 2: field 'answer'"),
        (dict(base, prompt_template="{foo}"), r"config key 'task.prompt_template': unknown placeholder \{foo\}"),
        (dict(base, test_prompt_template="d2"), r"config key 'task.test_prompt_template': not a built-in"),
        (dict(base, format_rewards="xml"), r"config key 'task.format_rewards': unknown format reward 'xml'"),
        (dict(base, chat_template="yes"), r"config key 'task.chat_template'"),
        (dict(base, verify_timeout=0.0), r"config key 'task.verify_timeout'"),
        (dict(base, test_file=None, dataset=good), r"config key 'task.test_split': .* is a single file"),
        (dict(base, split=""), r"config key 'task.split'"),
    ]
    for fields, message in cases:
        with pytest.raises(ConfigError, match=message):
            _check_data_files(TaskConfig(**fields))
    # a hub test split is not downloaded here: its size is unknown (and never limits eval.num_puzzles)
    assert _check_data_files(TaskConfig(name="gsm8k", train_file=good, cache_dir=cache)) == float("inf")


def test_validate_reports_bad_records_before_any_model(tmp_path):
    bad = write_jsonl(tmp_path / "b.jsonl", [{"question": "q", "answer": "#### 1"}, {"question": "q"}])
    cfg = Config()
    apply_overrides(cfg, ["task.name=gsm8k", f"task.train_file={bad}", f"task.test_file={bad}",
                          f"task.cache_dir={tmp_path / 'cache'}"])
    with pytest.raises(ConfigError, match=rf"'task.train_file': {bad} line 2: field 'answer': missing or null"):
        validate(cfg)


def test_unparsable_math_golds_in_local_files_are_reported_when_the_config_is_checked(tmp_path):
    pytest.importorskip("math_verify")
    rows = [{"problem": "p1", "answer": "\\frac{1}{2}"}, {"problem": "p2", "answer": "???"},
            {"problem": "p3", "answer": "42"}]
    data = write_jsonl(tmp_path / "math.jsonl", rows)
    cfg = TaskConfig(name="math", train_file=data, test_file=data, cache_dir=str(tmp_path / "cache"))
    with pytest.warns(UserWarning, match=r"1 of 3 gold answers .* score 0 .*math.jsonl line 2: '\?\?\?'"):
        assert _check_data_files(cfg) == 3


@pytest.mark.parametrize("name", ["gsm8k", "sudoku_text"])
def test_a_completion_holding_the_mask_token_never_reads_as_a_valid_answer(name):
    """'4[MASK]2' must not decode to '42' (rewarded as right): the mask position is kept as a marker and the
    completion scores 0, with no cell or digit shifted."""
    from dlmrl.data.sudoku import SudokuExample
    from dlmrl.data.sudoku_text import SudokuTextTask, _as_text
    from dlmrl.rewards.extract import UNFILLED

    tok = text_tokenizer()
    M = tok.mask_token_id
    if name == "gsm8k":
        task = GSM8KTask(tok, M, gen_length=24, train_examples=[EX])
        example, answer = GSM8KExample("q", "42"), "<answer>4{}2</answer>"
    else:
        task = SudokuTextTask(tok, M, gen_length=40)
        example = _as_text([SudokuExample("0234341221434321", "1234341221434321")], "test")[0]
        answer = "<answer>{}234341221434321</answer>"
    ids = [tok.convert_tokens_to_ids(c) if c != "{" else M for c in answer.replace("{}", "{")]
    (text,) = task.decode(torch.tensor([ids]))
    assert UNFILLED in text and text.replace(UNFILLED, "") == answer.replace("{}", "")
    assert task.rewards([example], [text]) == [0.0]
    assert not task.is_correct(example, text)
    clean = answer.replace("{}", "1" if name != "gsm8k" else "")
    assert task.rewards([example], [clean])[0] > 0  # (the same answer without the mask scores)
    metric = "accuracy" if name == "gsm8k" else "cell_accuracy"
    assert task.metrics([example], [text])[metric] == 0.0
