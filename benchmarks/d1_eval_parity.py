"""``eval.protocol=d1`` against d1's own parser on d1's shipped baseline generations (LLaDA-8B-Instruct).

    git clone https://github.com/dllm-reasoning/d1
    python benchmarks/d1_eval_parity.py d1/eval/eval_baselines [--run-d1-parser]

Reads every ``*_generations.json`` under the folder (d1's ``eval/eval.py`` output: ``question``, ``generations``,
``ground_truth`` per item, and the run's ``gen_length``, ``diffusion_steps``, ``block_length``), groups them by
setup as d1's ``aggregate_results`` does (the file name up to the shard index), and counts the right items (Sudoku:
right blank cells) with

- ``d1``: dlmrl's ``d1`` protocol (:mod:`dlmrl.rewards.d1_protocol`), compared with **d1's counts**:
  :data:`D1_COUNTS`, recorded from one run of d1's ``eval/parse_and_get_acc.py`` (commit 837888f) on these files,
  and, with ``--run-d1-parser``, recomputed now by d1's own parser from the clone the folder belongs to
  (``<folder>/../parse_and_get_acc.py``; its ``tiktoken`` token counter is replaced by a stub when ``tiktoken`` is
  missing: the counts do not use it), item by item;
- ``d1_fixed`` and ``strict`` (dlmrl's default metrics, on the text up to the first end token as ``dlmrl eval``
  decodes it; GSM8K items whose recorded gold is ``null``, d1's unparsed negative answers, count as wrong in every
  column because the files do not hold the gold).

Prints a markdown table and writes ``benchmarks/results/d1_eval_parity.json``. Exit status 1 if a ``d1`` count
differs from d1's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import types
from collections import defaultdict
from pathlib import Path

from dlmrl.rewards import d1_protocol as d1
from dlmrl.rewards.countdown import countdown_score
from dlmrl.rewards.gsm8k import gsm8k_correctness
from dlmrl.rewards.math_reward import math_correctness
from dlmrl.rewards.sudoku import sudoku_cell_accuracy

#: (correct, processed) per setup from d1's eval/parse_and_get_acc.py on eval/eval_baselines (d1 commit 837888f)
D1_COUNTS = {
    "countdown_instruct_128_64": (53, 256), "countdown_instruct_256_128": (50, 256),
    "countdown_instruct_512_256": (41, 256),
    "gsm8k_instruct_128_64": (783, 1130), "gsm8k_instruct_256_128": (863, 1130), "gsm8k_instruct_512_256": (883, 1130),
    "math500_instruct_128_64": (130, 500), "math500_instruct_256_128": (162, 500),
    "math500_instruct_512_256": (181, 500),
    "sudoku_instruct_128_64": (240, 2048), "sudoku_instruct_256_128": (137, 2048),
    "sudoku_instruct_512_256": (112, 2048),
}
_TASKS = {"gsm8k": "gsm8k", "math500": "math", "countdown": "countdown", "sudoku": "sudoku"}
_END = ("<|eot_id|>", "<|endoftext|>")


def d1_item(task: str, item: dict, fixed: bool) -> d1.D1Item:
    """One recorded item under dlmrl's d1 protocol (the gold as the file records it)."""
    text, gold = item.get("generations", ""), item.get("ground_truth")
    if task == "gsm8k":
        return d1.gsm8k_item(text, gold, fixed)
    if task == "math":
        return d1.math_item(text, gold, fixed)
    if task == "countdown":
        return d1.countdown_item(text, gold[0], gold[1], fixed)
    return d1.sudoku_item(text, d1.sudoku_puzzle(item.get("question", "")), gold, fixed)


def strict_count(task: str, item: dict) -> tuple[int, int]:
    """dlmrl's default (strict) verdict on the text up to the first end token: (right, out of)."""
    text, gold = item.get("generations", ""), item.get("ground_truth")
    cut = min([text.find(e) for e in _END if e in text], default=len(text))
    text = text[:cut]
    if task == "gsm8k":
        return (0 if gold is None else int(gsm8k_correctness(text, repr(gold)) > 0)), 1
    if task == "math":
        return int(math_correctness(text, gold) > 0), 1
    if task == "countdown":
        return int(countdown_score(text, gold[0], gold[1]) == 1.0), 1
    puzzle = d1.sudoku_puzzle(item.get("question", ""))
    blanks = puzzle.count("0")
    return round(sudoku_cell_accuracy(puzzle, gold, text) * blanks), blanks


