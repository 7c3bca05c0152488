"""Sudoku inputs of the variance lab (sudoku_lab_batches) and the lab's files (run_estimator_lab),
on the shipped tiny model."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dlmrl.data.tasks import SudokuTask
from dlmrl.estimators.analysis import LabConfig
from dlmrl.models.loading import load_policy
from dlmrl.training.estimator_lab import read_records, run_estimator_lab, sudoku_lab_batches

LENGTHS = (4, 8, 12, 16, 20)
PNGS = ("mse_vs_nfe.png", "grad_variance_vs_nfe.png", "variance_split.png")


@pytest.fixture(scope="module")
def shipped():
    return load_policy()


@pytest.fixture(scope="module")
def batches(shipped):
    return sudoku_lab_batches(shipped, LENGTHS, rows=2, seed=0)


def puzzle_of(policy, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> str:
    """The 16-character puzzle of a prompt ``[BOS] puzzle =``."""
    tokens = policy.tokenizer.convert_ids_to_tokens(prompt_ids[prompt_mask].tolist())
    assert tokens[0] == policy.tokenizer.bos_token and tokens[-1] == "="
    puzzle = "".join(tokens[1:-1])
    assert len(puzzle) == 16 and set(puzzle) <= set("01234")
    return puzzle


def test_batches_have_exactly_l_maskable_positions(shipped, batches):
    vocab = shipped.tokenizer.get_vocab()
    blank_counts = {
        e.puzzle.count("0") for e in SudokuTask(shipped.tokenizer, shipped.mask_token_id).test_examples
    }
    assert [b.length for b in batches] == list(LENGTHS)
    for batch in batches:
        length = batch.length
        rows = batch.completion.shape[0]
        assert rows == 2 and batch.prompt_ids.shape[0] == 2
        assert batch.completion.shape == batch.completion_mask.shape == (2, max(16, length))
        assert batch.completion_mask.dtype == torch.bool
        assert batch.completion_mask.sum(-1).tolist() == [length] * rows
        # sampling filled every mask token; nothing else is a mask token either
        assert not (batch.completion == shipped.mask_token_id).any()
        for b in range(rows):
            puzzle = puzzle_of(shipped, batch.prompt_ids[b], batch.prompt_mask[b])
            blanks = [i for i, c in enumerate(puzzle) if c == "0"]
            givens = [i for i, c in enumerate(puzzle) if c != "0"]
            # the puzzle's blank count is the one closest to L (ties: more blanks)
            want = min(blank_counts, key=lambda k: (abs(k - min(length, 16)), -k))
            assert len(blanks) == want, (length, puzzle)
            # maskable cells: the blanks first, then given cells in reading order, L of them in all
            cells = (blanks + givens)[: min(length, 16)]
            assert batch.completion_mask[b, :16].nonzero()[:, 0].tolist() == sorted(cells)
            # given cells keep the puzzle's digits; blanks got digits sampled by the model
            for i in givens:
                assert batch.completion[b, i] == vocab[puzzle[i]], (length, b, i)
            # positions past the grid are maskable (and were sampled)
            assert batch.completion_mask[b, 16:].all()


def test_rows_per_length_and_reproducibility(shipped, batches):
    again = sudoku_lab_batches(shipped, (8, 20), rows=[1, 2], seed=0)
    assert [b.completion.shape[0] for b in again] == [1, 2]
    # puzzles are chosen per length, whatever else is asked for
    assert torch.equal(again[1].prompt_ids, batches[-1].prompt_ids)
    assert torch.equal(again[1].completion_mask, batches[-1].completion_mask)
    # the same call gives the same completions
    assert all(
        torch.equal(a.completion, b.completion)
        for a, b in zip(again, sudoku_lab_batches(shipped, (8, 20), rows=[1, 2], seed=0))
    )


def test_too_many_rows_raise(shipped):
    with pytest.raises(ValueError, match="ask for fewer rows"):
        sudoku_lab_batches(shipped, (8,), rows=1000)
    with pytest.raises(ValueError, match="lengths must be >= 1"):
        sudoku_lab_batches(shipped, (0,), rows=1)


def test_run_estimator_lab_writes_its_files(shipped, tmp_path):
    cfg = LabConfig(budgets=(3,), repetitions=20, model_repetitions=2, num_directions=1)
    lab = run_estimator_lab(tmp_path / "lab", shipped, lengths=(4,), rows=1, cfg=cfg, progress=False)
    out = tmp_path / "lab"
    records = json.loads((out / "estimators.json").read_text())
    assert isinstance(records, list) and records == read_records(out)
    keys = (
        "estimator",
        "masking",
        "nodes",
        "samples_per_node",
        "nfe",
        "bias",
        "variance",
        "mse",
        "grad_variance",
    )
    assert {r["estimator"] for r in records} >= {"double_mc", "sdmc", "coupled_sdmc", "trajectory"}
    trajectory = [r for r in records if r["estimator"] == "trajectory"]
    records = [r for r in records if r["estimator"] != "trajectory"]
    for r in records:
        assert set(keys) <= set(r), r
        assert r["length"] == 4 and r["nfe"] == 3 and r["rows"] == 1 and r["target"] == "exact"
        # strict JSON: an infinite variance is null
        assert r["variance"] is None or math.isfinite(r["variance"])
    assert any(r["variance"] is None for r in records)  # Bernoulli double MC
    # the trajectory likelihood per merge factor: deterministic given the rollout, its MSE the squared gap
    assert [r["merge"] for r in trajectory] == [1, 2, 4]
    for r in trajectory:
        assert r["variance"] == 0 and r["grad_variance"] == 0 and r["target"] == "exact"
        assert len(r["values"]) == len(r["gaps"]) == 1
        assert r["mse"] == pytest.approx(r["gaps"][0] ** 2) and r["bias"] == pytest.approx(r["gaps"][0])
    assert trajectory[0]["nfe"] >= trajectory[1]["nfe"] >= trajectory[2]["nfe"] >= 1
    saved = json.loads((out / "lab.json").read_text())
    assert saved == json.loads(json.dumps(lab))
    assert saved["lengths"] == [4] and saved["rows"] == 1 and saved["config"]["repetitions"] == 20
    assert saved["files"] == ["estimators.json", *PNGS]
    table = saved["summary_table"].splitlines()
    assert table[0].startswith("| L | NFE |") and len(table) == 3 and table[2].startswith("| 4 | 3 |")
    for name in PNGS:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
