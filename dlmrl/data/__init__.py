"""Tasks: generators, loaders and the encoders that turn examples into model inputs.

Every task implements :class:`~dlmrl.data.task.Task` (its docstring says how to add one) and is registered in
``TASKS``: ``sudoku`` (:mod:`dlmrl.data.tasks`, its text form :mod:`dlmrl.data.sudoku_text`), ``gsm8k``
(:mod:`dlmrl.data.gsm8k_task`), ``math`` (:mod:`dlmrl.data.math_task`), ``countdown``
(:mod:`dlmrl.data.countdown_task`), ``multihop``, multi-hop QA with simulated tools (:mod:`dlmrl.data.multihop_task`),
``recommend``, next-item generative recommendation over semantic IDs (:mod:`dlmrl.data.recommend_task`),
and ``dataset``, your own prompts scored by reward functions
(:mod:`dlmrl.data.dataset_task`). :func:`dlmrl.config.build_task` builds one from a ``TaskConfig``.
"""

from dlmrl.data.countdown_task import CountdownOptions, CountdownTask
from dlmrl.data.dataset_task import DatasetExample, DatasetOptions, DatasetTask
from dlmrl.data.gsm8k_task import GSM8KTask
from dlmrl.data.loading import DataError, load_records
from dlmrl.data.math_task import MathOptions, MathTask
from dlmrl.data.multihop_task import MultiHopOptions, MultiHopTask
from dlmrl.data.recommend_task import RecommendOptions, RecommendTask
from dlmrl.data.sudoku_text import SudokuTextOptions, SudokuTextTask
from dlmrl.data.task import TASKS, NoOptions, Task, TaskBatch
from dlmrl.data.tasks import SudokuOptions, SudokuTask
from dlmrl.data.text_examples import CountdownExample, GSM8KExample, MathExample
from dlmrl.data.text_tasks import PromptOptions, TextOptions, TextTask

__all__ = ["TASKS", "CountdownExample", "CountdownOptions", "CountdownTask", "DataError", "DatasetExample",
           "DatasetOptions", "DatasetTask", "GSM8KExample", "GSM8KTask", "MathExample", "MathOptions", "MathTask",
           "MultiHopOptions", "MultiHopTask",
           "NoOptions", "PromptOptions", "RecommendOptions", "RecommendTask", "SudokuOptions", "SudokuTask",
           "SudokuTextOptions", "SudokuTextTask", "Task",
           "TaskBatch", "TextOptions", "TextTask", "load_records"]
