"""4x4 Sudoku as a text task (``task.name: sudoku``, ``task.answer_mode: text``): d1's chat prompt and a canvas of
``sampling.gen_length`` tokens, for instruction-tuned models such as LLaDA-8B-Instruct (d1, arXiv 2504.12216).

The tiny shipped model writes the 16 cells directly (``answer_mode`` ``infill``/``full``,
:class:`~dlmrl.data.tasks.SudokuTask`); an instruction-tuned model instead reasons and then answers inside
``<answer>...</answer>`` (the prompt template ``d1``: d1's ``SUDOKU_SYSTEM_PROMPT`` and
``Solve the following Sudoku puzzle: <puzzle>``, from ``diffu-grpo/data_utils.py``'s ``get_sudoku_questions``;
``plain``: the 16-character puzzle alone; a custom template uses ``{puzzle}``). The reward is the same cell accuracy over the blanks
(:func:`~dlmrl.rewards.sudoku.sudoku_cell_accuracy`, parsed from the last answer region), plus any
``task.format_rewards``; the held-out metric is ``cell_accuracy`` summed over the split (d1's metric).

Data as for the tiny task: training puzzles generated from the training grids (``task.min_blanks`` ..
``max_blanks``) or drawn from ``task.train_file`` (d1's ``4x4_sudoku_unique_puzzles.csv`` works as is), held-out
puzzles from the shipped split or ``task.test_file`` (d1's ``4x4_test_sudoku.csv``).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from dlmrl.data.prompts import PromptTemplate, literal
from dlmrl.data.sudoku import generate_examples, load_sudoku_file, load_test_split, split_grids
from dlmrl.data.text_tasks import PromptOptions, TextTask
from dlmrl.rewards.sudoku import sudoku_cell_accuracy

__all__ = ["SudokuTextExample", "SudokuTextOptions", "SudokuTextTask"]

# d1 diffu-grpo/data_utils.py (get_sudoku_questions): the system prompt, then "Solve the following Sudoku
# puzzle: <puzzle>"
D1_SUDOKU_SYSTEM_PROMPT = (
    "\nPlease solve the following 4x4 Sudoku puzzle. The puzzle is provided as a 16-character string reading "
    "left-to-right, top-to-bottom, where '0' represents empty cells.\n\nRules:\n- Fill empty cells with digits "
    "1-4\n- Each row must contain digits 1-4 exactly once\n- Each column must contain digits 1-4 exactly once\n"
    "- Each 2x2 box must contain digits 1-4 exactly once\n\nImportant: Your solution must be a COMPLETE "
    "16-character string with only the digits 1-4, representing your final solved grid.\n\nRespond in this "
    "exact format:\n<reasoning>\nYour step-by-step solving process\n</reasoning>\n<answer>\n[16-character "
    "solution string with no spaces or separators]\n</answer>\n"
)


@dataclass(frozen=True)
class SudokuTextOptions(PromptOptions):
    """The settings of Sudoku's text form: :class:`~dlmrl.data.text_tasks.PromptOptions` and the tiny task's data
    settings (:class:`~dlmrl.data.tasks.SudokuOptions`' fields, ``answer_mode`` ``text``)."""

    answer_mode: str = "text"
    min_blanks: int = 6
    max_blanks: int = 10
    train_file: str | None = None
    test_file: str | None = None


@dataclass(frozen=True)
class SudokuTextExample:
    """A puzzle for the text task: the 16-character ``puzzle`` ('0' = blank) and ``solution``, and the split
    (which picks the prompt template)."""

    puzzle: str
    solution: str
    split: str = "train"

    @property
    def blanks(self) -> list[int]:
        """Row-major indices (0..15) of the blank cells."""
        return [i for i, ch in enumerate(self.puzzle) if ch == "0"]

    def fields(self) -> dict:
        return {"puzzle": self.puzzle}


def _as_text(examples, split: str) -> list[SudokuTextExample]:
    return [SudokuTextExample(e.puzzle, e.solution, split) for e in examples]


class SudokuTextTask(TextTask):
    """4x4 Sudoku with d1's reasoning prompt: reward = fraction of blank cells right in the last ``<answer>``
    region (plus ``format_rewards``); metrics ``cell_accuracy`` (primary), ``solve_rate``, ``mean_reward``.

    Args:
        min_blanks, max_blanks: blanks of generated training puzzles.
        train_file, test_file: d1-format CSV/JSONL files (default: generated training puzzles, the shipped
            256-puzzle held-out split).
        Others: as :class:`~dlmrl.data.text_tasks.TextTask`.
    """

    name = "sudoku"
    options_class = SudokuTextOptions
    CORRECT = 1.0
    primary_metric = "cell_accuracy"
    templates: ClassVar[dict[str, PromptTemplate]] = {
        "d1": PromptTemplate(literal(D1_SUDOKU_SYSTEM_PROMPT) + "\n\nSolve the following Sudoku puzzle: {puzzle}\n"),
        "plain": PromptTemplate("{puzzle}"),
    }
    template_fields = ("puzzle",)
    # (d1 trains Sudoku on the cell-accuracy reward alone: format_rewards 'd1' adds none)

    def __init__(self, tokenizer, mask_token_id: int | None, gen_length: int = 256,
                 options: SudokuTextOptions | None = None, **settings):
        options = dataclasses.replace(options or SudokuTextOptions(), **settings)
        train = _as_text(load_sudoku_file(options.train_file), "train") if options.train_file else None
        test = _as_text(load_sudoku_file(options.test_file) if options.test_file else load_test_split(), "test")
        super().__init__(tokenizer, mask_token_id, gen_length, train_examples=train, test_examples=test,
                         options=options)
        self.min_blanks, self.max_blanks = options.min_blanks, options.max_blanks
        self.train_grids, _ = split_grids()

    @classmethod
    def from_options(cls, options: SudokuTextOptions, tokenizer, mask_token_id: int | None,
                     gen_length: int | None = None, **resources) -> SudokuTextTask:
        """The text form with a canvas of ``gen_length`` tokens (256 when ``None``)."""
        return cls(tokenizer, mask_token_id, gen_length or 256, options, **resources)

    def train_batch(self, n: int, seed: int, step: int) -> list[SudokuTextExample]:
        """``train_file``: its examples in a fresh permutation per epoch (as the other text tasks); otherwise
        ``n`` puzzles generated from the training grids with the tiny task's generator seeded by (seed, step)."""
        if self._train is not None:
            return super().train_batch(n, seed, step)
        rng = random.Random(f"{seed}-{step}")
        return _as_text(generate_examples(self.train_grids, n, self.min_blanks, self.max_blanks, rng), "train")

    def correctness(self, example: SudokuTextExample, text: str) -> float:
        """Fraction of the blank cells right (d1's Sudoku reward)."""
        return sudoku_cell_accuracy(example.puzzle, example.solution, text)

    def sft_answer(self, example: SudokuTextExample) -> str:
        """d1's format around the solution (no reasoning: the reference answer alone)."""
        return f"<reasoning>\n</reasoning>\n<answer>\n{example.solution}\n</answer>"

    def metrics(self, examples: Sequence[SudokuTextExample], texts: Sequence[str]) -> dict:
        """``cell_accuracy`` (correct blanks / all blanks over the split, d1's metric), ``solve_rate``,
        ``mean_reward`` (with format components, if any), ``num_examples``."""
        rewards = self.rewards(examples, texts)
        acc = [self.scored_correctness(e, t) for e, t in zip(examples, texts)]
        blanks = [len(e.blanks) for e in examples]
        n = max(len(examples), 1)
        return {"cell_accuracy": sum(round(a * b) for a, b in zip(acc, blanks)) / max(sum(blanks), 1),
                "solve_rate": sum(a == 1.0 for a in acc) / n, "mean_reward": sum(rewards) / n,
                "num_examples": len(examples)}
