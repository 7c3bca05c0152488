import torch

from dlmrl.data.sudoku import SudokuExample
from dlmrl.data.tasks import SudokuTask
from dlmrl.models.tokenizer import build_char_tokenizer

SOLUTION = "1234341221434321"
EX = SudokuExample("".join("0" if i in (1, 3, 4, 9, 14) else c for i, c in enumerate(SOLUTION)), SOLUTION)


def make(mode):
    tok = build_char_tokenizer()
    return tok, SudokuTask(tok, tok.mask_token_id, answer_mode=mode)


def test_infill_canvas_preplaces_givens_and_masks_blanks():
    tok, task = make("infill")
    b = task.encode([EX])
    assert b.canvas.shape == (1, 16)
    assert b.completion_mask[0].tolist() == [c == "0" for c in EX.puzzle]
    givens = ~b.completion_mask[0]
    assert tok.decode(b.canvas[0][givens]) == "".join(c for c in EX.puzzle if c != "0")
    assert tok.decode(b.prompt_ids[0]) == "[BOS]" + EX.puzzle + "="


def test_full_canvas_masks_everything():
    tok, task = make("full")
    b = task.encode([EX])
    assert bool(b.completion_mask.all()) and bool((b.canvas == tok.mask_token_id).all())


def test_decode_keeps_one_cell_per_position_and_stops_at_eos():
    tok, task = make("infill")
    ids = tok.convert_tokens_to_ids(list("1234\n412") + ["[PAD]"] + list("143432") + ["[EOS]"])
    text = task.decode(torch.tensor([ids]))[0]
    assert text == "1234?412?143432"
    # the newline stays a (wrong) cell instead of being stripped and shifting later cells
    assert task.rewards([EX], [text])[0] < 1.0


def test_reward_of_solution_is_one_and_repeat_groups_rows():
    _tok, task = make("infill")
    assert task.rewards([EX], [EX.solution]) == [1.0]
    b = task.encode([EX, EX]).repeat(3)
    assert b.canvas.shape == (6, 16) and len(b.examples) == 6


def test_train_batches_are_deterministic_in_seed_and_step():
    _, task = make("infill")
    assert task.train_batch(4, 0, 5) == task.train_batch(4, 0, 5)
    assert task.train_batch(4, 0, 5) != task.train_batch(4, 0, 6)
