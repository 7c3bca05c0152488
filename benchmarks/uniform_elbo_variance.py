"""The uniform-noise ELBO estimators' bias, standard deviation and MSE against the exact ELBO (README table).

Runs :func:`dlmrl.training.uniform_estimator_lab.run_uniform_estimator_lab` (what ``dlmrl estimators --kind
uniform`` runs) on the lab's tiny random DiffusionGemma (vocabulary 8, canvas 4, seed 0): one canvas per row sampled
by the model's own sampler after a random prompt, the first L = 2 and 3 canvas positions scored (64 and 512 noise
states per row), every estimator at NFE 1, 2, 3, 4 and 8 side by side in one run. Exact figures from enumerating
every noise state (:mod:`dlmrl.estimators.uniform_lab`), sampled ones as a check. Writes
``benchmarks/results/uniform_elbo_variance.json`` (settings, timings, the summary table, every record).

    python benchmarks/uniform_elbo_variance.py          # about 2-3 minutes on 2 shared CPU cores
    python benchmarks/uniform_elbo_variance.py --model tiny-sudoku-uniform   # the shipped model, L = 2, ~3 minutes
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from dlmrl.estimators.uniform_lab import UniformLabConfig, uniform_label
from dlmrl.training.uniform_estimator_lab import (
    load_lab_model,
    read_uniform_records,
    run_uniform_estimator_lab,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (benchmarks/: bench_io, however this file is loaded)
from bench_io import finite


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", default="benchmarks/results/uniform_elbo_variance.json")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="tiny-uniform", choices=("tiny-uniform", "tiny-sudoku-uniform"),
                   help="tiny-uniform (default; L = 2, 3) or the shipped tiny-sudoku-uniform (vocabulary 22: L = 2, "
                        "4 rows, 1000 draws; writes uniform_elbo_variance_shipped.json)")
    args = p.parse_args()
    shipped = args.model == "tiny-sudoku-uniform"
    lengths, rows = ((2,), (4,)) if shipped else ((2, 3), (8, 4))
    cfg = UniformLabConfig(budgets=(1, 2, 3, 4, 8), repetitions=1000 if shipped else 2000, seed=args.seed)
    if shipped and args.output == p.get_default("output"):
        args.output = "benchmarks/results/uniform_elbo_variance_shipped.json"
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        lab = run_uniform_estimator_lab(tmp, load_lab_model(args.model, args.seed), lengths, list(rows), cfg)
        records = read_uniform_records(tmp)
    result = {
        "command": "python benchmarks/uniform_elbo_variance.py" + (" --model tiny-sudoku-uniform" if shipped else ""),
        "model": ("tiny-sudoku-uniform (shipped; random text prompts, not puzzles)" if shipped else
                  "tiny random DiffusionGemma (dlmrl.training.uniform_estimator_lab.tiny_lab_model: vocabulary 8, "
                  "canvas 4, seed 0)"),
        "lengths": list(lengths), "rows": list(rows), "seconds": round(time.time() - t0, 1),
        "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.platform(),
        "lab": lab, "records": records,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(finite(result), indent=1, allow_nan=False))
    print()
    for r in records:
        if r["nfe"] in (3, 4):
            print(f"L={r['length']} NFE={r['nfe']} {uniform_label(r):30s} bias {r['bias']:+.3g}  "
                  f"mse {r['mse'] if r['mse'] is not None else 'inf'}")
    print(f"wrote {out} ({result['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
