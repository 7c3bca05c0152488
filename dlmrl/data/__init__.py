"""Tasks: generators, loaders and the encoders that turn examples into model inputs.

``TASKS`` holds ``sudoku`` (:mod:`dlmrl.data.tasks`), the text tasks ``gsm8k``, ``math``, ``countdown``
(:mod:`dlmrl.data.text_tasks`) and ``dataset``, your own prompts scored by reward functions
(:mod:`dlmrl.data.dataset_task`); :func:`build_task` builds one from a ``TaskConfig``.
"""

from dlmrl.data.dataset_task import DatasetExample, DatasetTask
from dlmrl.data.loading import DataError, load_records
from dlmrl.data.tasks import TASKS, SudokuTask, TaskBatch, build_task
from dlmrl.data.text_examples import CountdownExample, GSM8KExample, MathExample
from dlmrl.data.text_tasks import CountdownTask, GSM8KTask, MathTask, TextTask

__all__ = ["TASKS", "CountdownExample", "CountdownTask", "DataError", "DatasetExample", "DatasetTask", "GSM8KExample",
           "GSM8KTask", "MathExample", "MathTask", "SudokuTask", "TaskBatch", "TextTask", "build_task", "load_records"]
