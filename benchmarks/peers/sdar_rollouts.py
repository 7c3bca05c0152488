"""dlmrl's exact-cache block sampler against SDAR's own ``block_diffusion_generate``, side by side on the same work.

Both sides decode the same batch of prompts with the same weights: a tiny random checkpoint of SDAR's published
model code (``benchmarks/sdar_parity.py``'s: ``remote_code_checkpoints.build_checkpoint`` on the clone's
``configuration_sdar.py`` + ``modeling_sdar.py``: 2 layers, width 64, SDAR-4B-Chat's config otherwise, vocabulary
151,936, mask id 151,669, block size 4), loaded once; SDAR's ``generate.py`` calls the model object dlmrl holds (through
``sdar_parity.ReferenceModel``, which only adds the head axis to SDAR's 3-D mask). Usage::

    git clone https://github.com/JetAstra/SDAR       # generate.py, training/model/SDAR-4B-Chat/modeling_sdar.py
    pip install triton                               # (or on PYTHONPATH: the clone's model code imports it for its
                                                     #  fused SFT loss; nothing here calls it)
    python benchmarks/peers/sdar_rollouts.py SDAR [--repeats 3] [--rules sequential,low_confidence,dynamic]
        [--batch 8] [--gen-length 64] [--threads N] [--no-uncached] [--output FILE]

Per rule, each repeat times one call of each side in alternation (dlmrl with its exact cache, SDAR's
``block_diffusion_generate``, then dlmrl with ``sampling.cache`` off unless ``--no-uncached``), after one untimed
warm-up call of each. Tokens per second = batch x gen_length / the call's wall time; the ratio dlmrl / SDAR is of
tokens per second (> 1: dlmrl is faster), reported as min / median / max over the repeats. Every timed call's tokens
are compared: dlmrl's completion must equal SDAR's ``x[:, P:P + gen_length]`` token for token (and the uncached
column the cached one); a difference makes the exit status 1.

What is the same on both sides:

- prompts: ``--batch`` prompts of 8 characters (8 tokens of the checkpoint's character tokenizer: two blocks of 4,
  so SDAR's blocks, aligned to position 0, and dlmrl's, which start the completion on a block, coincide), all of one
  length and unpadded. dlmrl decodes the batch in one call; SDAR's ``block_diffusion_generate`` decodes one prompt
  per call (its canvas is ``x = torch.full((1, total_length), ...)``), so its side is ``--batch`` calls, one per
  prompt, in order, timed together. That is the peer as published, not a matched setting: ``--batch 1`` compares
  one sequence at a time;
- ``gen_length`` (default 64 = 16 blocks of 4), the checkpoint's block size 4, 4 denoising steps per block (one
  token per step), no stop at EOS (SDAR ``stopping_criteria_idx=None``; dlmrl ``stop_at_eos=False``), float32, CPU,
  ``torch.no_grad`` on both sides (SDAR's function is decorated with it);
- greedy decoding, with these remasking rules (``--rules``):

  - ``sequential``: SDAR ``remasking_strategy="sequential"`` with ``temperature=1, top_k=1, top_p=1`` (its sampler's
    greedy setting: the argmax), unmodified; dlmrl ``remasking="left_to_right"``, ``temperature=0``. This is the
    setting ``sdar_parity.py``'s greedy check uses.
  - ``low_confidence``: SDAR ``"low_confidence_static"``; dlmrl ``"low_confidence"``, one token per step, the most
    probable masked position first.
  - ``dynamic``: SDAR ``"low_confidence_dynamic"`` with ``confidence_threshold=--threshold``; dlmrl threshold
    decoding with ``threshold=--threshold`` (Fast-dLLM's rule: every masked position with confidence >= τ, at least
    the most confident one). With one token per step SDAR's rule is the same (every position > τ if there is one,
    else the top-1); the two differ only at a confidence exactly equal to τ.

  For the two low-confidence rules SDAR's own sampler cannot be run greedily as published: its greedy setting
  (``top_k=1``) makes the confidence it ranks by the probability after top-k filtering, 1.0 at every position, so
  ``torch.topk`` picks among ties (see ``sdar_parity.py``). For these rules the script therefore replaces the
  module-level ``sample_with_temperature_topk_topp`` of SDAR's ``generate.py`` (the function
  ``block_diffusion_generate`` looks up at call time) by :func:`greedy_sampling`: the argmax token and its softmax
  probability at temperature 1, the greedy limit of SDAR's sampler with the confidence dlmrl's sampler ranks by
  (``dlmrl.models.reveal._confidence``, the full softmax). Everything else in ``block_diffusion_generate`` (its
  cache, passes, masks, per-row loops) runs as published. The JSON records ``sdar_sampling`` per rule. This is our
  interpretation, not a setting SDAR ships. The stand-in does less work than SDAR's own greedy path (no
  ``torch.topk`` filter over the vocabulary, no ``torch.multinomial``), so in these two rules SDAR's side is, if
  anything, faster than SDAR as published would be: the ratio there leans in SDAR's favour.

What is not matched: sampled decoding (the two tools draw from different random streams; only greedy decoding is
compared token for token); prompts whose length is not a multiple of the block size (SDAR then fills the prompt's
last block with generated tokens, dlmrl starts the completion on a block); left-padded batches (SDAR's sampler takes
no attention mask). On a random checkpoint the confidences are far below a usual threshold (0.85), so ``dynamic``
then reveals one token per step like ``low_confidence``; the JSON records how many passes each dlmrl call took
(``dlmrl_nfe``). ``--rules dynamic --threshold 1.2e-5`` makes the threshold bite on this checkpoint (every block in
one pass on both sides: 16 passes for 64 tokens), a different workload from the default.

Writes ``benchmarks/results/peers_sdar_rollouts.json`` (``--output``): command, the clone's commit and files, dlmrl
commit, machine, settings, per-repeat seconds, tokens/s and equality, and the summary.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT / "benchmarks", ROOT / "benchmarks" / "peers", ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
from bench_io import write_result

#: 8-character prompts (8 tokens of the tiny checkpoint's character tokenizer); the first 4 are sdar_parity's
EXTRA_PROMPTS = ["9-3=6*2=", "7+6=13-4", "2*9=18+3", "6-1=5*4="]
BLOCK_SIZE = 4
#: rule -> (SDAR remasking_strategy, dlmrl remasking, whether SDAR's sampling helper is replaced)
RULES = {"sequential": ("sequential", "left_to_right", False),
         "low_confidence": ("low_confidence_static", "low_confidence", True),
         "dynamic": ("low_confidence_dynamic", "low_confidence", True)}
MISSING = ("{clone} holds no {what}: give a local clone of JetAstra/SDAR (git clone https://github.com/JetAstra/SDAR; "
           "generate.py defines block_diffusion_generate, training/model/SDAR-4B-Chat/ holds configuration_sdar.py "
           "and modeling_sdar.py)")


def greedy_sampling(logits, temperature=1.0, top_k=0, top_p=1.0):
    """Stand-in for SDAR ``generate.py``'s ``sample_with_temperature_topk_topp`` in greedy runs: ``(token, prob)``,
    both ``logits.shape[:-1]``: the argmax token (long) and its probability under the softmax of ``logits`` at
    temperature 1 (``logits.dtype``). The sampling arguments are accepted and ignored (the script passes SDAR's
    greedy setting, ``temperature=1, top_k=1, top_p=1``). Our interpretation (see the module docstring)."""
    import torch

    probs = torch.softmax(logits, dim=-1)
    token = logits.argmax(dim=-1)
    return token, probs.gather(-1, token[..., None]).squeeze(-1)


def find_sdar(clone: Path):
    """``(generate.py path, CodeSource)`` in ``clone``.

    Raises:
        SystemExit: ``clone`` is not a folder, or holds no ``generate.py`` defining ``block_diffusion_generate``, or
            no ``configuration_sdar.py`` + ``modeling_sdar.py`` in one folder (the message names what is missing).
    """
    from remote_code_checkpoints import find_code, find_function

    if not clone.is_dir():
        raise SystemExit(f"benchmarks/peers/sdar_rollouts.py: {clone} is not a folder (a local clone of JetAstra/SDAR)")
    found = find_function([clone], "generate.py", "block_diffusion_generate", "denoising_steps")
    if found is None:
        raise SystemExit("benchmarks/peers/sdar_rollouts.py: " + MISSING.format(
            clone=clone, what="generate.py defining block_diffusion_generate(..., denoising_steps, ...)"))
    source = find_code([clone], ("sdar",)).get("sdar")
    if source is None:
        raise SystemExit("benchmarks/peers/sdar_rollouts.py: " + MISSING.format(
            clone=clone, what="configuration_sdar.py + modeling_sdar.py (in one folder)"))
    return found[0], source


def prompts(batch: int) -> list[str]:
    from sdar_parity import PROMPT_TEXTS

    pool = list(PROMPT_TEXTS) + EXTRA_PROMPTS
    return [pool[i % len(pool)] for i in range(batch)]


def run_dlmrl(policy, ids, pm, args, rule: str, cache: bool):
    """``(seconds, (B, gen_length) tokens, nfe)`` of one dlmrl call."""
    import torch

    blocks = args.gen_length // BLOCK_SIZE
    kw = {"threshold": args.threshold} if rule == "dynamic" else {}
    t0 = time.perf_counter()
    with torch.no_grad():
        out = policy.sample_blocks(ids, pm, gen_length=args.gen_length, steps=BLOCK_SIZE * blocks, temperature=0.0,
                                   remasking=RULES[rule][1], cache=cache, **kw)
    return time.perf_counter() - t0, out.canvas, int(out.nfe)


def run_sdar(generate_fn, model, ids, mask_id: int, args, rule: str):
    """``(seconds, (B, gen_length) tokens)`` of SDAR's ``block_diffusion_generate`` on the batch: one call per prompt
    (its canvas ``x`` is ``(1, T)``: it decodes one prompt per call, as its ``generate.py`` runs it)."""
    import torch

    strategy, _, replace = RULES[rule]
    globals_ = inspect.unwrap(generate_fn).__globals__  # (generate.py's module: the function is torch.no_grad-wrapped)
    original = globals_["sample_with_temperature_topk_topp"]
    if replace:
        globals_["sample_with_temperature_topk_topp"] = greedy_sampling
    try:
        t0 = time.perf_counter()
        rows = [generate_fn(model, {"input_ids": ids[r : r + 1]}, mask_id, gen_length=args.gen_length,
                            block_length=BLOCK_SIZE, denoising_steps=BLOCK_SIZE, temperature=1.0, top_k=1, top_p=1.0,
                            remasking_strategy=strategy, confidence_threshold=args.threshold,
                            stopping_criteria_idx=None)
                for r in range(ids.shape[0])]
        seconds = time.perf_counter() - t0
    finally:
        globals_["sample_with_temperature_topk_topp"] = original
    p = ids.shape[1]
    return seconds, torch.cat(rows)[:, p : p + args.gen_length]


def compare(ours, theirs) -> dict:
    """Token identity of two ``(B, L)`` long tensors: equal, rows equal, first differing position per row."""
    import torch

    rows = [bool(torch.equal(a, b)) for a, b in zip(ours, theirs)]
    first = [None if same else int((a != b).nonzero()[0, 0]) for same, a, b in zip(rows, ours, theirs)]
    return {"equal": all(rows) and ours.shape == theirs.shape, "rows_equal": sum(rows), "rows": len(rows),
            "first_difference": first}


def summarize(repeats: list[dict], tokens: int) -> dict:
    """Median tokens/s per column over the repeats, and min / median / max of the per-repeat ratio of dlmrl's tokens/s
    to SDAR's (= SDAR's seconds / dlmrl's), also for the uncached column when timed."""
    out = {"tokens_per_call": tokens, "median_tokens_per_second": {}, "ratio_dlmrl_over_sdar": {}}
    for col in ("dlmrl", "sdar", "dlmrl_uncached"):
        secs = [r["seconds"][col] for r in repeats if col in r["seconds"]]
        out["median_tokens_per_second"][col] = tokens / statistics.median(secs) if secs else None
    for col in ("dlmrl", "dlmrl_uncached"):
        ratios = [r["seconds"]["sdar"] / r["seconds"][col] for r in repeats if col in r["seconds"]]
        out["ratio_dlmrl_over_sdar"][col] = ({"min": min(ratios), "median": statistics.median(ratios),
                                              "max": max(ratios)} if ratios else None)
    out["tokens_equal"] = all(r["equal"]["dlmrl_vs_sdar"]["equal"] for r in repeats)
    if any("dlmrl_uncached_vs_cached" in r["equal"] for r in repeats):
        out["uncached_equal"] = all(r["equal"]["dlmrl_uncached_vs_cached"]["equal"] for r in repeats
                                    if "dlmrl_uncached_vs_cached" in r["equal"])
    return out


