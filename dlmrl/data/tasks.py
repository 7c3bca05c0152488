"""4x4 Sudoku as the tiny model writes it: one canvas position per cell (``task.name: sudoku``).

The text form for instruction-tuned models (``task.answer_mode: text``) is
:class:`~dlmrl.data.sudoku_text.SudokuTextTask`, which :meth:`SudokuTask.from_options` builds for that mode. The
task protocol, ``TaskBatch`` and the ``TASKS`` registry are in :mod:`dlmrl.data.task` (re-exported here).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from dlmrl.data.encoding import encode_prompts
from dlmrl.data.sudoku import (
    SudokuExample,
    generate_examples,
    load_sudoku_file,
    load_test_split,
    split_grids,
)
from dlmrl.data.sudoku_text import SudokuTextOptions, SudokuTextTask
from dlmrl.data.task import TASKS, Task, TaskBatch
from dlmrl.rewards.sudoku import sudoku_reward

__all__ = ["TASKS", "SudokuOptions", "SudokuTask", "TaskBatch"]


@dataclass(frozen=True)
class SudokuOptions:
    """The settings of the tiny Sudoku task (``task.*`` keys of the same names).

    Attributes:
        answer_mode: ``infill`` (givens pre-placed, blanks masked and scored) | ``full`` (all 16 cells written) |
            ``text`` (the reasoning form, :class:`~dlmrl.data.sudoku_text.SudokuTextOptions`).
        min_blanks, max_blanks: blanks of generated training puzzles.
        train_file, test_file: d1-format CSV/JSONL files (default: generated training puzzles, the shipped
            256-puzzle held-out split).
    """

    answer_mode: str = "infill"
    min_blanks: int = 6
    max_blanks: int = 10
    train_file: str | None = None
    test_file: str | None = None


@TASKS.register("sudoku")
class SudokuTask(Task):
    """4x4 Sudoku (d1, arXiv 2504.12216): prompt = ``[BOS] puzzle =``; answer = the 16 cells, row-major.

    ``answer_mode="infill"`` pre-places the given digits on the canvas and masks only the blanks
    (a natural diffusion-LM mode: the model can never change a given). ``"full"`` masks all 16
    cells, as d1's format where the model writes the whole grid.

    Args:
        tokenizer: a tokenizer with one token per digit. mask_token_id: the canvas token.
        options: the settings (:class:`SudokuOptions`); ``settings``: fields of it to change (``answer_mode="full"``).
    """

    name = "sudoku"
    options_class = SudokuOptions
    gen_length = 16
    primary_metric = "cell_accuracy"  # the held-out headline metric (dlmrl.evaluation.heldout)
    CORRECT = 1.0

    def __init__(self, tokenizer, mask_token_id: int, options: SudokuOptions | None = None, **settings):
        self.options = options = replace(options or SudokuOptions(), **settings)
        if options.answer_mode not in ("infill", "full"):
            raise ValueError(f"answer_mode must be 'infill' or 'full' (the text form is SudokuTextTask), got "
                             f"{options.answer_mode!r}")
        self.tokenizer = tokenizer
        self.mask_token_id = mask_token_id
        self.answer_mode = options.answer_mode
        self.min_blanks, self.max_blanks = options.min_blanks, options.max_blanks
        self.train_grids, _ = split_grids()
        self.train_examples = load_sudoku_file(options.train_file) if options.train_file else None
        self.test_examples = load_sudoku_file(options.test_file) if options.test_file else load_test_split()
        vocab = tokenizer.get_vocab()
        missing = [str(d) for d in range(10) if str(d) not in vocab]
        if missing:
            raise ValueError(f"the Sudoku task writes one cell per token, but this tokenizer has no token for the "
                             f"digit(s) {', '.join(missing)}; use a tokenizer with single-digit tokens (or a text "
                             "task: task.answer_mode text)")
        self._digit_ids = [vocab[str(d)] for d in range(10)]
        # One canvas position is one cell: a non-digit token becomes "?" (a wrong cell), so a sampled
        # newline or separator can never be stripped by the reward's parser and shift later cells.
        self._id_to_char = {i: (t if t in "0123456789" else "?") for t, i in vocab.items()}

    @classmethod
    def options_class_for(cls, settings: Mapping[str, Any]) -> type:
        """:class:`SudokuOptions`, or the text form's :class:`~dlmrl.data.sudoku_text.SudokuTextOptions` for
        ``answer_mode: text``."""
        return SudokuTextOptions if settings.get("answer_mode") == "text" else SudokuOptions

    @classmethod
    def from_options(cls, options, tokenizer, mask_token_id: int | None, gen_length: int | None = None,
                     **resources) -> Task:
        """For ``answer_mode`` ``infill`` or ``full`` this class, whose canvas is always 16 cells (``gen_length`` is
        not used); for ``text`` the reasoning form :class:`~dlmrl.data.sudoku_text.SudokuTextTask` with a canvas
        of ``gen_length`` tokens."""
        if isinstance(options, SudokuTextOptions):
            return SudokuTextTask.from_options(options, tokenizer, mask_token_id, gen_length, **resources)
        return cls(tokenizer, mask_token_id, options)

    @classmethod
    def check_options(cls, options) -> int:
        """Load ``train_file``/``test_file`` up front; the number of held-out puzzles.

        Raises:
            ValueError: ``"task.<field>: <file> line N, field '<column>': ..."`` for the first bad row.
        """
        if isinstance(options, SudokuTextOptions):
            SudokuTextTask.check_prompt_options(options)
        for key, path in (("train_file", options.train_file), ("test_file", options.test_file)):
            if path:
                try:
                    examples = load_sudoku_file(path)
                except (ValueError, TypeError) as e:
                    raise ValueError(f"task.{key}: {e}") from None
                if key == "test_file":
                    return len(examples)
        return len(load_test_split())

    # -- data ---------------------------------------------------------------------------------
    def train_batch(self, n: int, seed: int, step: int) -> list[SudokuExample]:
        """``n`` training examples for ``step``: generated from training grids, or drawn from ``train_file``."""
        rng = random.Random(f"{seed}-{step}")
        if self.train_examples is not None:
            return [rng.choice(self.train_examples) for _ in range(n)]
        return generate_examples(self.train_grids, n, self.min_blanks, self.max_blanks, rng)

    def test_batch(self, n: int) -> list[SudokuExample]:
        """The first ``n`` held-out examples (raises ValueError if fewer exist)."""
        if n > len(self.test_examples):
            raise ValueError(f"asked for {n} held-out puzzles, the test split has {len(self.test_examples)}")
        return self.test_examples[:n]

    # -- encoding -----------------------------------------------------------------------------
    def encode(self, examples: Sequence[SudokuExample], device: str | torch.device = "cpu") -> TaskBatch:
        """``[BOS] puzzle =`` prompts (no BOS when the tokenizer has none) and the 16-cell canvas."""
        prompt_ids, prompt_mask = encode_prompts(self.tokenizer, [e.puzzle + "=" for e in examples], device)
        digits = torch.tensor(self._digit_ids)
        puzzles = torch.tensor([[int(c) for c in e.puzzle] for e in examples]).reshape(len(examples), 16)
        if self.answer_mode == "infill":
            blank = puzzles == 0
            canvas = torch.where(blank, torch.tensor(self.mask_token_id), digits[puzzles])
        else:
            canvas = torch.full_like(puzzles, self.mask_token_id)
        return TaskBatch(list(examples), prompt_ids, prompt_mask, canvas.to(device),
                         (canvas == self.mask_token_id).to(device))

    def decode(self, canvas: torch.Tensor) -> list[str]:
        """Canvas rows → answer strings, one character per position; stops at EOS; any non-digit token
        becomes ``?`` (a wrong cell)."""
        eos = self.tokenizer.eos_token_id
        out = []
        for row in canvas.tolist():
            chars = []
            for i in row:
                if i == eos:
                    break
                chars.append(self._id_to_char.get(i, "?"))
            out.append("".join(chars))
        return out

    def rewards(self, examples: Sequence[SudokuExample], texts: Sequence[str]) -> list[float]:
        """Fraction of blank cells right (d1's Sudoku reward, arXiv 2504.12216), one float per completion."""
        return sudoku_reward(None, list(texts), puzzle=[e.puzzle for e in examples],
                             solution=[e.solution for e in examples])

    def sft_answer(self, example: SudokuExample) -> str:
        """The target canvas text for supervised pretraining."""
        return example.solution

    def reference_solution(self, example: SudokuExample) -> str:
        """The solution grid (DaGRPO's anchors), as :meth:`sft_answer` writes it."""
        return self.sft_answer(example)

    def metrics(self, examples: Sequence[SudokuExample], texts: Sequence[str]) -> dict:
        """``cell_accuracy`` (correct blanks / all blanks, d1's metric), ``solve_rate``, ``mean_reward``,
        ``num_examples``."""
        rewards = self.rewards(examples, texts)
        blanks = [len(e.blanks) for e in examples]
        correct = sum(round(r * b) for r, b in zip(rewards, blanks))
        n = max(len(examples), 1)
        return {"cell_accuracy": correct / max(sum(blanks), 1), "solve_rate": sum(r == 1.0 for r in rewards) / n,
                "mean_reward": sum(rewards) / n, "num_examples": len(examples)}

