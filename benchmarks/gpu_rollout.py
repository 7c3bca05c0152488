"""The rollout speed check for a GPU: ``sampler_speed.py``'s modes on an LLaDA-8B-shaped model.

A bidirectional Llama with random bf16 weights in LLaDA-8B-Instruct's shape (hidden 4096, 32 layers, 32 heads,
MLP 12288, vocabulary 126464: its ``config.json``) decodes 256 tokens (block 32, 128 steps, the logits sharpened as
``sampler_speed.py`` does) after random 64-token prompts, batch 16, in each mode (plain, threshold, prefix, dual, threshold+dual), one round, on
``cuda``: tokens/s and the speedup over plain, side by side. About 16 GiB of weights; on one H100/H200 the five
modes take a few minutes (plain: 128 passes over 320 tokens x 16 rows). The caches' gains are those of the 8B
shape; the threshold's depend on the confidence the sharpened random weights give (``sampler_speed.py``).

    python benchmarks/gpu_rollout.py                         # on a GPU machine (writes benchmarks/results/gpu_rollout.json)
    python benchmarks/gpu_rollout.py --device cpu --dtype float32 --hidden 64 --layers 2 --heads 2 \\
        --intermediate 128 --vocab 256 --batch 2 --gen-length 64 --output /tmp/toy.json  # the tests' toy run

Any option of ``sampler_speed.py`` applies. Then the block-diffusion kind on the same shape (``block_speed.py``'s
rollouts, ``--block-size`` 32, 16 steps per block): the exact key/value cache against the uncached block-causal
reference, written to ``<output stem>_block.json``; ``--skip-block`` leaves it out, ``--block-dtype`` runs it in
another dtype (the tests' toy run: float64, so its exact token comparison cannot flip on a float32 tie).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

#: LLaDA-8B-Instruct's shape (GSAI-ML/LLaDA-8B-Instruct config.json: d_model 4096, n_layers 32, n_heads 32,
#: mlp_hidden_size 12288, vocab_size 126464) and the check's rollout settings
DEFAULTS = {"hidden": 4096, "layers": 32, "heads": 32, "intermediate": 12288, "vocab": 126464, "batch": [16],
            "gen_length": 256, "block_length": 32, "prompt_length": 64, "repeats": 1, "device": "cuda",
            "dtype": "bfloat16", "no_sudoku": True}


def load_benchmark(name: str):
    """The module of ``benchmarks/<name>.py`` (the benchmarks are scripts, not a package)."""
    path = Path(__file__).resolve().with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def block_args(argv: list[str]) -> list[str]:
    """``block_speed.py``'s arguments for the shape and device ``argv`` gives the sampler check (its defaults
    otherwise), rollouts only."""
    import argparse

    p = argparse.ArgumentParser(add_help=False)
    for key in ("hidden", "layers", "heads", "intermediate", "vocab", "gen_length", "prompt_length"):
        p.add_argument("--" + key.replace("_", "-"), type=int, default=DEFAULTS[key])
    p.add_argument("--device", default=DEFAULTS["device"])
    p.add_argument("--dtype", default=DEFAULTS["dtype"])
    p.add_argument("--batch", type=int, nargs="+", default=DEFAULTS["batch"])
    p.add_argument("--block-length", type=int, default=DEFAULTS["block_length"])
    p.add_argument("--output", default="benchmarks/results/gpu_rollout.json")
    a, _ = p.parse_known_args(argv)
    out = Path(a.output)
    return ["--hidden", str(a.hidden), "--layers", str(a.layers), "--heads", str(a.heads), "--intermediate",
            str(a.intermediate), "--vocab", str(a.vocab), "--gen-length", str(a.gen_length), "--prompt-length",
            str(a.prompt_length), "--device", a.device, "--dtype", a.dtype, "--batch", str(a.batch[0]),
            "--block-size", str(min(a.block_length, a.gen_length)),
            "--steps-per-block", str(max(min(a.block_length, a.gen_length) // 2, 1)), "--repeats", "1",
            "--no-scoring", "--output", str(out.with_name(out.stem + "_block.json"))]


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    skip_block = "--skip-block" in argv
    argv = [a for a in argv if a != "--skip-block"]
    block_dtype = None
    if "--block-dtype" in argv:
        i = argv.index("--block-dtype")
        block_dtype, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    result = load_benchmark("sampler_speed").main(argv, name="gpu_rollout", defaults=DEFAULTS, description=__doc__)
    if not skip_block:
        args = block_args(argv)
        if block_dtype is not None:
            args[args.index("--dtype") + 1] = block_dtype
        result["block"] = load_benchmark("block_speed").main(args)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
