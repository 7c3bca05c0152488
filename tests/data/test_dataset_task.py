"""The dataset task: prompt column checked with errors naming it and the columns there are, prompts encoded as the
text tasks' machinery does (chat template or the text as written after BOS), reward inputs in TRL's form."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset

from dlmrl.config import Config, ConfigError, apply_overrides, validate
from dlmrl.data.dataset_task import DatasetTask
from dlmrl.data.loading import DataError
from dlmrl.models.tokenizer import build_char_tokenizer
from dlmrl.rewards.functions import RewardFunctions


def count_ones(prompts, completions, **columns):
    return [float(c.count("1")) for c in completions]


def make_task(train, test=(), tokenizer=None, **kw):
    tok = tokenizer or build_char_tokenizer()
    return DatasetTask(tok, tok.mask_token_id, 4, list(train), list(test),
                       reward_functions=RewardFunctions([count_ones]), **kw)


def test_a_dataset_without_the_prompt_column_names_it_and_the_columns_it_has():
    data = Dataset.from_dict({"question": ["1=", "2="], "answer": ["1", "2"]})
    with pytest.raises(ValueError, match=r"train_dataset: no prompt column 'prompt'; its columns are 'question', "
                                         r"'answer' \(rename one"):
        DatasetTask.examples_of(data, "train", "train_dataset")
    examples = DatasetTask.examples_of(data, "train", "train_dataset", prompt_column="question")
    assert [(e.prompt, e.columns) for e in examples] == [("1=", {"answer": "1"}), ("2=", {"answer": "2"})]


@pytest.mark.parametrize("rows, match", [
    ({"prompt": ["1=", " "]}, r"train_dataset row 1: field 'prompt': empty prompt"),
    ({"prompt": [[{"role": "user"}]]}, r"train_dataset row 0: field 'prompt': message 0 is"),
    ({"prompt": [3]}, r"train_dataset row 0: field 'prompt': expected text or a list of chat messages"),
    ({"prompt": ["1="], "completions": ["x"]}, r"column 'completions' has the name of the reward functions' own"),
])
def test_bad_rows_are_named(rows, match):
    with pytest.raises(ValueError, match=match):
        DatasetTask.examples_of(rows, "train", "train_dataset")


def test_plain_prompts_are_the_text_after_bos_and_the_canvas_is_gen_length_masks():
    tok = build_char_tokenizer()
    task = make_task(DatasetTask.examples_of({"prompt": ["12=", "[BOS]3="]}, "train", "d"), tokenizer=tok)
    batch = task.encode(task.train_examples)
    bos, pad, mask = tok.bos_token_id, tok.pad_token_id, tok.mask_token_id
    ids = [tok.convert_tokens_to_ids(c) for c in "123="]
    assert batch.prompt_ids.tolist() == [[bos, ids[0], ids[1], ids[3]], [pad, bos, ids[2], ids[3]]]
    assert batch.canvas.tolist() == [[mask] * 4] * 2 and batch.completion_mask.all()
    assert task.decode(batch.canvas.new_tensor([[ids[0], tok.eos_token_id, ids[1], ids[1]]])) == ["1"]


def test_chat_messages_use_the_chat_template_and_completions_take_trl_form():
    tok = build_char_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}={% endif %}"
    seen = {}

    def spy(prompts, completions, **columns):
        seen.update(prompts=prompts, completions=completions, columns=columns)
        return [1.0] * len(completions)

    rows = {"prompt": [[{"role": "user", "content": "12"}]], "id": [7]}
    task = DatasetTask(tok, tok.mask_token_id, 4, DatasetTask.examples_of(rows, "train", "d"), [],
                       reward_functions=RewardFunctions([spy]))
    ids = task.encode(task.train_examples).prompt_ids[0].tolist()
    assert tok.decode(ids) == "12="  # the template's text, no BOS added to it
    assert task.rewards(task.train_examples, ["34"]) == [1.0]
    assert seen == {"prompts": [[{"role": "user", "content": "12"}]],
                    "completions": [[{"role": "assistant", "content": "34"}]], "columns": {"id": [7]}}
    with pytest.raises(ValueError, match="d row 0: the prompt is chat messages but task.chat_template is off"):
        DatasetTask(tok, tok.mask_token_id, 4, task.train_examples, [], reward_functions=RewardFunctions([spy]),
                    chat_template="off")


def test_messages_without_a_chat_template_are_refused():
    examples = DatasetTask.examples_of({"prompt": [[{"role": "user", "content": "1"}]]}, "train", "d")
    with pytest.raises(ValueError, match="the tokenizer has no chat template"):
        make_task(examples)


def test_metrics_report_the_mean_reward_each_function_and_the_eval_metric():
    examples = DatasetTask.examples_of({"prompt": ["1=", "2="], "answer": ["11", "2"]}, "test", "d")

    def exact(prompts, completions, answer, **columns):
        return sum(c == a for c, a in zip(completions, answer)) / len(completions)

    task = make_task([], examples, eval_metric=exact)
    m = task.metrics(examples, ["11", "3"])
    assert m == {"mean_reward": 1.0, "rewards/count_ones/mean": 1.0, "num_examples": 2, "exact": 0.5}
    assert task.primary_metric == "exact"


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def dataset_config(**overrides) -> Config:
    cfg = Config()
    apply_overrides(cfg, [f"{k}={v}" for k, v in {"task.name": "dataset", "reward_funcs": "count_ones_registered",
                                                  "eval.before": "false", "eval.after": "false", **overrides}.items()])
    return cfg


@pytest.fixture
def registered():
    from dlmrl.rewards import REWARDS

    REWARDS.register("count_ones_registered")(count_ones)
    yield
    REWARDS._items.pop("count_ones_registered")


def test_config_validation_loads_local_files_and_names_the_missing_prompt_column(tmp_path, registered):
    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": "1=", "answer": "1"}])
    validate(dataset_config(**{"task.train_file": good}))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "1=", "answer": "1"}])
    with pytest.raises(ConfigError, match=r"config key 'task.train_file': .*bad.jsonl: no prompt column 'prompt' "
                                          r"\(task.prompt_column\); its columns are 'question', 'answer'"):
        validate(dataset_config(**{"task.train_file": bad}))
    validate(dataset_config(**{"task.train_file": bad, "task.prompt_column": "question"}))


@pytest.mark.parametrize("overrides, match", [
    ({}, r"config key 'task.dataset': the dataset task needs its prompts"),
    ({"task.train_file": "TRAIN", "eval.before": "true"}, r"config key 'eval.before': task 'dataset' has no held-out data"),
    ({"task.train_file": "TRAIN", "task.test_file": "TRAIN", "eval.before": "true", "eval.num_puzzles": 5},
     r"config key 'eval.num_puzzles': 5 puzzles asked, the held-out split has 1"),
    ({"task.train_file": "TRAIN", "reward_funcs": "null"},
     r"config key 'train.reward_funcs': task 'dataset' has no reward of its own"),
    ({"task.train_file": "TRAIN", "reward_weights": "[1, 2]"},
     r"config key 'train.reward_weights': reward_weights: 2 weights for 1 reward functions"),
    ({"task.train_file": "TRAIN", "task.prompt_template": "d1_eval"},
     r"config key 'task.prompt_template': the dataset task reads its prompts as written"),
    ({"task.train_file": "TRAIN", "task.format_rewards": "d1"}, r"config key 'task.format_rewards'"),
])
def test_config_errors_name_the_key(tmp_path, registered, overrides, match):
    train = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "1="}])
    with pytest.raises(ConfigError, match=match):
        validate(dataset_config(**{k: (train if v == "TRAIN" else v) for k, v in overrides.items()}))


def test_reward_funcs_belong_to_tasks_that_read_them():
    cfg = Config()
    apply_overrides(cfg, ["reward_funcs=gsm8k"])
    with pytest.raises(ConfigError, match=r"config key 'train.reward_funcs': task 'sudoku' scores completions with its "
                                          r"own reward"):
        validate(cfg)


def test_sources_of_held_out_data(tmp_path):
    cfg = dataset_config(**{"task.dataset": "me/data", "task.test_split": "validation"}).task
    assert DatasetTask.sources(cfg) == {"train": ("me/data", "train", None, "task.dataset"),
                                        "test": ("me/data", "validation", None, "task.test_split")}
    cfg = dataset_config(**{"task.train_file": "a.csv", "task.test_dataset": "me/test"}).task
    assert DatasetTask.sources(cfg)["test"] == ("me/test", "test", None, "task.test_dataset")


def test_a_local_file_checked_at_validation_reports_the_row(tmp_path, registered):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "1="}, {"prompt": ""}])
    with pytest.raises(ConfigError, match=r"bad.jsonl line 2: field 'prompt': empty prompt"):
        validate(dataset_config(**{"task.train_file": bad}))
    with pytest.raises(DataError):
        DatasetTask.load_split(dataset_config(**{"task.train_file": bad}).task, "train")


def test_sudoku_prompts_encode_and_decode_as_the_sudoku_task_in_full_mode():
    """The same puzzles given as a dataset reach the model exactly as the built-in task's 'full' mode gives them."""
    from transformers import AutoTokenizer

    from dlmrl.data.sudoku import load_test_split
    from dlmrl.data.tasks import SudokuTask
    from dlmrl.models.loading import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("tiny-sudoku"))
    puzzles = load_test_split()[:5]
    sudoku = SudokuTask(tok, tok.mask_token_id, answer_mode="full")
    task = make_task(DatasetTask.examples_of({"prompt": [e.puzzle + "=" for e in puzzles]}, "train", "d"),
                     tokenizer=tok)
    task.gen_length = 16
    a, b = sudoku.encode(puzzles), task.encode(task.train_examples)
    for name in ("prompt_ids", "prompt_mask", "canvas", "completion_mask"):
        assert getattr(a, name).tolist() == getattr(b, name).tolist(), name
    solved = b.canvas.new_tensor([[tok.convert_tokens_to_ids(c) for c in e.solution] for e in puzzles])
    assert task.decode(solved) == sudoku.decode(solved) == [e.solution for e in puzzles]
