"""dlmrl's masked-diffusion rollouts against Fast-dLLM's own LLaDA samplers, side by side on the same checkpoint.

    git clone https://github.com/NVlabs/Fast-dLLM        # llada/model/ (LLaDA's code) and llada/generate.py
    python benchmarks/peers/fast_dllm_rollouts.py Fast-dLLM [--repeats 3] [--gen-length 256] [--block-length 32]
        [--threshold 0.9] [--batch-sizes 1 8] [--modes threshold schedule] [--threads N] [--output PATH]

The checkpoint: ``benchmarks/remote_code_checkpoints.build_checkpoint`` writes a tiny random checkpoint of LLaDA's
published model code as the clone ships it (``llada/model/configuration_llada.py`` and ``modeling_llada.py``,
Fast-dLLM's copy with its cache additions; 2 layers, width 64, the real 126464-token vocabulary and mask id 126336),
the one ``benchmarks/remote_code_check.py`` checks. dlmrl loads it (``load_policy(path, trust_remote_code=True)``,
family ``llada``) and both tools then run on that one loaded module (``policy.model``): the same weights, the same
forward code, float32, CPU, in this one process.

The peer: Fast-dLLM's own samplers of ``llada/generate.py`` (imported from the clone): ``generate`` (no cache),
``generate_with_prefix_cache`` and ``generate_with_dual_cache``, all called with ``temperature=0``,
``remasking="low_confidence"``, ``mask_id=126336``. dlmrl: ``dlmrl.models.sampler.generate`` with the same
``gen_length``, ``block_length``, ``steps`` and ``threshold``, and the matching cache (``sampling.cache``): none
against ``generate``, ``prefix`` against ``generate_with_prefix_cache``, ``dual`` against
``generate_with_dual_cache``. On LLaDA's code dlmrl's cache runs the checkpoint's own blocks with explicit rotary
positions (``dlmrl/models/llada_cache.py``: the released ``LLaDAModel.forward`` refuses a cache, and Fast-dLLM's
copy adds ``replace_position`` for its dual cache, which dlmrl does not call).

Two decoding modes (``--modes``), greedy both:

- ``threshold``: Fast-dLLM's threshold parallel decoding, ``threshold=--threshold`` (0.9) on both sides (dlmrl's
  ``sampling.threshold``): each step reveals every masked position of the block whose confidence reaches the
  threshold, at least the most confident one. dlmrl's rule is token-identical to Fast-dLLM's ``generate``
  (``benchmarks/remote_code_check.py``, row "threshold decoding = Fast-dLLM").
- ``schedule``: the fixed schedule, ``steps`` (default ``gen_length``: one token per step) split evenly over the
  blocks, each step revealing its scheduled number of most confident positions; token-identical to Fast-dLLM's
  ``generate`` (row "greedy = Fast-dLLM generate()").

Pairs and what is equal: for each batch size, mode and peer sampler, the script checks the completions token by
token against dlmrl with the same cache, which must be token-identical in both modes (the same algorithm and the
same approximation: a block's later passes reuse the keys and values of its first pass; a difference is reported
as FAIL and the exit status is 1).
Forward passes (NFE per completion) are reported for both sides. An untimed check first runs every sampler on a
one-layer copy of the checkpoint (``config.json`` ``n_layers: 1``, the same file), where Fast-dLLM's caches are
exact (layer 0's keys and values depend only on each position's token and position, and the cached positions'
tokens do not change within a block): there all three Fast-dLLM samplers must give uncached dlmrl's tokens (else FAIL,
exit status 1), which shows the peers are called as their code means; on the two-layer model the cached decodes
differ from the uncached one (the script reports the fraction of tokens each cached pair shares with the uncached
decode), so the cached pairs' equality is not the uncached one's.

Batches (``--batch-sizes``): Fast-dLLM's samplers decode one prompt at a time (they build the canvas as
``torch.full((1, P + L), mask_id)``; a batch of prompts does not broadcast into it), so at batch ``B > 1`` the peer
decodes the ``B`` prompts one after the other, as a user of that code would, and dlmrl decodes them as one batch
(with a threshold, rows whose block is decoded leave dlmrl's model batch). The prompts are short arithmetic strings
of equal token length (no padding on either side).

Timing: each repeat runs, per batch size and mode, dlmrl and the peers back to back, dlmrl first on even repeats and
last on odd ones; one small untimed call of each sampler warms up first. Throughput is completion tokens per second
(``B * gen_length / seconds``); the ratio is dlmrl / peer in tokens per second (> 1: dlmrl faster), per repeat, with
min / median / max over the repeats. Run it alone on the machine. A repeat runs, per batch size and mode, dlmrl
once (batched) and each Fast-dLLM sampler once per prompt: at the defaults 8 single-prompt decodes at batch 1 and
2 batched dlmrl decodes plus 48 single-prompt Fast-dLLM decodes at batch 8, each of 256 tokens. For a short check:
``--repeats 1 --gen-length 64`` (or fewer ``--modes`` / ``--batch-sizes`` / ``--peers``).

Writes ``benchmarks/results/peers_fast_dllm_rollouts.json`` (``--output``): command, Fast-dLLM commit, dlmrl commit,
machine, settings, per-repeat seconds and NFE, and the summary.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "peers")]  # (however it is loaded)
from bench_io import write_result
from peer_common import dlmrl_commit

PEERS = {"generate": "generate", "prefix_cache": "generate_with_prefix_cache", "dual_cache": "generate_with_dual_cache"}
#: dlmrl's ``sampling.cache`` for each peer: the same algorithm and the same approximation
DLMRL_CACHE = {"generate": "none", "prefix_cache": "prefix", "dual_cache": "dual"}
EXPECTED_IDENTICAL = set(PEERS)  # every pair computes the same thing
MODES = ("threshold", "schedule")
# equal token length in the checkpoint's character tokenizer: a batch needs no padding on either side
PROMPTS = ["12+3=", "45+6=", "78-9=", "23*4=", "56+7=", "89-1=", "34*2=", "67+8="]
GENERATE_PY = Path("llada") / "generate.py"


def clone_error(clone: Path) -> str | None:
    """Why ``clone`` cannot serve as the peer (None when it can): it must hold ``llada/generate.py`` defining the
    three samplers and LLaDA's model code (``configuration_llada.py`` + ``modeling_llada.py``) under ``llada/``."""
    if not clone.is_dir():
        return f"{clone} is not a folder: pass a local clone of NVlabs/Fast-dLLM (git clone https://github.com/NVlabs/Fast-dLLM)"
    path = clone / GENERATE_PY
    if not path.is_file():
        return (f"{clone} has no {GENERATE_PY} (Fast-dLLM's LLaDA samplers): pass the root of a clone of "
                f"NVlabs/Fast-dLLM (git clone https://github.com/NVlabs/Fast-dLLM)")
    text = path.read_text(errors="replace")
    missing = [f for f in PEERS.values() if f"def {f}(" not in text]
    if missing:
        return f"{path} defines no {', '.join(missing)}: this script needs Fast-dLLM's three LLaDA samplers"
    if not ((clone / "llada" / "model" / "configuration_llada.py").is_file()
            and (clone / "llada" / "model" / "modeling_llada.py").is_file()):
        return f"{clone} has no llada/model/configuration_llada.py + modeling_llada.py (LLaDA's model code)"
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Needs a local clone of NVlabs/Fast-dLLM (not a dependency of dlmrl).")
    p.add_argument("clone", type=Path, help="a local clone of NVlabs/Fast-dLLM (holds llada/generate.py)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default 3)")
    p.add_argument("--gen-length", type=int, default=256, help="completion tokens per prompt (default 256)")
    p.add_argument("--block-length", type=int, default=32, help="block size (default 32); must divide --gen-length")
    p.add_argument("--steps", type=int, default=None,
                   help="denoising steps of the schedule mode (default --gen-length: one token per step); a "
                        "multiple of the number of blocks. Unused by the threshold rule (both sides)")
    p.add_argument("--threshold", type=float, default=0.9, help="threshold of the threshold mode (default 0.9)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8], help=f"default 1 8 (at most {len(PROMPTS)})")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="default: threshold schedule")
    p.add_argument("--peers", nargs="+", choices=tuple(PEERS), default=list(PEERS),
                   help="Fast-dLLM samplers to time (default: all three)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    p.add_argument("--work", type=Path, default=None, help="folder for the tiny checkpoint (default: a temp dir)")
    p.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "peers_fast_dllm_rollouts.json"))
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.gen_length < 1 or args.block_length < 1 or args.gen_length % args.block_length:
        p.error(f"--block-length ({args.block_length}) must be >= 1 and divide --gen-length ({args.gen_length})")
    blocks = args.gen_length // args.block_length
    args.steps = args.gen_length if args.steps is None else args.steps
    if args.steps < 1 or args.steps % blocks:
        p.error(f"--steps ({args.steps}) must be a positive multiple of the number of blocks ({blocks})")
    if not 0 < args.threshold <= 1:
        p.error(f"--threshold must be in (0, 1], got {args.threshold}")
    if any(not 1 <= b <= len(PROMPTS) for b in args.batch_sizes):
        p.error(f"--batch-sizes must each be in 1..{len(PROMPTS)}, got {args.batch_sizes}")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    why = clone_error(args.clone)
    if why:
        p.error(why)
    return args


