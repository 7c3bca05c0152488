"""benchmarks/d1_eval_parity.py on a small folder in d1's ``eval/eval.py`` output format (hand-written, offline):
it groups files by setup as d1 does, counts with each protocol, and fails when a count differs from d1's."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load():
    spec = importlib.util.spec_from_file_location("d1_eval_parity", ROOT / "benchmarks" / "d1_eval_parity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(folder: Path, name: str, items: list[dict], length: int = 128) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(json.dumps({"generations": items, "gen_length": length, "diffusion_steps": length // 2,
                                           "block_length": 32, "model_path": "x", "checkpoint_path": ""}))


def test_counts_per_setup_and_protocol(tmp_path):
    parity = load()
    folder = tmp_path / "eval_baselines"
    gsm = [{"question": "q", "generations": "<answer>\\boxed{18}</answer><|eot_id|>", "ground_truth": 18.0},
           {"question": "q", "generations": "<answer>1,234</answer>", "ground_truth": 1234.0},
           {"question": "q", "generations": "<answer>18 apples</answer>", "ground_truth": 18.0}]
    _write(folder, "gsm8k_instruct_128_64_0_generations.json", gsm[:2])
    _write(folder, "gsm8k_instruct_128_64_1_generations.json", gsm[2:])  # (a second shard of the same setup)
    sudoku = [{"question": "Solve the following Sudoku puzzle: 1034341221434321\n",
               "generations": "<answer>\n1234341221434321\n</answer>", "ground_truth": "1234341221434321"}]
    _write(folder, "sudoku_instruct_128_64_0_generations.json", sudoku)
    result = parity.run(folder)
    rows = {r["setup"]: r for r in result["rows"]}
    g = rows["gsm8k_instruct_128_64"]
    # d1: 18 right, "1,234" read as 234, "18 apples" read as 18; fixed: all three; strict: not "18 apples"
    assert (g["items"], g["d1"], g["d1_fixed"], g["strict"], g["gen_length"], g["steps"]) == (3, 2, 3, 2, 128, 64)
    s = rows["sudoku_instruct_128_64"]
    assert (s["out_of"], s["d1"], s["strict"]) == (1, 1, 1)
    assert not result["all_match"]  # (d1's counts on its real files are others)
    out = tmp_path / "parity.json"
    assert parity.main([str(folder), "--out", str(out)]) == 1
    assert json.loads(out.read_text())["rows"][0]["setup"] == "gsm8k_instruct_128_64"
