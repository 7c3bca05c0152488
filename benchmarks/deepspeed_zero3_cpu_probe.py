"""Does DeepSpeed ZeRO-3 shard on CPU processes when accelerate's gate is out of the way? (Issue 33's question;
accelerate selects DeepSpeed only off-CPU, see README "Multi-process and multi-GPU".)

Needs ``deepspeed`` (not a dlmrl dependency; the probe used 0.19.8 in a separate virtual environment,
``DS_BUILD_OPS=0``, with hjson, py-cpuinfo, msgpack and ninja), run with its CPU accelerator under torchrun:

    DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 benchmarks/deepspeed_zero3_cpu_probe.py

Each process takes its half of a 4-row batch of the shipped tiny diffusion model, ``deepspeed.initialize`` with
ZeRO stage 3 and ``torch.optim.AdamW`` (lr 1e-3, clipping 1.0) runs one backward and step, and the gathered
parameters are compared with one process's step on the whole batch. Result on this machine (torch 2.13, gloo):
107,392 of 214,784 parameters held per process, max |difference| 1.3e-5 after the step in float32 (AdamW's lr/ε
amplification of a reordered float32 sum; dlmrl's FSDP2 test compares in float64).
"""

from __future__ import annotations

import deepspeed
import torch
import torch.distributed as dist

from dlmrl.models.loading import load_policy


def main() -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 3},
              "gradient_clipping": 1.0, "zero_allow_untested_optimizer": True}
    policy = load_policy("tiny-sudoku", dtype="float32")
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=policy.model, optimizer=optimizer, config=config)
    ids = torch.randint(3, 19, (4, 8), generator=torch.Generator().manual_seed(0))
    mine = ids[rank * 2:(rank + 1) * 2]
    loss = engine(input_ids=mine, attention_mask=torch.ones_like(mine)).logits.logsumexp(-1).mean()
    engine.backward(loss)
    engine.step()
    held = sum(p.ds_tensor.numel() for p in engine.module.parameters())
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        full = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    print(f"process {rank}: holds {held} of {sum(v.numel() for v in full.values())} parameters")
    if rank == 0:
        ref = load_policy("tiny-sudoku", dtype="float32")
        opt = torch.optim.AdamW(ref.model.parameters(), lr=1e-3)
        ref.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.logsumexp(-1).mean().backward()
        torch.nn.utils.clip_grad_norm_(ref.model.parameters(), 1.0)
        opt.step()
        params = dict(ref.model.named_parameters())
        print("max |ZeRO-3 on 2 processes - 1 process| =", max((full[n] - params[n]).abs().max().item() for n in full))
    dist.barrier()


if __name__ == "__main__":
    main()
