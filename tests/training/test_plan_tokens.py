"""The dry-run's token counts: an infill task writes only its blank cells, not the whole canvas."""

from __future__ import annotations

import random

from dlmrl.config import default_job_config, validate
from dlmrl.config.task_options import build_task
from dlmrl.data.sudoku import all_solution_grids, generate_examples, load_sudoku_file, write_sudoku_csv
from dlmrl.models.loading import load_policy
from dlmrl.training.plan import build_plan


def test_infill_tokens_are_the_blank_cells_the_task_masks(tmp_path):
    """Oracle: the completion mask the task itself encodes for the training file's puzzles (the positions the
    sampler reveals), averaged; the plan's figures must be that mean, per step and per batch."""
    path = tmp_path / "train.csv"
    write_sudoku_csv(path, generate_examples(all_solution_grids(), 20, 2, 11, random.Random(0)))
    cfg = default_job_config([f"task.train_file={path}", f"output_dir={tmp_path / 'run'}", "sampling.steps=8"])
    plan = build_plan(cfg, spec=validate(cfg))
    policy = load_policy()
    task = build_task(cfg.task, policy.tokenizer, policy.mask_token_id)
    written = task.encode(load_sudoku_file(path)).completion_mask.sum(-1).double()  # (B,) blanks per puzzle
    assert 2 <= written.min() < written.max() <= 11  # (varied: the mean is not the canvas length by accident)
    rows = cfg.train.prompts_per_step * cfg.train.num_generations
    assert plan["sampler"]["tokens_per_step"] == round(float(written.mean()) / 8, 3)
    assert plan["sizes"]["completion_tokens_per_step"] == round(rows * float(written.mean()), 1)
    assert f"{int(written.min())}-{int(written.max())} of the 16 canvas cells" in plan["sampler"]["tokens_note"]


def test_generated_puzzles_use_the_blank_range_and_full_grids_the_canvas(tmp_path):
    cfg = default_job_config([f"output_dir={tmp_path / 'a'}", "task.min_blanks=4", "task.max_blanks=8"])
    plan = build_plan(cfg, spec=validate(cfg))
    rows = cfg.train.prompts_per_step * cfg.train.num_generations
    assert plan["sampler"]["tokens_per_step"] == round(6 / cfg.sampling.steps, 3)  # (uniform 4..8: mean 6)
    assert plan["sizes"]["completion_tokens_per_step"] == rows * 6
    full = default_job_config([f"output_dir={tmp_path / 'b'}", "task.answer_mode=full"])
    plan = build_plan(full, spec=validate(full))
    assert plan["sampler"]["tokens_per_step"] == round(16 / full.sampling.steps, 3)
    assert plan["sizes"]["completion_tokens_per_step"] == rows * 16 and "tokens_note" not in plan["sampler"]