# -- the two sides ----------------------------------------------------------------------------------------------
def run_dlmrl(policy, ids, args, mode: str, gen_length: int | None = None, cache: str = "none") -> dict:
    """dlmrl's sampler with ``cache`` on the ``(B, P)`` prompts: seconds, ``(B, L)`` canvas, mean passes per row."""
    import torch

    from dlmrl.models.sampler import generate

    length = gen_length or args.gen_length
    steps = length // args.block_length * (args.steps // (args.gen_length // args.block_length))
    t0 = time.perf_counter()
    with torch.no_grad():
        out = generate(policy, ids, torch.ones_like(ids, dtype=torch.bool), gen_length=length,
                       block_length=args.block_length, steps=steps,
                       threshold=args.threshold if mode == "threshold" else None, cache=cache)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "canvas": out.canvas, "nfe_per_row": float(out.row_nfe.float().mean())}


def run_peer(fn, model, ids, args, mode: str, mask_id: int, gen_length: int | None = None) -> dict:
    """A Fast-dLLM sampler, one prompt at a time (its samplers take a batch of one): seconds (all rows), the
    ``(B, L)`` canvas, mean passes per row."""
    import torch

    length = gen_length or args.gen_length
    steps = length // args.block_length * (args.steps // (args.gen_length // args.block_length))
    rows, nfes = [], []
    t0 = time.perf_counter()
    for r in range(ids.shape[0]):
        x, nfe = fn(model, ids[r:r + 1], steps=steps, gen_length=length, block_length=args.block_length,
                    temperature=0.0, remasking="low_confidence", mask_id=mask_id,
                    threshold=args.threshold if mode == "threshold" else None)
        rows.append(x[:, ids.shape[1]:])
        nfes.append(int(nfe))
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "canvas": torch.cat(rows), "nfe_per_row": statistics.fmean(nfes)}