def format_summary(rule: str, s: dict) -> str:
    tps, ratio = s["median_tokens_per_second"], s["ratio_dlmrl_over_sdar"]
    num = lambda v: "-" if v is None else f"{v:.1f}"
    lines = [f"{rule}: median tokens/s dlmrl {num(tps['dlmrl'])}, SDAR {num(tps['sdar'])}"
             + (f", dlmrl uncached {num(tps['dlmrl_uncached'])}" if tps["dlmrl_uncached"] is not None else "")]
    for col, label in (("dlmrl", "dlmrl/SDAR"), ("dlmrl_uncached", "dlmrl uncached/SDAR")):
        r = ratio[col]
        if r:
            lines.append(f"  {label} tokens/s over repeats: min {r['min']:.2f}x, median {r['median']:.2f}x, "
                         f"max {r['max']:.2f}x")
    lines.append(f"  tokens equal to SDAR's: {'yes' if s['tokens_equal'] else 'NO'}"
                 + ("" if "uncached_equal" not in s else
                    f"; uncached equal to cached: {'yes' if s['uncached_equal'] else 'NO'}"))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("clone", type=Path, help="local clone of JetAstra/SDAR (generate.py and modeling_sdar.py)")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per side and rule, alternating (default 3)")
    p.add_argument("--rules", default="sequential,low_confidence,dynamic",
                   help=f"comma-separated remasking rules among {', '.join(RULES)} (default all)")
    p.add_argument("--batch", type=int, default=8, help="prompts per call (default 8)")
    p.add_argument("--gen-length", type=int, default=64, help="tokens per completion, a multiple of 4 (default 64)")
    p.add_argument("--threshold", type=float, default=0.85,
                   help="the dynamic rule's confidence threshold (default 0.85, SDAR generate.py's default)")
    p.add_argument("--no-uncached", action="store_true", help="skip the dlmrl column with sampling.cache off")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    p.add_argument("--work", type=Path, default=None, help="folder for the checkpoint (default: a temporary one)")
    p.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "peers_sdar_rollouts.json"))
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.batch < 1:
        p.error("--batch must be >= 1")
    if args.gen_length < BLOCK_SIZE or args.gen_length % BLOCK_SIZE:
        p.error(f"--gen-length must be a positive multiple of the block size {BLOCK_SIZE}, got {args.gen_length}")
    if not 0 < args.threshold <= 1:
        p.error(f"--threshold must be in (0, 1], got {args.threshold}")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    args.rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    unknown = [r for r in args.rules if r not in RULES]
    if unknown or not args.rules:
        p.error(f"--rules: unknown {unknown or args.rules}; choose among {', '.join(RULES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clone = args.clone.resolve()
    generate_path, source = find_sdar(clone)
    work = (args.work or Path(tempfile.mkdtemp(prefix="peers_sdar_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_MODULES_CACHE", str(work / "hf_modules"))  # (before transformers is imported)
    import torch
    import transformers
    from peer_common import dlmrl_commit, machine
    from remote_code_check import load_function
    from remote_code_checkpoints import build_checkpoint
    from sdar_parity import ReferenceModel, load, prompt_batch

    if args.threads:
        torch.set_num_threads(args.threads)
    generate_fn = load_function(generate_path, "block_diffusion_generate")
    try:
        ckpt = build_checkpoint(source, work / f"sdar_{clone.name}")
    except ModuleNotFoundError as e:
        raise SystemExit(f"benchmarks/peers/sdar_rollouts.py: the clone's model code imports {e.name!r}, which this "
                         f"Python lacks: pip install {e.name} (or put it on PYTHONPATH); JetAstra's copy imports "
                         "triton for its fused SFT loss") from e
    policy = load(ckpt)
    policy.model.eval()
    if policy.block_size != BLOCK_SIZE:
        raise SystemExit(f"the checkpoint's block size is {policy.block_size}, this script runs {BLOCK_SIZE}")
    model = ReferenceModel(policy.model).eval()
    ids, pm = prompt_batch(policy, prompts(args.batch))
    if ids.shape[1] % BLOCK_SIZE or not bool(pm.all()):
        raise SystemExit(f"the prompts tokenize to {ids.shape[1]} tokens with padding {not bool(pm.all())}: "
                         f"they must be unpadded and a multiple of {BLOCK_SIZE}")
    tokens = args.batch * args.gen_length
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    started, results, failed = time.time(), {}, False
    for rule in args.rules:
        run_dlmrl(policy, ids, pm, args, rule, cache=True)  # (warm-up, untimed)
        run_sdar(generate_fn, model, ids, policy.mask_token_id, args, rule)
        if not args.no_uncached:
            run_dlmrl(policy, ids, pm, args, rule, cache=False)
        repeats = []
        for r in range(args.repeats):
            s_d, ours, nfe = run_dlmrl(policy, ids, pm, args, rule, cache=True)
            s_s, theirs = run_sdar(generate_fn, model, ids, policy.mask_token_id, args, rule)
            rec = {"repeat": r, "seconds": {"dlmrl": s_d, "sdar": s_s}, "dlmrl_nfe": nfe,
                   "equal": {"dlmrl_vs_sdar": compare(ours, theirs)}}
            if not args.no_uncached:
                s_u, plain, nfe_u = run_dlmrl(policy, ids, pm, args, rule, cache=False)
                rec["seconds"]["dlmrl_uncached"], rec["dlmrl_uncached_nfe"] = s_u, nfe_u
                rec["equal"]["dlmrl_uncached_vs_cached"] = compare(plain, ours)
            rec["tokens_per_second"] = {k: tokens / v for k, v in rec["seconds"].items()}
            print(f"{rule} repeat {r}: " + ", ".join(f"{k} {v:.3f} s" for k, v in rec["seconds"].items())
                  + f"; tokens equal to SDAR's: {rec['equal']['dlmrl_vs_sdar']['equal']}", flush=True)
            repeats.append(rec)
        summary = summarize(repeats, tokens)
        failed |= not summary["tokens_equal"] or summary.get("uncached_equal") is False
        print(format_summary(rule, summary), flush=True)
        strategy, dlmrl_rule, replace = RULES[rule]
        results[rule] = {
            "sdar": {"remasking_strategy": strategy, "temperature": 1.0, "top_k": 1, "top_p": 1.0,
                     "confidence_threshold": args.threshold if rule == "dynamic" else None,
                     "sdar_sampling": ("replaced by greedy_sampling (argmax, softmax probability at T 1)" if replace
                                       else "as published (top_k=1: the argmax)")},
            "dlmrl": {"remasking": dlmrl_rule, "temperature": 0.0, "cache": "exact",
                      "threshold": args.threshold if rule == "dynamic" else None},
            "summary": summary, "repeats": repeats}
    result = {
        "benchmark": "peers_sdar_rollouts",
        "command": " ".join(["python", "benchmarks/peers/sdar_rollouts.py",
                             *(sys.argv[1:] if argv is None else argv)]),
        "sdar": {"clone": clone.name, "commit": source.commit, "generate": str(generate_path.relative_to(clone)),
                 "code": str(source.folder.relative_to(clone))},
        "dlmrl_commit": dlmrl_commit(), "torch": torch.__version__, "transformers": transformers.__version__,
        "machine": {**machine(args.threads), "load_average_1min_before": load_before},
        "settings": {"batch": args.batch, "prompt_tokens": ids.shape[1], "gen_length": args.gen_length,
                     "block_size": BLOCK_SIZE, "steps_per_block": BLOCK_SIZE, "tokens_per_step": 1,
                     "repeats": args.repeats, "greedy": True, "dtype": str(next(policy.model.parameters()).dtype),
                     "device": "cpu", "stop_at_eos": False,
                     "checkpoint": "tiny random SDAR (2 layers, width 64, vocabulary 151,936; "
                                   "remote_code_checkpoints.build_checkpoint)"},
        "seconds": round(time.time() - started, 1), "rules": results,
    }
    write_result(args.output, result)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
