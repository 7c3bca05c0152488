"""Your own prompts as a task (``task.name: dataset``): a dataset's prompt column in, reward functions' sum out.

The data follows TRL's convention: one row per prompt, a ``prompt`` column (``task.prompt_column``) holding plain
text or chat messages (``[{"role": "user", "content": ...}, ...]``), and any other columns, which reach the reward
functions as keyword arguments. Sources are those of the text tasks (:mod:`dlmrl.data.loading`): a hub id, local
folder or ``.json``/``.jsonl``/``.csv``/``.parquet`` file (``task.dataset`` or ``task.train_file``), with an
optional held-out source (``task.test_file``, ``task.test_dataset`` or ``task.test_split``); the Python API passes
``datasets.Dataset`` objects (:meth:`DatasetTask.examples_of`).

Everything else is :class:`~dlmrl.data.text_tasks.TextTask`'s: the canvas of ``gen_length`` mask tokens after the
left-padded prompt (pad tokens for an AR policy), decoding up to the first end token, training batches as a
function of (seed, step) over per-epoch permutations.

- **Prompt**: chat messages through the tokenizer's chat template with the generation prompt (TRL's
  conversational form; the template writes its own special tokens); plain text wrapped as one user message when
  ``task.chat_template`` is ``on``, or ``auto`` with a tokenizer that has a template (the text tasks' rule), else
  the text exactly as written after the tokenizer's BOS when it has one (:func:`dlmrl.data.encoding.encode_prompts`'
  rule; no other special token, no newline added).
- **Reward**: :class:`~dlmrl.rewards.functions.RewardFunctions` (``train.reward_funcs``, ``train.reward_weights``):
  each function gets the prompts as in the data, the completions (strings; for chat-message prompts TRL's
  ``[{"role": "assistant", "content": text}]``) and the other columns, and the weighted ``nansum`` is the reward.
- **Held-out metrics**: ``mean_reward`` (the primary metric), each function's ``rewards/<name>/mean`` and, when
  given (Python API), an ``eval_metric(prompts, completions, **columns) -> float`` under its function's name
  (then the primary metric).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from dlmrl.data.loading import DataError, Records, field_error, is_local_file
from dlmrl.data.prompts import PromptTemplate, render_prompt
from dlmrl.data.task import TASKS
from dlmrl.data.text_tasks import SourceOptions, TextOptions, TextTask
from dlmrl.rewards.functions import RewardFunctions

__all__ = ["DatasetExample", "DatasetOptions", "DatasetTask", "dataset_examples"]

#: names a column may not have: the reward functions' own positional arguments
RESERVED_COLUMNS = ("prompts", "completions")
#: keys of the held-out summary an eval metric's name may not take
RESERVED_METRICS = ("mean_reward", "num_examples", "primary_metric", "num_puzzles", "nfe", "gen_length", "steps",
                    "max_new_tokens")


@dataclass(frozen=True)
class DatasetOptions(SourceOptions):
    """The dataset task's settings (``task.*`` keys of the same names).

    Attributes:
        dataset, subset, split: the training prompts (a hub id, or a local folder or .json/.jsonl/.csv/.parquet
            file) and split; train_file: a local file instead.
        test_dataset, test_split, test_file: the held-out prompts (none: no held-out evaluation).
        prompt_column: the column holding each prompt.
        chat_template: ``auto`` | ``on`` | ``off`` (for plain-text prompts; chat messages always use it).
        num_proc, cache_dir: ``datasets.load_dataset``'s.
    """

    prompt_column: str = "prompt"
    chat_template: str = "auto"


@dataclass(frozen=True)
class DatasetExample:
    """One row of a dataset.

    Attributes:
        prompt: plain text, or chat messages (a list of ``{"role": str, "content": str}`` dicts).
        columns: the row's other columns (name → value), passed to the reward functions.
        split: ``"train"`` or ``"test"``.
        where: the row's file and line (or dataset, split and row) for messages.
    """

    prompt: Any
    columns: dict = field(default_factory=dict, hash=False)
    split: str = "train"
    where: str = field(default="", compare=False, repr=False)

    @property
    def is_chat(self) -> bool:
        return isinstance(self.prompt, list)


def _check_prompt(where: str, column: str, value: Any) -> Any:
    """A prompt value as the example keeps it: non-empty text, or a non-empty list of ``{role, content}`` messages
    with string fields. Raises :class:`DataError` naming the row and the column."""
    if isinstance(value, str):
        if not value.strip():
            raise field_error(where, column, "empty prompt")
        return value
    if isinstance(value, (list, tuple)) and value:
        messages = []
        for k, m in enumerate(value):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise field_error(where, column, f"message {k} is {m!r}; chat messages are "
                                                 "{'role': str, 'content': str} dicts")
            messages.append(dict(m))
        return messages
    raise field_error(where, column, f"expected text or a list of chat messages [{{'role': ..., 'content': ...}}], "
                                     f"got {type(value).__name__} {value!r:.60}")


def dataset_examples(records: Records, prompt_column: str = "prompt", split: str = "train") -> list[DatasetExample]:
    """The examples of ``records``: the prompt column checked, the other columns kept per row.

    Raises:
        DataError: naming the source when the prompt column is missing (with the columns it has) or another
            column is named ``prompts`` / ``completions``; naming the row and the column for a bad prompt.
    """
    columns = list(records.columns)
    if prompt_column not in records.columns:
        raise DataError(f"{records.source}: no prompt column {prompt_column!r} (task.prompt_column); its columns are "
                        f"{', '.join(repr(c) for c in columns) or 'none'} (rename one of them to {prompt_column!r}, "
                        "or name the column that holds the prompts with task.prompt_column)")
    clash = [c for c in columns if c in RESERVED_COLUMNS]
    if clash:
        raise DataError(f"{records.source}: column {clash[0]!r} has the name of the reward functions' own argument "
                        f"({', '.join(RESERVED_COLUMNS)}); rename it")
    others = [c for c in columns if c != prompt_column]
    out = []
    for i, (where, row) in enumerate(records.rows(columns)):
        prompt = _check_prompt(where, prompt_column, row[prompt_column])
        out.append(DatasetExample(prompt, {c: row[c] for c in others}, split, where))
    if not out:
        raise DataError(f"{records.source}: no rows")
    return out


def _source_of(where: str) -> str:
    """The data an example's ``where`` names, without its row (``"a.jsonl line 3"`` -> ``"a.jsonl"``)."""
    return re.sub(r" (line|row) \d+$", "", where)


