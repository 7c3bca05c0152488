"""The variance lab at a fixed seed with enough repetitions for stable figures (README table).

Runs :func:`dlmrl.training.estimator_lab.run_estimator_lab` on the shipped tiny Sudoku model:
L = 8 (held-out puzzles with 8 blanks, infill), 16 (the whole grid), 64 and 256 (the grid plus a
longer canvas the model samples); exact figures from mask tables for L <= 16, a high-budget
stratified double-MC reference beyond. Writes ``benchmarks/results/estimator_variance.json``
(settings, timings, the summary table, every record) and the PNGs next to it, and prints the
ratios the README quotes: MSE and gradient variance of SDMC and coupled SDMC over exact-count
double MC at NFE 3 and 4, double MC's share of variance due to t, and the shrinkage of the
ELBO-difference variance by a shared MaskPlan.

    python benchmarks/estimator_variance.py            # about 20-30 min on 2 CPU cores
    python benchmarks/estimator_variance.py --fast     # a few minutes, noisier
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch

from dlmrl.estimators.analysis import LabConfig, record_label, value
from dlmrl.models.loading import load_policy
from dlmrl.training.estimator_lab import run_estimator_lab

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (benchmarks/: bench_io, however this file is loaded)
from bench_io import finite


def ratios(records: list[dict]) -> list[dict]:
    """Per (L, NFE): estimator / exact-count double MC for MSE and gradient variance, and the t share."""
    by = {(r["length"], r["nfe"], record_label(r)): r for r in records}
    out = []
    for (length, nfe, lab), dmc in sorted(by.items()):
        if lab != "double_mc[exact_count]" or nfe not in (3, 4):
            continue
        row = {"length": length, "nfe": nfe, "exact": math.isfinite(dmc.get("mse") or float("nan"))}
        for name in ("double_mc[bernoulli]", "double_mc[exact_count,strat]", "sdmc[exact_count]",
                     "sdmc[bernoulli]", "coupled_sdmc[exact_count]", "coupled_sdmc[bernoulli]"):
            r = by.get((length, nfe, name))
            if r is None:
                continue
            row[f"mse_ratio {name}"] = value(r, "mse") / value(dmc, "mse")
            row[f"grad_var_ratio {name}"] = value(r, "grad_variance") / value(dmc, "grad_variance")
        vt, vm = value(dmc, "variance_t"), value(dmc, "variance_mask")
        row["dmc_share_t"] = vt / (vt + vm)
        row["dmc_mse"] = value(dmc, "mse")
        row["diff_var_shrink"] = value(dmc, "diff_variance_independent") / value(dmc, "diff_variance")
        out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", default="benchmarks/results/estimator_variance.json")
    p.add_argument("--fast", action="store_true", help="fewer rows and repetitions (a quick, noisier look)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    lengths = (8, 16, 64, 256)
    if args.fast:
        rows = (8, 1, 2, 1)
        cfg = LabConfig(repetitions=2000, model_repetitions=32, num_directions=1, seed=args.seed)
    else:
        rows = (16, 3, 4, 2)
        cfg = LabConfig(repetitions=8000, model_repetitions=128, num_directions=2, reference_nfe=256,
                        reference_repeats=16, split_times=64, split_masks=4, seed=args.seed)
    out = Path(args.output)
    plots_dir = out.with_suffix("")
    t0 = time.time()
    lab = run_estimator_lab(plots_dir, load_policy(), lengths, rows, cfg)
    records = json.loads((plots_dir / "estimators.json").read_text())
    result = {
        "command": "python benchmarks/estimator_variance.py" + (" --fast" if args.fast else ""),
        "model": "tiny-sudoku (shipped)", "lengths": list(lengths), "rows": list(rows),
        "seconds": round(time.time() - t0, 1), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "machine": platform.platform(), "lab": lab, "ratios": ratios(records), "records": records,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(finite(result), indent=1, allow_nan=False))
    print()
    for r in result["ratios"]:
        print(f"L={r['length']:4d} NFE={r['nfe']}  dmc MSE {r['dmc_mse']:.3g}  "
              f"sdmc/dmc {r.get('mse_ratio sdmc[exact_count]', float('nan')):.2f}  "
              f"c-sdmc/dmc {r.get('mse_ratio coupled_sdmc[exact_count]', float('nan')):.2f}  "
              f"grad var sdmc/dmc {r.get('grad_var_ratio sdmc[exact_count]', float('nan')):.2f}  "
              f"c-sdmc/dmc {r.get('grad_var_ratio coupled_sdmc[exact_count]', float('nan')):.2f}  "
              f"t share {r['dmc_share_t']:.0%}  shared-plan shrink {r['diff_var_shrink']:.0f}x")
    print(f"wrote {out} and {plots_dir}/ ({result['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
