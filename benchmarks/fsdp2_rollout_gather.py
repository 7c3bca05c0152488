"""How a sharded (FSDP2) policy's parameters are gathered for a rollout: once for the whole rollout
(:func:`dlmrl.training.sharding.gathered`, what the trainer does) or per layer in every denoising pass (FSDP2's
default). Per process: the rollout's wall time and the most parameter bytes it holds gathered at once
(:class:`PeakGathered`; the sharded parameters stay allocated besides).

Per-layer gathering can only be measured with the same number of passes on every process (fixed steps, no
threshold, no early stop): the trainer's rollouts do not have that (threshold decoding, AR rows that end, early
stops), which per-layer all-gathers would deadlock on; that, not speed, is why it gathers once.

    python -m torch.distributed.run --nproc_per_node 2 benchmarks/fsdp2_rollout_gather.py \
        --output benchmarks/results/fsdp2_rollout_gather.json

A random bidirectional Llama (hidden 512, 8 layers, MLP 1536, vocabulary 4,000: 29M parameters, 117 MB in float32)
samples 8 completions of 64 tokens after 16-token prompts in 16 steps, each mode twice after two warm-up runs,
on gloo processes (CPU).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist


def build_policy(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    from dlmrl.models.loading import diffusion_policy_from_model
    from dlmrl.models.tokenizer import build_text_tokenizer

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=4000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=256, is_causal=False,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    return diffusion_policy_from_model(model, build_text_tokenizer(), family="tiny", mask_token_id=3)


class PeakGathered:
    """The most parameter bytes held unsharded at once during a rollout: at every module's forward, the bytes of the
    model's parameters that are plain tensors at that moment (FSDP2 registers a module's gathered parameters as
    plain tensors and its sharded ones as ``DTensor`` s). Activations are the same in both modes and not counted;
    a process's resident set size cannot show the difference on CPU (the allocator keeps freed blocks)."""

    def __init__(self, model):
        from torch.distributed.tensor import DTensor

        self.model, self.peak, self.handles = model, 0, []

        def look(*_):
            held = {id(p): p.numel() * p.element_size() for p in model.parameters() if not isinstance(p, DTensor)}
            self.peak = max(self.peak, sum(held.values()))

        self.look = look

    def __enter__(self):
        self.handles = [m.register_forward_pre_hook(self.look) for m in self.model.modules()]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()

    @property
    def mb(self) -> float:
        return self.peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from torch.distributed.device_mesh import init_device_mesh

    from dlmrl.models.sampler import generate
    from dlmrl.training.sharding import gathered, local_bytes, shard_module

    policy = build_policy()
    whole_mb = sum(p.numel() * p.element_size() for p in policy.model.parameters()) / 2**20
    shard_module(policy.model, init_device_mesh("cpu", (world,)))
    params, _ = local_bytes(policy.model)
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(10, 4000, (8, 16), generator=g)
    prompt_mask = torch.ones_like(prompts, dtype=torch.bool)

    def rollout():
        with torch.no_grad():
            return generate(policy, prompts, prompt_mask, gen_length=64, steps=16, block_length=64,
                            generator=torch.Generator().manual_seed(2))

    results = {}
    for mode in ("gathered_once", "per_layer", "gathered_once", "per_layer"):  # (each twice: the first warms up)
        times, peaks = [], []
        for _ in range(args.repeats):
            dist.barrier()
            with PeakGathered(policy.model) as peak:
                t = time.perf_counter()
                if mode == "gathered_once":
                    with gathered(policy.model):
                        rollout()
                else:
                    rollout()
                times.append(time.perf_counter() - t)
            peaks.append(peak.mb)
        results[mode] = {"seconds": min(times), "seconds_all": times, "peak_gathered_params_mb": max(peaks)}
    results["process"] = rank
    results["whole_model_mb"] = whole_mb
    results["local_shard_mb"] = params / 2**20
    results["torch"] = torch.__version__
    gathered_all = [None] * world
    dist.all_gather_object(gathered_all, results)
    if rank == 0:
        print(json.dumps(gathered_all, indent=2))
        if args.output:
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
            Path(args.output).write_text(json.dumps(gathered_all, indent=2) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