def _d1_parser(folder: Path):
    """d1's own ``parse_and_get_acc`` module from the clone ``folder`` belongs to."""
    src = folder.resolve().parent / "parse_and_get_acc.py"
    if not src.is_file():
        raise SystemExit(f"--run-d1-parser: no {src}")
    sys.path.insert(0, str(src.parent))
    if importlib.util.find_spec("tiktoken") is None:  # (only its effective-token count uses it)
        stub = types.ModuleType("tiktoken")
        stub.get_encoding = lambda name: types.SimpleNamespace(encode=lambda text: text.split())
        sys.modules["tiktoken"] = stub
    spec = importlib.util.spec_from_file_location("d1_parse_and_get_acc", src)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {"gsm8k": module.parse_gsm_answers, "math": module.parse_math_answers,
            "countdown": module.parse_countdown_answers, "sudoku": module.parse_sudoku_answers}


def run(folder: Path, run_d1_parser: bool = False) -> dict:
    files = sorted(folder.glob("*_generations.json"))
    if not files:
        raise SystemExit(f"no *_generations.json under {folder}")
    parsers = _d1_parser(folder) if run_d1_parser else None
    setups: dict[str, dict] = defaultdict(lambda: defaultdict(int))
    mismatched_items = []
    for path in files:
        setup = re.match(r"(.+)_\d+_generations\.json$", path.name).group(1)
        task = _TASKS[setup.split("_")[0]]
        data = json.loads(path.read_text())
        row = setups[setup]
        row.update(task=task, gen_length=data["gen_length"], steps=data["diffusion_steps"],
                   block_length=data["block_length"])
        verdicts = []
        for item in data["generations"]:
            mine, fixed = d1_item(task, item, False), d1_item(task, item, True)
            right, _ = strict_count(task, item)
            row["items"] += 1
            row["out_of"] += mine.out_of
            row["d1"] += mine.correct
            row["d1_fixed"] += fixed.correct
            row["strict"] += right
            verdicts.append(mine.correct)
        if parsers is not None:
            correct, _, detail, _ = parsers[task](json_path=str(path))
            row["d1_parser_now"] += correct
            theirs = [int(d.get("correct_cells", d.get("is_correct"))) for d in detail]
            mismatched_items += [f"{path.name}#{i}" for i, (a, b) in enumerate(zip(verdicts, theirs)) if a != b]
    rows = []
    for setup, row in sorted(setups.items()):
        ref = D1_COUNTS.get(setup)
        row = dict(row, setup=setup, d1_counts=ref[0] if ref else None)
        row["match"] = ref is not None and row["d1"] == ref[0] and row["out_of"] == ref[1] and (
            parsers is None or row["d1_parser_now"] == row["d1"])
        for k in ("d1", "d1_fixed", "strict"):
            row[f"{k}_pct"] = round(100 * row[k] / row["out_of"], 2)
        rows.append(row)
    return {"folder": str(folder), "rows": rows, "all_match": all(r["match"] for r in rows),
            "d1_parser_run": parsers is not None, "mismatched_items": mismatched_items}


def table(result: dict) -> str:
    head = ("| task | gen length | steps | counted over | d1's parser | dlmrl `d1` | same | `d1` % | `d1_fixed` % | "
            "`strict` % |\n|---|---|---|---|---|---|---|---|---|---|\n")
    lines = [f"| {r['task']} | {r['gen_length']} | {r['steps']} | {r['out_of']} | {r['d1_counts']} | {r['d1']} | "
             f"{'yes' if r['match'] else 'NO'} | {r['d1_pct']:.2f} | {r['d1_fixed_pct']:.2f} | {r['strict_pct']:.2f} |"
             for r in result["rows"]]
    return head + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="d1's eval/eval_baselines (a local copy)")
    p.add_argument("--run-d1-parser", action="store_true",
                   help="also run d1's own eval/parse_and_get_acc.py from the clone and compare item by item")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "d1_eval_parity.json")
    args = p.parse_args(argv)
    result = run(args.folder, args.run_d1_parser)
    print(table(result))
    if result["mismatched_items"]:
        print(f"items where dlmrl's d1 differs from d1's parser: {result['mismatched_items'][:20]}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if result["all_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
