"""dlmrl's DiffusionGemma sampler against transformers' ``DiffusionGemmaForBlockDiffusion.generate``, token for token.

    python benchmarks/diffusion_gemma_parity.py

Tiny random checkpoints (:func:`dlmrl.models.diffusion_gemma.build_tiny_diffusion_gemma`: 2 layers, width 64, 4
experts, vocabulary 128): canvas length 8 (float32 and bfloat16), canvas length 4, and canvas length 8 with the EOS
row of the tied embedding scaled by 2 (EOS lands inside canvases, rows finish at different canvases). For each, a
grid of settings: denoising steps {2, 8} × entropy bound {0.1, 1.0} × temperature schedule {0.8 → 0.4 (transformers'
default), 1.5 → 0.1} × early stopping {off (``stability_threshold=None``), on (stability 1, confidence 2.0)}, with
``max_new_tokens`` = 3 canvases, on 8 left-padded prompt rows (pads 0-3). Each setting runs
``torch.manual_seed(s); model.generate(...)`` and ``sample_diffusion_gemma(..., seed=s)`` and counts the rows whose
sequences are identical. The table also shows the canvases written, the rows that
produced an EOS, the (canvas, row) pairs that stopped early, and the accepted tokens per active step. Writes
``benchmarks/results/diffusion_gemma_parity.json``; exit status 1 if any row differs. CPU, 1 thread, under a minute.
"""

from __future__ import annotations

import itertools
import json
import platform
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

from dlmrl.models.diffusion_gemma import build_tiny_diffusion_gemma
from dlmrl.models.uniform_sampler import sample_diffusion_gemma

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "diffusion_gemma_parity.json"
ROWS, PROMPT, VOCAB = 8, 6, 128
STEPS = (2, 8)
BOUNDS = (0.1, 1.0)
SCHEDULES = ((0.4, 0.8), (0.1, 1.5))
EARLY_STOP = {"off": {"stability_threshold": None}, "on": {"stability_threshold": 1, "confidence_threshold": 2.0}}


def models() -> dict[str, torch.nn.Module]:
    eos = build_tiny_diffusion_gemma(seed=0)
    with torch.no_grad():
        eos.model.decoder.embed_tokens.weight[1] *= 2.0
    return {"L8 float32": build_tiny_diffusion_gemma(seed=0),
            "L8 bfloat16": build_tiny_diffusion_gemma(seed=2, dtype=torch.bfloat16),
            "L4 float32": build_tiny_diffusion_gemma(seed=1, canvas_length=4),
            "L8 float32 EOS-biased": eos}


def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(123)
    ids = torch.randint(3, VOCAB - 3, (ROWS, PROMPT), generator=g)
    mask = torch.ones_like(ids)
    for row in range(ROWS):
        ids[row, :row % 4] = 0
        mask[row, :row % 4] = 0
    return ids, mask


def main() -> int:
    torch.set_num_threads(1)
    ids, mask = prompts()
    rows, started = [], time.time()
    t_generate = t_sampler = 0.0
    for (name, model), (k, (steps, bound, (t_min, t_max), stop)) in itertools.product(
            models().items(), enumerate(itertools.product(STEPS, BOUNDS, SCHEDULES, EARLY_STOP))):
        length = model.config.canvas_length
        settings = dict(max_denoising_steps=steps, t_min=t_min, t_max=t_max, max_new_tokens=3 * length,
                        **EARLY_STOP[stop])
        seed = 1000 + k
        t0 = time.perf_counter()
        torch.manual_seed(seed)
        ref = model.generate(ids, attention_mask=mask, sampler_config=EntropyBoundSamplerConfig(bound), **settings)
        t1 = time.perf_counter()
        out = sample_diffusion_gemma(model, ids, mask, seed=seed, entropy_bound=bound, **settings)
        t2 = time.perf_counter()
        t_generate += t1 - t0
        t_sampler += t2 - t1
        same = (out.sequences == ref.sequences).all(dim=1) if out.sequences.shape == ref.sequences.shape else \
            torch.zeros(ROWS, dtype=torch.bool)
        eos_rows = int((out.completions == 1).any(dim=1).sum())
        early = sum(int(((c.steps_per_row() > 0) & (c.steps_per_row() < steps)).sum()) for c in out.canvases)
        accepted = torch.cat([c.accepted[c.active].sum(-1).float() for c in out.canvases])
        rows.append({"model": name, "steps": steps, "entropy_bound": bound, "t_max": t_max, "t_min": t_min,
                     "early_stop": stop, "max_new_tokens": 3 * length, "seed": seed, "rows": ROWS,
                     "identical": int(same.sum()), "canvases": len(out.canvases),
                     "steps_run": [c.num_steps for c in out.canvases], "rows_with_eos": eos_rows,
                     "canvas_rows_stopped_early": early, "accepted_per_step": round(float(accepted.mean()), 3),
                     "tokens_per_forward": round(float(out.tokens_per_forward.mean()), 3),
                     "record_bytes": out.record_bytes()})
    total = sum(r["rows"] for r in rows)
    identical = sum(r["identical"] for r in rows)
    print(f"{'model':<22} {'steps':>5} {'gamma':>5} {'t':>9} {'stop':>4} {'canvases':>8} {'eos rows':>8} "
          f"{'early':>5} {'acc/step':>8} {'identical':>9}")
    for r in rows:
        print(f"{r['model']:<22} {r['steps']:>5} {r['entropy_bound']:>5} {r['t_max']:>4}->{r['t_min']:<4} "
              f"{r['early_stop']:>4} {r['canvases']:>8} {r['rows_with_eos']:>8} {r['canvas_rows_stopped_early']:>5} "
              f"{r['accepted_per_step']:>8} "
              f"{r['identical']:>5}/{r['rows']}")
    print(f"\n{identical}/{total} rows token-identical over {len(rows)} settings; generate {t_generate:.1f} s, "
          f"dlmrl sampler {t_sampler:.1f} s (1 thread)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "transformers": transformers.__version__, "torch": torch.__version__, "machine": platform.machine(),
        "device": "cpu", "threads": 1, "settings": len(rows), "rows_total": total, "rows_identical": identical,
        "generate_seconds": round(t_generate, 2), "sampler_seconds": round(t_sampler, 2),
        "seconds": round(time.time() - started, 1), "results": rows}, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0 if identical == total else 1


if __name__ == "__main__":
    sys.exit(main())
