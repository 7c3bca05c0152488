"""``dlmrl estimators``: the variance lab on a model and Sudoku completions it samples itself."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from dlmrl.data.tasks import SudokuTask
from dlmrl.estimators.analysis import (
    LabBatch,
    LabConfig,
    plot_results,
    run_lab,
    summary_table,
    to_json_records,
)
from dlmrl.estimators.lab_report import trajectory_table
from dlmrl.models.sampler import generate
from dlmrl.training.checkpoint import write_json_atomic

DEFAULT_LENGTHS = (8, 16, 64, 256)
CELLS = 16


def default_rows(length: int) -> int:
    """Rows studied at length ``L`` by default: 8 below 16 tokens, 2 from 16 (a 16-token table is 65535 passes)."""
    return 8 if length < CELLS else 2


def _rows_for_length(task: SudokuTask, length: int, num_rows: int, rng: random.Random):
    """Held-out puzzles whose blank count is closest to ``length`` (ties: more blanks), ``num_rows`` of them."""
    pool = task.test_examples
    blanks = [e.puzzle.count("0") for e in pool]
    best = min(blanks, key=lambda b: (abs(b - min(length, CELLS)), -b))
    chosen = [e for e, b in zip(pool, blanks) if b == best]
    rng.shuffle(chosen)
    if len(chosen) < num_rows:
        raise ValueError(f"the test split has only {len(chosen)} puzzles with {best} blanks; ask for fewer rows")
    return chosen[:num_rows]


def sudoku_lab_batches(
    policy,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    rows: int | Sequence[int] = 4,
    seed: int = 0,
    temperature: float = 1.0,
) -> list[LabBatch]:
    """One :class:`LabBatch` per length ``L``, from held-out Sudoku puzzles and completions the policy samples.

    - ``L <= 16``: puzzles whose blank count ``b`` is closest to ``L``; the blanks are sampled
      (infill, ``temperature``, as in RL rollouts); the maskable positions are the blanks, plus
      ``L − b`` given cells in reading order when ``L > b`` (``L = 16``: the whole grid, d1's full
      format), or the first ``L`` blanks when ``L < b``.
    - ``L > 16``: the 16 cells as above followed by ``L − 16`` more canvas positions, also sampled
      by the policy; all ``L`` positions are maskable. Beyond 16 cells the canvas is outside the
      Sudoku model's training distribution: these batches measure how the estimators behave on a
      long canvas, not Sudoku.

    Args:
        policy: a :class:`~dlmrl.models.policy.MaskedDiffusionPolicy` with the Sudoku tokenizer.
        lengths: the ``L`` values.
        rows: rows per batch (one int, or one per length).
        seed: seeds puzzle choice and sampling.
        temperature: sampling temperature.
    Returns:
        list of :class:`LabBatch`, in the order of ``lengths``.
    """
    task = SudokuTask(policy.tokenizer, policy.mask_token_id)
    rows_list = [rows] * len(lengths) if isinstance(rows, int) else list(rows)
    out = []
    for length, n_rows in zip(lengths, rows_list):
        if length < 1:
            raise ValueError(f"lengths must be >= 1, got {length}")
        rng = random.Random(f"lab-{seed}-{length}")
        batch = task.encode(_rows_for_length(task, length, n_rows, rng))
        extra = max(length - CELLS, 0)
        canvas = batch.canvas
        if extra:
            canvas = torch.cat([canvas, torch.full((n_rows, extra), policy.mask_token_id)], dim=1)
        gen = torch.Generator().manual_seed(seed * 7919 + length)  # a length's batch does not depend on the others
        span = canvas.shape[1]
        with torch.no_grad():
            sampled = generate(policy, batch.prompt_ids, batch.prompt_mask, gen_length=span, block_length=span,
                               steps=max(span // 2, 1), temperature=temperature, canvas=canvas, generator=gen)
        completion = sampled.canvas
        maskable = torch.zeros_like(completion, dtype=torch.bool)
        for b in range(n_rows):
            blank = batch.completion_mask[b].nonzero()[:, 0].tolist()
            given = (~batch.completion_mask[b]).nonzero()[:, 0].tolist()
            cells = (blank + given)[: min(length, CELLS)]
            maskable[b, cells] = True
            maskable[b, CELLS:] = True
        out.append(LabBatch(length, batch.prompt_ids, batch.prompt_mask, completion, maskable,
                            reveal_step=sampled.reveal_step, temperature=temperature if temperature > 0 else 1.0))
    return out


def run_estimator_lab(
    output_dir: str | Path,
    policy,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    rows: int | Sequence[int] | None = None,
    cfg: LabConfig | None = None,
    progress: bool = True,
) -> dict:
    """Sample the batches, run the lab, write ``estimators.json``, ``lab.json`` and the PNG plots.

    Returns:
        ``lab.json``'s content: settings, per-length timings, the summary table and file names.
    """
    cfg = cfg or LabConfig()
    rows = rows if rows is not None else [default_rows(n) for n in lengths]
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    say = print if progress else (lambda *_: None)
    t0 = time.time()
    batches = sudoku_lab_batches(policy, lengths, rows, seed=cfg.seed)
    records = run_lab(policy, batches, cfg, progress=lambda m: say(f"[{time.time() - t0:6.0f}s] {m}"))
    write_json_atomic(out / "estimators.json", to_json_records(records))
    plots = plot_results(records, out)
    table = summary_table(records)
    traj = trajectory_table(records)
    lab = {"config": asdict(cfg), "lengths": list(lengths), "rows": rows if isinstance(rows, int) else list(rows),
           "seconds": round(time.time() - t0, 1), "summary_table": table, "trajectory_table": traj,
           "files": ["estimators.json", *[Path(p).name for p in plots]]}
    write_json_atomic(out / "lab.json", lab)
    say(table)
    if traj:
        say("\nThe trajectory likelihood (the order the sampler took; variance 0 given the rollout) against the target:")
        say(traj)
    say("(inf: infinite exact variance, e.g. Bernoulli double MC; ~: sampled against a high-budget reference, "
        "no exact table beyond 16 tokens; ratios are to exact-count double MC at the same NFE)")
    say(f"wrote {out / 'estimators.json'} ({len(records)} records) and {', '.join(Path(p).name for p in plots)}")
    return lab


def read_records(output_dir: str | Path) -> list[dict]:
    """The records of a finished lab run."""
    return json.loads((Path(output_dir) / "estimators.json").read_text())