def one_layer_copy(ckpt: Path, out: Path) -> Path:
    """A copy of the checkpoint folder whose ``config.json`` says ``n_layers: 1`` (the file's first block is used,
    the second ignored). With one layer Fast-dLLM's caches are exact: the cached keys and values of layer 0 depend
    only on each position's token and position, and the cached positions' tokens do not change within a block."""
    import json
    import shutil

    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(ckpt, out)
    config = json.loads((out / "config.json").read_text())
    config["n_layers"] = 1
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def one_layer_check(ckpt: Path, fns: dict, args) -> dict:
    """Untimed: on the one-layer copy (:func:`one_layer_copy`), where every sampler computes the same thing, each
    Fast-dLLM sampler's tokens against dlmrl's, per mode, batch 1, two blocks. Shows that the peers are called as
    their code means (positions, cache hand-over) and that the caches' token differences on the two-layer model
    come from their approximation."""
    from transformers.utils import logging as hf_logging

    from dlmrl.models.loading import load_policy

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # (the load report lists the ignored second block's weights as unexpected)
    try:
        policy = load_policy(str(one_layer_copy(ckpt, ckpt.parent / "llada_tiny_one_layer")), trust_remote_code=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    ids = policy.tokenizer(PROMPTS[:1], add_special_tokens=False, return_tensors="pt")["input_ids"]
    length = 2 * args.block_length
    out = {}
    for mode in args.modes:
        ours = run_dlmrl(policy, ids, args, mode, gen_length=length)["canvas"]  # (uncached: every cache is exact)
        for peer, fn in fns.items():
            theirs = run_peer(fn, policy.model.eval(), ids, args, mode, policy.mask_token_id, gen_length=length)
            out[f"{mode}/{peer}"] = compare(ours, theirs["canvas"])
    return out


def compare(ours, theirs) -> dict:
    """Token equality of two ``(B, L)`` canvases: identical or not, and the fraction of equal positions."""
    same = ours == theirs
    return {"identical": bool(same.all()), "identical_fraction": float(same.float().mean())}


# -- the driver -------------------------------------------------------------------------------------------------
def summarize(repeats: list[dict], args) -> list[dict]:
    """Per (batch size, mode, peer): median seconds and tokens/s of each side, the per-repeat ratio
    dlmrl / peer in tokens per second (= peer seconds / dlmrl seconds) as min / median / max, the token equality
    (of the first repeat; greedy decoding repeats itself, checked) and the passes per completion."""
    rows = []
    for batch in args.batch_sizes:
        for mode in args.modes:
            for peer in args.peers:
                ours = f"dlmrl/{DLMRL_CACHE[peer]}"
                pairs = [(r["runs"][f"{batch}/{mode}"][ours], r["runs"][f"{batch}/{mode}"][peer]) for r in repeats]
                tokens = batch * args.gen_length
                ratios = [p["seconds"] / d["seconds"] for d, p in pairs]
                d_med = statistics.median(d["seconds"] for d, _ in pairs)
                p_med = statistics.median(p["seconds"] for _, p in pairs)
                eq = repeats[0]["equality"][f"{batch}/{mode}/{peer}"]
                rows.append({
                    "batch": batch, "mode": mode, "peer": PEERS[peer], "dlmrl_cache": DLMRL_CACHE[peer],
                    "tokens": tokens,
                    "dlmrl_median_seconds": d_med, "peer_median_seconds": p_med,
                    "dlmrl_tokens_per_second": tokens / d_med, "peer_tokens_per_second": tokens / p_med,
                    "ratio_dlmrl_over_peer": {"min": min(ratios), "median": statistics.median(ratios),
                                              "max": max(ratios)},
                    "expected_identical": peer in EXPECTED_IDENTICAL, **eq,
                    "same_tokens_every_repeat": all(r["equality"][f"{batch}/{mode}/{peer}"] == eq for r in repeats),
                    "identical_to_uncached_fraction": repeats[0].get("vs_uncached", {}).get(
                        f"{batch}/{mode}/{DLMRL_CACHE[peer]}"),
                    "nfe_per_row": {"dlmrl": pairs[0][0]["nfe_per_row"], "peer": pairs[0][1]["nfe_per_row"]},
                })
    return rows


def verdict(row: dict) -> str:
    if row["expected_identical"]:
        return "PASS" if row["identical"] and row["same_tokens_every_repeat"] else "FAIL"
    return "INFO"


def format_table(rows: list[dict], threshold: float, steps: int) -> str:
    header = ("| batch | mode | Fast-dLLM sampler | dlmrl cache | dlmrl s | peer s | dlmrl / peer tok/s (min, median, "
              "max) | tokens identical | NFE/row dlmrl, peer | check |")
    lines = [header, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        q = r["ratio_dlmrl_over_peer"]
        mode = f"threshold {threshold}" if r["mode"] == "threshold" else f"schedule, {steps} steps"
        lines.append(f"| {r['batch']} | {mode} | {r['peer']} | {r.get('dlmrl_cache', 'none')} | "
                     f"{r['dlmrl_median_seconds']:.2f} | "
                     f"{r['peer_median_seconds']:.2f} | {q['min']:.2f}, **{q['median']:.2f}**, {q['max']:.2f} | "
                     f"{r['identical_fraction']:.4f} | {r['nfe_per_row']['dlmrl']:.1f}, "
                     f"{r['nfe_per_row']['peer']:.1f} | {verdict(r)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from remote_code_check import load_function, prepare_work

    work, _ = prepare_work(args.work, "peers_fast_dllm_")  # (HF_MODULES_CACHE, before transformers is imported)
    import torch
    import transformers
    from remote_code_checkpoints import MASK_IDS, build_checkpoint, find_code

    from dlmrl.models.loading import load_policy

    if args.threads:
        torch.set_num_threads(args.threads)
    clone = args.clone.resolve()
    source = find_code([clone], ("llada",))["llada"]
    ckpt = build_checkpoint(source, work / "llada_tiny")
    policy = load_policy(str(ckpt), trust_remote_code=True)
    if policy.family != "llada" or policy.mask_token_id != MASK_IDS["llada"]:
        raise SystemExit(f"the tiny checkpoint loaded as family {policy.family!r}, mask id {policy.mask_token_id}")
    model, mask_id = policy.model.eval(), policy.mask_token_id
    fns = {peer: load_function(clone / GENERATE_PY, PEERS[peer]) for peer in args.peers}
    one_layer = one_layer_check(ckpt, fns, args)
    for key, eq in one_layer.items():
        print(f"one-layer copy (caches exact), {key}: tokens identical {eq['identical_fraction']:.4f} "
              f"{'PASS' if eq['identical'] else 'FAIL'}", flush=True)
    ids_all = policy.tokenizer(PROMPTS, add_special_tokens=False, return_tensors="pt")["input_ids"]  # (8, P) unpadded

    warm = ids_all[:1]  # one untimed block of each sampler
    for mode in args.modes:
        for peer in args.peers:
            run_dlmrl(policy, warm, args, mode, gen_length=args.block_length, cache=DLMRL_CACHE[peer])
            run_peer(fns[peer], model, warm, args, mode, mask_id, gen_length=args.block_length)

    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    started, repeats = time.time(), []
    for r in range(args.repeats):
        rep = {"repeat": r, "order": "dlmrl first" if r % 2 == 0 else "dlmrl last", "runs": {}, "equality": {}}
        for batch in args.batch_sizes:
            ids = ids_all[:batch]
            for mode in args.modes:
                runs = {}
                for peer in args.peers:  # (each pair back to back, dlmrl first on even repeats)
                    ours = f"dlmrl/{DLMRL_CACHE[peer]}"
                    for side in ([ours, peer] if r % 2 == 0 else [peer, ours]):
                        runs[side] = (run_dlmrl(policy, ids, args, mode, cache=DLMRL_CACHE[peer]) if side == ours
                                      else run_peer(fns[side], model, ids, args, mode, mask_id))
                        print(f"repeat {r} batch {batch} {mode} {side}: {runs[side]['seconds']:.2f} s, "
                              f"{runs[side]['nfe_per_row']:.1f} passes per completion", flush=True)
                    rep["equality"][f"{batch}/{mode}/{peer}"] = compare(runs[ours]["canvas"], runs[peer]["canvas"])
                if "dlmrl/none" in runs:  # (how far each cache moved the tokens from the exact decode)
                    for cache in ("prefix", "dual"):
                        if f"dlmrl/{cache}" in runs:
                            rep.setdefault("vs_uncached", {})[f"{batch}/{mode}/{cache}"] = compare(
                                runs["dlmrl/none"]["canvas"], runs[f"dlmrl/{cache}"]["canvas"])["identical_fraction"]
                rep["runs"][f"{batch}/{mode}"] = {s: {k: v for k, v in run.items() if k != "canvas"}
                                                  for s, run in runs.items()}
        repeats.append(rep)
    rows = summarize(repeats, args)
    table = format_table(rows, args.threshold, args.steps)
    print("\n" + table)
    result = {
        "benchmark": "peers_fast_dllm_rollouts",
        "command": " ".join(["python", "benchmarks/peers/fast_dllm_rollouts.py",
                             *(sys.argv[1:] if argv is None else [str(a) for a in argv])]),
        "fast_dllm": {"commit": source.commit, "code": "llada/model (configuration_llada.py, modeling_llada.py)",
                      "samplers": f"llada/generate.py: {', '.join(PEERS[p] for p in args.peers)}"},
        "dlmrl_commit": dlmrl_commit(), "transformers": transformers.__version__, "torch": torch.__version__,
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "processor": platform.processor(), "cpus": os.cpu_count(),
                    "threads": args.threads or f"torch's default ({torch.get_num_threads()})",
                    "load_average_1min_before": load_before},
        "settings": {"gen_length": args.gen_length, "block_length": args.block_length, "threshold": args.threshold,
                     "schedule_steps": args.steps, "batch_sizes": args.batch_sizes, "modes": args.modes,
                     "repeats": args.repeats, "temperature": 0.0, "remasking": "low_confidence",
                     "dtype": "float32", "device": "cpu", "prompts": PROMPTS,
                     "checkpoint": f"remote_code_checkpoints.build_checkpoint: {model.config.n_layers} layers, width "
                                   f"{model.config.d_model}, vocabulary {model.config.vocab_size}, "
                                   f"{sum(p.numel() for p in model.parameters())} parameters",
                     "peer_batching": "one prompt at a time (Fast-dLLM's samplers take a batch of one)",
                     "dlmrl_cache": {PEERS[p]: DLMRL_CACHE[p] for p in args.peers}},
        "one_layer_check": {"what": f"one-layer copy of the checkpoint, batch 1, {2 * args.block_length} tokens, "
                                    "untimed: every sampler exact, tokens must be identical", "pairs": one_layer},
        "seconds": round(time.time() - started, 1), "summary": rows, "table": table, "repeats": repeats,
    }
    write_result(args.output, result)
    return int(any(verdict(r) == "FAIL" for r in rows) or not all(eq["identical"] for eq in one_layer.values()))


if __name__ == "__main__":
    sys.exit(main())
