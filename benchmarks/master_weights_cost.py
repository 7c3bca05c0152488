"""What float32 master weights with bfloat16 autocast (``model.fp32_master_weights``,
:mod:`dlmrl.training.precision`) cost against training the bfloat16 weights themselves and against float32: one
training-mode forward + backward + AdamW step of a random bidirectional Llama (hidden 512, 8 layers, MLP 1536,
vocabulary 4,000; 29M parameters) on 8 rows of 128 tokens, on the CPU, the best of 5 after one warm-up; and the
bytes of weights, gradients and AdamW state per parameter.

    python benchmarks/master_weights_cost.py --output benchmarks/results/master_weights_cost.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def build(dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=256, is_causal=False)
    return LlamaForCausalLM(config).to(dtype).train()


def step_seconds(model, repeats: int) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.randint(0, 4000, (8, 128), generator=torch.Generator().manual_seed(1))
    times = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        logits = model(input_ids=ids).logits
        torch.log_softmax(logits.float(), -1).mean().backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t)
    return min(times[1:])


def main() -> None:
    from dlmrl.training.precision import keep_float32_master_weights

    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    rows = {
        # weights + gradients + AdamW's two moments, bytes per parameter
        "float32": (step_seconds(build(torch.float32), args.repeats), 4 + 4 + 8),
        "bfloat16 weights": (step_seconds(build(torch.bfloat16), args.repeats), 2 + 2 + 4),
        "float32 master + bfloat16 autocast": (
            step_seconds(keep_float32_master_weights(build(torch.bfloat16)), args.repeats), 4 + 4 + 8),
    }
    out = {name: {"seconds_per_step": round(s, 3), "bytes_per_parameter": b} for name, (s, b) in rows.items()}
    out["threads"] = torch.get_num_threads()
    out["torch"] = torch.__version__
    print(json.dumps(out, indent=2))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
