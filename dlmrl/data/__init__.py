"""Tasks: generators, loaders and the encoders that turn examples into model inputs."""

from dlmrl.data.tasks import TASKS, SudokuTask, TaskBatch

__all__ = ["TASKS", "SudokuTask", "TaskBatch"]