@TASKS.register("dataset")
class DatasetTask(TextTask):
    """Your own prompts from a dataset (its prompt column), rewarded by the weighted sum of train.reward_funcs.

    The prompt, canvas, reward and metric rules are in the module docstring.

    Args:
        tokenizer: a ``transformers`` tokenizer.
        mask_token_id: the canvas token (``None`` for an AR policy: pad tokens instead).
        gen_length: canvas length ``L`` in tokens.
        train_examples, test_examples: :class:`DatasetExample` lists (``from_config`` loads them lazily instead);
            ``test_examples`` ``None`` or empty: no held-out data.
        reward_functions: the reward (:class:`~dlmrl.rewards.functions.RewardFunctions`).
        chat_template: ``auto`` | ``on`` | ``off`` (for plain-text prompts; chat messages always use it).
        eval_metric: optional ``f(prompts, completions, **columns) -> float`` over the held-out split.
    Raises:
        ValueError: a bad ``chat_template``, ``on`` with a tokenizer without a template, an ``eval_metric`` named
            like a summary key, or examples whose chat-message prompts the tokenizer cannot render (no chat
            template, or ``chat_template: off``), naming the first such row.
    """

    name = "dataset"
    options_class = DatasetOptions
    CORRECT = None  # (no reward means "solved": the rollout solve_rate is not logged)
    takes_reward_funcs = True  # (config validation: train.reward_funcs belong to this task)
    refused_keys: ClassVar[dict[str, str]] = {
        "prompt_template": "the dataset task reads its prompts as written in the prompt column (task.prompt_column); "
                           "put the wording in the data",
        "test_prompt_template": "the dataset task reads its prompts as written in the prompt column "
                                "(task.prompt_column); put the wording in the data",
        "format_rewards": "the dataset task's reward is train.reward_funcs; name the format rewards there (e.g. "
                          "reward_funcs: [my_pkg.rewards:exact_match, xmlcount])",
    }
    templates: ClassVar[dict[str, PromptTemplate]] = {"plain": PromptTemplate("{prompt}")}  # (the column as written)
    template_fields = ("prompt",)

    def __init__(self, tokenizer, mask_token_id: int | None, gen_length: int = 256, train_examples=None,
                 test_examples=None, *, reward_functions: RewardFunctions, chat_template: str = "auto",
                 eval_metric: Callable | None = None, options: DatasetOptions | None = None):
        options = options or DatasetOptions(chat_template=chat_template)
        # (the text tasks' machinery reads the prompt settings: the column as written, no format rewards)
        super().__init__(tokenizer, mask_token_id, gen_length, train_examples, test_examples,
                         options=TextOptions(prompt_template="plain", chat_template=options.chat_template))
        self.options = options
        self.reward_functions = reward_functions
        self.chat_setting = options.chat_template
        self.eval_metric = eval_metric
        self.primary_metric = "mean_reward"
        if eval_metric is not None:
            from dlmrl.rewards.functions import _name_of

            self.primary_metric = _name_of(eval_metric)
            if self.primary_metric in RESERVED_METRICS or self.primary_metric.startswith("rewards/"):
                raise ValueError(f"eval_metric: its name {self.primary_metric!r} is a key the held-out summary "
                                 "already has; rename the function")
        for examples in (train_examples or (), test_examples or ()):
            self.check_examples(examples)

    # -- examples ---------------------------------------------------------------------------------------
    @staticmethod
    def examples_of(dataset, split: str, what: str, prompt_column: str = "prompt") -> list[DatasetExample]:
        """The examples of an in-memory ``datasets.Dataset`` (or a dict of columns), rows named
        ``"<what> row N"``.

        Raises:
            ValueError: ``what`` without the prompt column (naming it and the columns it has), or a bad row.
        """
        if isinstance(dataset, dict):
            columns = {k: list(v) for k, v in dataset.items()}
        elif hasattr(dataset, "column_names") and hasattr(dataset, "to_dict"):
            columns = dataset.to_dict()
        else:
            raise TypeError(f"{what}: expected a datasets.Dataset (or a dict of columns), got {type(dataset).__name__}")
        n = len(next(iter(columns.values()), []))
        try:
            return dataset_examples(Records(what, columns, [f"{what} row {i}" for i in range(n)]), prompt_column,
                                    split)
        except DataError as e:
            # (the config's key names mean nothing to a Python caller)
            raise ValueError(str(e).replace(" (task.prompt_column)", "")
                             .replace(", or set task.prompt_column", "")) from None

    def check_prompts(self, examples: Sequence[DatasetExample]) -> None:
        """Refuse chat-message prompts the tokenizer cannot render (raises ``ValueError`` naming the row)."""
        first = next((e for e in examples if e.is_chat), None)
        if first is None:
            return
        if self.chat_setting == "off":
            raise ValueError(f"{first.where}: the prompt is chat messages but task.chat_template is off; set it auto "
                             "or on, or give plain-text prompts")
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{first.where}: the prompt is chat messages but the tokenizer has no chat template; give "
                             "plain-text prompts or a tokenizer with a chat_template")

    def check_examples(self, examples: list) -> list:
        """As loaded: the prompts checked (:meth:`check_prompts`) and the rows the reward functions say they cannot
        score reported (:meth:`~dlmrl.rewards.functions.RewardFunctions.check_rows`: a warning naming them)."""
        self.check_prompts(examples)
        if examples and getattr(self, "reward_functions", None) is not None:
            self.check_reward_inputs(self.reward_functions, examples, _source_of(examples[0].where))
        return examples

    @classmethod
    def check_reward_inputs(cls, reward_functions: RewardFunctions, examples: Sequence[DatasetExample],
                            source: str) -> None:
        """The reward functions against loaded ``examples``: their signatures against the columns (a required
        column missing is refused here, not at the first scoring:
        :meth:`~dlmrl.rewards.functions.RewardFunctions.check_signatures`), then the rows they cannot score reported
        (:meth:`~dlmrl.rewards.functions.RewardFunctions.check_rows`).

        Raises:
            dlmrl.rewards.functions.RewardFunctionError: naming the function, the column and ``source``.
        """
        columns = cls.columns_of(examples)
        reward_functions.check_signatures(list(columns), source)
        reward_functions.check_rows(columns, [e.where for e in examples])

    # -- encoding ---------------------------------------------------------------------------------------
    def prompt_text(self, example: DatasetExample) -> str:
        """The prompt as the model reads it (module docstring): chat messages or a wrapped user message through the
        chat template with the generation prompt, else the text as written."""
        if example.is_chat:
            self.check_prompts([example])
            return self.tokenizer.apply_chat_template(example.prompt, add_generation_prompt=True, tokenize=False)
        if self.chat:
            return render_prompt(self.tokenizer, example.prompt, chat=True)
        return example.prompt

    def prompt_token_ids(self, example: DatasetExample) -> list[int]:
        """The prompt's ids, no special token added: the chat template writes its own; plain text gets the
        tokenizer's BOS in front when it has one and the text does not start with it."""
        text = self.prompt_text(example)
        if not (example.is_chat or self.chat):
            bos = getattr(self.tokenizer, "bos_token", None) or ""
            text = text if text.startswith(bos) else bos + text
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    # -- rewards ----------------------------------------------------------------------------------------
    def reward_inputs(self, examples: Sequence[DatasetExample], texts: Sequence[str]) -> tuple[list, list, dict]:
        """``(prompts, completions, columns)`` as the reward functions take them (module docstring)."""
        prompts = [e.prompt for e in examples]
        completions = [[{"role": "assistant", "content": t}] if e.is_chat else t for e, t in zip(examples, texts)]
        return prompts, completions, self.columns_of(examples)

    @staticmethod
    def columns_of(examples: Sequence[DatasetExample]) -> dict[str, list]:
        """The columns other than the prompt, one value per example (``None`` where a row lacks one)."""
        names = list(dict.fromkeys(k for e in examples for k in e.columns))
        return {k: [e.columns.get(k) for e in examples] for k in names}


    def reward_table(self, examples: Sequence[DatasetExample], texts: Sequence[str]) -> torch.Tensor:
        """``(B, F)`` float32 values of each reward function, NaN where it returned ``None``.

        Raises:
            dlmrl.rewards.functions.RewardFunctionError: a function returned the wrong number of values or a
                value that is not a number or ``None``.
        """
        return self.reward_functions.table(*self.reward_inputs(examples, texts), [e.where for e in examples])

    def rewards(self, examples: Sequence[DatasetExample], texts: Sequence[str]) -> list[float]:
        """The weighted ``nansum`` of the reward functions, one float per completion."""
        return self.reward_functions.combine(self.reward_table(examples, texts)).tolist()

    def metrics(self, examples: Sequence[DatasetExample], texts: Sequence[str]) -> dict:
        """``mean_reward``, each function's ``rewards/<name>/mean`` (``None`` where it returned no value),
        ``num_examples`` and, with an ``eval_metric``, its value under its name.

        Raises:
            ValueError: an ``eval_metric`` that returns something other than a finite real number.
        """
        prompts, completions, columns = self.reward_inputs(examples, texts)
        table = self.reward_functions.table(prompts, completions, columns, [e.where for e in examples])
        totals = self.reward_functions.combine(table)
        out = {"mean_reward": float(totals.double().mean()) if len(totals) else 0.0,
               **{k: v for k, v in self.reward_functions.metrics(table).items() if k.endswith("/mean")},
               "num_examples": len(texts)}
        if self.eval_metric is not None:
            value = self.eval_metric(prompts, completions, **columns)
            if not (isinstance(value, numbers.Real) and math.isfinite(value)):
                raise ValueError(f"eval_metric {self.primary_metric!r} returned {value!r}; it must return one finite "
                                 "number for the whole held-out split")
            out[self.primary_metric] = float(value)
        return out

    # -- construction from options -----------------------------------------------------------------------------
    @classmethod
    def sources(cls, options: DatasetOptions) -> dict[str, tuple[str, str, str | None, str]]:
        """``{"train": (source, split, subset, key)}`` and, when held-out data is named, ``"test"``: ``task.test_file``,
        else ``task.test_dataset`` (split ``task.test_split``, default ``test``), else ``task.test_split`` of the
        training source.

        Raises:
            DataError: naming ``task.dataset`` when neither it nor ``task.train_file`` is set.
        """
        if options.train_file:
            train = (options.train_file, options.split or "train", None, "task.train_file")
        elif options.dataset:
            train = (options.dataset, options.split or "train", options.subset, "task.dataset")
        else:
            raise DataError("task.dataset: the dataset task needs its prompts: set task.dataset (a hub id, or a local "
                            "folder or .json/.jsonl/.csv/.parquet file) or task.train_file")
        out = {"train": train}
        if options.test_file:
            out["test"] = (options.test_file, options.test_split or "train", None, "task.test_file")
        elif options.test_dataset:
            out["test"] = (options.test_dataset, options.test_split or "test", options.subset, "task.test_dataset")
        elif options.test_split:
            out["test"] = (train[0], options.test_split, train[2], "task.test_split")
        return out

    @classmethod
    def convert(cls, options: DatasetOptions, records: Records, which: str) -> list[DatasetExample]:
        return dataset_examples(records, options.prompt_column, which)

    @classmethod
    def check_settings(cls, options: DatasetOptions) -> None:
        """The chat template setting and the prompt column (the data sources aside: the Python API passes its
        datasets). Raises ``ValueError`` naming the field."""
        if options.chat_template not in ("auto", "on", "off"):
            raise ValueError(f"task.chat_template: must be auto, on or off, got {options.chat_template!r}")
        if not options.prompt_column or not options.prompt_column.strip():
            raise ValueError("task.prompt_column: must name a column")

    @classmethod
    def check_options(cls, options: DatasetOptions, reward_functions: RewardFunctions | None = None) -> int | None:
        """Check the settings and load the *local* data files (prompt column and rows checked; with
        ``reward_functions``, the rows they cannot score reported: a warning per function naming them,
        :meth:`~dlmrl.rewards.functions.RewardFunctions.check_rows`).

        Returns the number of held-out examples of a local file, ``None`` for a hub one, 0 when none is named.

        Raises:
            ValueError: naming the field (``DataError``, a :class:`ValueError`, for the data).
        """
        cls.check_settings(options)
        sources = cls.sources(options)
        for which, (source, _, _, _) in sources.items():
            if is_local_file(source):
                examples = cls.load_split(options, which)
                if reward_functions is not None:
                    cls.check_reward_inputs(reward_functions, examples, source)
                if which == "test":
                    return len(examples)
        return None if "test" in sources else 0

    @classmethod
    def from_options(cls, options: DatasetOptions, tokenizer, mask_token_id: int | None, gen_length: int | None = None,
                     reward_functions: RewardFunctions | None = None, **resources) -> DatasetTask:
        """The task of ``options``, with ``reward_functions`` (the trainer builds them from ``train.reward_funcs``);
        data is loaded on first use.

        Raises:
            ValueError: no ``reward_functions``.
        """
        if reward_functions is None:
            raise ValueError("train.reward_funcs: the dataset task has no reward of its own; name at least one "
                             "reward function")
        task = cls(tokenizer, mask_token_id, gen_length=gen_length or 256, reward_functions=reward_functions,
                   options=options, **resources)
        task._loaders = {which: (lambda which=which: cls.load_split(options, which)) for which in cls.sources(options)}
        return task
