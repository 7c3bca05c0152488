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

Any option of ``sampler_speed.py`` applies.
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


def load_sampler_speed():
    path = Path(__file__).resolve().with_name("sampler_speed.py")
    spec = importlib.util.spec_from_file_location("sampler_speed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> dict:
    return load_sampler_speed().main(argv, name="gpu_rollout", defaults=DEFAULTS, description=__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
