"""Every task with every family's tokenizer: no BOS (BERT-style, Dream-style), no pad token; the Sudoku task and
a text task encode, and ``dlmrl train`` runs on a BERT-style masked LM and a Dream-style stand-in."""

from __future__ import annotations

import pytest

from dlmrl import cli
from dlmrl.data.sudoku import SudokuExample
from dlmrl.data.tasks import SudokuTask
from tests.models.checkpoints import char_tokenizer, isolated_remote_code, save_bert, save_dream_like

EX = SudokuExample("0034301221034320", "1234341221434321")


def test_sudoku_encodes_with_a_tokenizer_without_bos_or_pad():
    tok = char_tokenizer(["[UNK]", "[MASK]", "[EOS]"], unk_token="[UNK]", mask_token="[MASK]", eos_token="[EOS]")
    assert tok.bos_token is None and tok.pad_token is None
    task = SudokuTask(tok, tok.mask_token_id)
    b = task.encode([EX, EX])
    assert tok.decode(b.prompt_ids[0]) == EX.puzzle + "=" and b.prompt_mask.all()
    assert (b.canvas == tok.mask_token_id).sum().item() == 2 * EX.puzzle.count("0")


@pytest.mark.parametrize("family", ["bert", "dream"])
def test_dlmrl_train_runs_sudoku_on_masked_lms_without_bos(family, tmp_path):
    with isolated_remote_code(tmp_path / "modules"):
        path = save_bert(tmp_path / "m") if family == "bert" else save_dream_like(tmp_path / "m")
        args = ["train", "--output-dir", str(tmp_path / "run"), "--no-progress", f"model.name_or_path={path}",
                "max_steps=1", "prompts_per_step=2", "num_generations=2", "eval.num_puzzles=4", "eval.batch_size=4",
                "eval.steps=4", "sampling.steps=4", "save_steps=1"]
        if family == "dream":
            args.append("model.trust_remote_code=true")
        assert cli.main(args) == 0
    assert (tmp_path / "run" / "summary.json").exists()
