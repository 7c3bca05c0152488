"""The memory plan (:mod:`dlmrl.training.memory_plan`) against measured peaks of training steps on this CPU.

Each case builds a Llama of the tiny family (transformers' ``LlamaForCausalLM``, ``is_causal=False``, SDPA) of
about 1M, 10M or 30M parameters and runs two training steps as dlmrl's update does them: score the canvases with
grad (:func:`dlmrl.estimators.scoring.score`; a block case through the block-diffusion policy's composite pass),
a loss on the estimate, ``backward``, ``AdamW.step``, ``zero_grad``. Settings vary: full weights or LoRA (all
linear layers; q/k/v only), gradient checkpointing on or off, float32 or bfloat16 weights, canvas lengths, the
number of canvases per forward. One case is a rollout instead: a block model's sampling call
(``sample_blocks``, exact key/value cache, temperature 1), compared with the plan's key/value cache and sampling
logits. The ``dg_`` cases are a DiffusionGemma (``build_tiny_diffusion_gemma``, vocabulary 8,192): its
entropy-bounded sampler's calls (compared with the key/value cache, the step's tensors and the self-conditioning
input), and steps of the trajectory likelihood with grad (``trajectory_logprobs``, backward, AdamW) planned
through the uniform kind's own ``memory_shapes``.

How memory is measured (one fresh subprocess per case):

- ``measured_step_bytes``: the resident-set high-water mark (``VmHWM``) over the two steps minus the resident set
  just before them. The high-water mark is reset with ``/proc/self/clear_refs`` (Linux) after the model, its
  optimizer and the inputs are built, so the baseline holds the weights and the step adds what a step adds: the
  optimizer state (allocated in the first step), activations, logits, gradients. PyTorch's CPU allocator has no
  cache (freed tensors go back to malloc), and glibc's dynamic mmap threshold is pinned with
  ``MALLOC_MMAP_THRESHOLD_=65536`` so that a freed tensor returns to the OS and the resident set follows the live
  tensors (``tracemalloc`` cannot see torch's allocations). Before the baseline, a warm-up runs the same code
  paths on a small model, so that library pages and kernels touched for the first time do not count as the
  step's memory. One intra-op thread.
- ``saved_activation_bytes``: the distinct storages autograd keeps for the backward during the forward
  (``torch.autograd.graph.saved_tensors_hooks``), weights excluded: the activation term alone, exactly
  (without checkpointing; checkpointing saves through its own hooks).

The plan is built from the same numbers (:class:`~dlmrl.training.memory_plan.Architecture`,
:class:`~dlmrl.training.memory_plan.MemorySettings`; AdamW on the weights' own dtype, as dlmrl's trainer today,
no master copy) and compared as ``planned_step_bytes = peak - parameters`` (the weights are in the baseline).
The relative error is ``(planned - measured) / measured``; the target is within +-25%.

    python benchmarks/memory_plan_check.py            # all cases, ~3-5 minutes on 2 cores
    python benchmarks/memory_plan_check.py --cases s_full_fp32 m_lora_qkv   # some of them

Writes ``benchmarks/results/memory_plan_check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

#: the model sizes: (hidden, layers, heads, kv heads, MLP width, vocabulary, tied embeddings)
SIZES = {
    "s": {"H": 128, "layers": 4, "heads": 4, "kv": 4, "I": 384, "V": 512, "tie": True},  # ~0.9M parameters
    "m": {"H": 256, "layers": 8, "heads": 8, "kv": 4, "I": 768, "V": 8192, "tie": True},  # ~8.6M
    "l": {"H": 512, "layers": 6, "heads": 8, "kv": 8, "I": 1536, "V": 8192, "tie": False},  # ~29M
    # a DiffusionGemma (dlmrl.models.diffusion_gemma.build_tiny_diffusion_gemma: dense MLP of I beside 4 experts)
    "dg": {"H": 128, "layers": 2, "heads": 4, "kv": 1, "I": 256, "V": 8192, "tie": True},  # ~1.6M
}

#: the cases: size, dtype, LoRA (rank, targets) or full, checkpointing, kind, canvases B x samples S, prompt P,
#: canvas L
CASES = {
    "s_full_fp32": {"size": "s", "B": 8, "S": 1, "P": 16, "L": 64},
    "s_full_fp32_L256": {"size": "s", "B": 4, "S": 2, "P": 16, "L": 256},
    "s_full_fp32_ckpt": {"size": "s", "B": 8, "S": 2, "P": 16, "L": 128, "ckpt": True},
    "s_lora_fp32": {"size": "s", "B": 8, "S": 2, "P": 16, "L": 128, "lora": (8, "all-linear")},
    "m_full_fp32": {"size": "m", "B": 4, "S": 2, "P": 32, "L": 128},
    "m_full_fp32_ckpt": {"size": "m", "B": 4, "S": 2, "P": 32, "L": 128, "ckpt": True},
    "m_lora_qkv": {"size": "m", "B": 4, "S": 2, "P": 32, "L": 128, "lora": (16, "q_proj,k_proj,v_proj")},
    "m_full_bf16": {"size": "m", "B": 4, "S": 2, "P": 32, "L": 128, "dtype": "bfloat16"},
    "m_lora_bf16_ckpt": {"size": "m", "B": 4, "S": 2, "P": 32, "L": 256, "dtype": "bfloat16",
                         "lora": (16, "all-linear"), "ckpt": True},
    "m_full_fp32_chunk64": {"size": "m", "B": 4, "S": 2, "P": 32, "L": 128, "chunk": 64},
    "m_block_full_fp32": {"size": "m", "B": 4, "S": 2, "P": 32, "L": 64, "kind": "block", "block": 8},
    "l_full_fp32": {"size": "l", "B": 2, "S": 2, "P": 32, "L": 128},
    "l_full_fp32_ckpt": {"size": "l", "B": 2, "S": 2, "P": 32, "L": 256, "ckpt": True},
    "l_lora_fp32_L512": {"size": "l", "B": 2, "S": 1, "P": 32, "L": 512, "lora": (16, "all-linear")},
    # a block model's sampling call (no grad): the exact key/value cache and one step's full-vocabulary tensors
    "m_block_rollout": {"size": "m", "B": 32, "S": 1, "P": 32, "L": 128, "kind": "rollout", "block": 8},
    # DiffusionGemma's entropy-bounded sampler (dlmrl.models.uniform_sampler, no grad): one canvas of L, 4 steps, the
    # self-conditioning input and each step's full-vocabulary tensors over the canvas
    "dg_uniform_rollout": {"size": "dg", "B": 32, "S": 1, "P": 32, "L": 64, "kind": "uniform_rollout"},
    "dg_uniform_rollout_bf16": {"size": "dg", "B": 32, "S": 1, "P": 32, "L": 64, "kind": "uniform_rollout",
                                "dtype": "bfloat16"},
    "dg_uniform_rollout_L128": {"size": "dg", "B": 16, "S": 1, "P": 32, "L": 128, "kind": "uniform_rollout"},
    # DiffusionGemma's trajectory likelihood with grad (dlmrl.training.uniform_trajectory.trajectory_logprobs): a
    # rollout of B rows, one canvas of L in S denoising steps (no early stopping), scored in one batched pass of
    # B x S step canvases, backward, AdamW; the plan from the uniform kind's own memory_shapes
    "dg_uniform_train": {"size": "dg", "B": 16, "S": 4, "P": 32, "L": 32, "kind": "uniform_train"},
    "dg_uniform_train_bf16": {"size": "dg", "B": 16, "S": 4, "P": 32, "L": 32, "kind": "uniform_train",
                              "dtype": "bfloat16"},
    # the 26B recipe's setup: bfloat16, LoRA on the kind's all-linear targets (attention and dense MLP, shared by
    # encoder and decoder), gradient checkpointing
    "dg_uniform_train_lora_bf16_ckpt": {"size": "dg", "B": 16, "S": 4, "P": 32, "L": 32, "kind": "uniform_train",
                                        "dtype": "bfloat16", "lora": (16, "all-linear"), "ckpt": True},
}

MMAP_THRESHOLD = "65536"

#: parts of the plan these cases do not exercise (their formulas are the plan's reading of the code, unmeasured)
NOT_MEASURED = [
    "LLaDA2's mixture-of-experts layers: routed copies and expert activations (DiffusionGemma's are measured)",
    ("fp32 master weights under torch.autocast (the residual stream and norms stay float32: the plan counts the "
    "activations in bfloat16)"),
    "DDP buckets, ZeRO / FSDP sharding, FSDP's gathered layer, AdamW's multi-tensor (GPU) step temporary",
    ("the attention mask of SDAR's and LLaDA2's own model code (measured here for transformers' Llama: one T x T "
    "copy per layer in the compute dtype)"),
    "the AR scorer's logits and transformers' generate (its key/value cache)",
    "the diffusion sampler without a cache and with Fast-dLLM's prefix/dual cache",
]


# ------------------------------------------------------------------------------------------ the plan


def plan_for(case: dict):
    """The :class:`~dlmrl.training.memory_plan.MemoryPlan` of ``case``, its architecture and settings."""
    from dlmrl.training.memory_plan import Architecture, MemorySettings, plan_memory

    z = SIZES[case["size"]]
    arch = Architecture(hidden_size=z["H"], num_layers=z["layers"], num_heads=z["heads"], num_kv_heads=z["kv"],
                        head_dim=z["H"] // z["heads"], intermediate_size=z["I"], vocab_size=z["V"],
                        tie_embeddings=z["tie"], source="benchmark")
    lora = case.get("lora")
    block = case.get("kind") == "block"
    if case.get("kind") == "uniform_rollout":
        from dlmrl.training.memory_plan import architecture_from_config

        arch = architecture_from_config(_diffusion_gemma(case, z, build=False).to_dict(), "benchmark")
        settings = MemorySettings(weight_dtype=case.get("dtype", "float32"), rollout_rows=case["B"],
                                  rollout_tokens=case["P"] + case["L"], rollout_forward_positions=case["L"],
                                  rollout_scored_positions=case["L"], rollout_soft_inputs=True,
                                  rollout_sampler="entropy_bound")
        return plan_memory(arch, settings), arch, settings
    if case.get("kind") == "uniform_train":
        return _uniform_train_plan(case, z)
    if case.get("kind") == "rollout":
        settings = MemorySettings(weight_dtype=case.get("dtype", "float32"), rollout_rows=case["B"],
                                  rollout_tokens=case["P"] + case["L"], rollout_forward_positions=case["block"],
                                  rollout_scored_positions=case["block"])
        return plan_memory(arch, settings), arch, settings
    settings = MemorySettings(
        weight_dtype=case.get("dtype", "float32"), lora_r=lora[0] if lora else None,
        lora_targets=lora[1] if lora else "all-linear", master_weights=False,
        canvases_per_forward=case["B"] * case["S"], positions=case["P"] + (2 if block else 1) * case["L"],
        scored_positions=case["L"], float_copy_all=True, gradient_checkpointing=bool(case.get("ckpt")),
        dense_mask=block, foreach_optimizer=False, logprob_chunk=case.get("chunk"))
    return plan_memory(arch, settings), arch, settings


def _uniform_train_plan(case: dict, z: dict):
    """The plan of a ``uniform_train`` case through the uniform kind's ``memory_shapes`` (what ``--dry-run``
    plans): a config with the case's canvas, steps and rows (``prompts_per_step = B``, ``G = 1``, one canvas:
    ``gen_length = L - 1``), no KL reference, AdamW's one-weight-at-a-time step, the case's prompt length."""
    from dlmrl.config import Config
    from dlmrl.kinds import kind_of
    from dlmrl.training.memory_plan import MemorySettings, architecture_from_config, plan_memory

    arch = architecture_from_config(_diffusion_gemma(case, z, build=False).to_dict(), "benchmark")
    cfg = Config()
    cfg.model.kind, cfg.model.name_or_path = "uniform", "benchmark-diffusion-gemma"
    cfg.model.architecture = {"canvas_length": case["L"]}
    cfg.sampling.steps, cfg.sampling.gen_length = case["S"], case["L"] - 1
    shapes = kind_of("uniform").memory_shapes(cfg, case["P"], case["B"], 1)
    lora = case.get("lora")
    settings = MemorySettings(
        weight_dtype=case.get("dtype", "float32"), lora_r=lora[0] if lora else None,
        lora_targets=lora[1] if lora else "all-linear", gradient_checkpointing=bool(case.get("ckpt")),
        master_weights=False, canvases_per_forward=shapes["canvases"],
        positions=shapes["positions"], head_positions=shapes["head_positions"],
        scored_positions=shapes["scored_positions"], float_copy_all=shapes["float_copy_all"],
        soft_inputs=shapes["soft_inputs"], foreach_optimizer=False,
        uncheckpointed_positions=shapes["uncheckpointed_positions"], kv_copy_positions=shapes["kv_copy_positions"])
    return plan_memory(arch, settings), arch, settings


# ------------------------------------------------------------------------------------------ measuring (worker)


def _status() -> tuple[int, int]:
    """``(VmHWM, VmRSS)`` of this process in bytes."""
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            values[key] = int(rest.split()[0]) * 1024
    return values["VmHWM"], values["VmRSS"]


def _diffusion_gemma(case: dict, z: dict, build: bool = True):
    """The case's DiffusionGemma (``build=False``: only its config), one canvas of ``L`` in 4 steps, no early
    stopping."""
    import torch

    from dlmrl.models.diffusion_gemma import build_tiny_diffusion_gemma, tiny_generation_config

    generation = tiny_generation_config(max_new_tokens=case["L"], max_denoising_steps=4, stability_threshold=None,
                                        confidence_threshold=None)
    model = build_tiny_diffusion_gemma(
        vocab_size=z["V"], canvas_length=case["L"], hidden_size=z["H"], num_layers=z["layers"],
        num_heads=z["heads"], head_dim=z["H"] // z["heads"], intermediate_size=z["I"],
        moe_intermediate_size=z["I"] // 4, generation_config=generation,
        dtype=getattr(torch, case.get("dtype", "float32")))
    return model if build else model.config


def _build(case: dict, z: dict):
    """The model (LoRA and checkpointing applied), its policy, the inputs and the step function."""
    import torch

    if case.get("kind") == "uniform_train":  # (the rollout is drawn here, outside the measured steps)
        from dlmrl.models.diffusion_gemma import lora_target_pattern, share_encoder_adapters
        from dlmrl.models.lora import apply_lora, enable_gradient_checkpointing, parse_target_modules
        from dlmrl.models.uniform_sampler import sample_diffusion_gemma
        from dlmrl.training.uniform_trajectory import completion_of, record_of, trajectory_logprobs

        model = _diffusion_gemma(case, z)
        model.generation_config.max_denoising_steps = case["S"]
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(3, z["V"] - 3, (case["B"], case["P"]), generator=g)
        prompt_mask = torch.ones_like(prompt, dtype=torch.bool)
        with torch.no_grad():
            out = sample_diffusion_gemma(model.eval(), prompt, prompt_mask, generator=torch.Generator().manual_seed(1),
                                         draw_last_step=True)
        record, _ = record_of(out, 1)
        completion, completion_mask = completion_of(out, 1, eos_id=None, pad_id=0)
        if case.get("lora"):  # (as the uniform kind applies it: UniformNoiseKind.lora_targets)
            r, targets = case["lora"]
            model = apply_lora(model, r, 2 * r, 0.0, targets, targets=lora_target_pattern(parse_target_modules(targets)))
            share_encoder_adapters(model)
        if case.get("ckpt"):
            enable_gradient_checkpointing(model)
        model.train()
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=False)

        def forward():
            return trajectory_logprobs(model, prompt, prompt_mask, completion, completion_mask, record, grad=True)[0]

        def step():
            loss = -forward().sum() / case["B"]
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return model, forward, step
    if case.get("kind") == "uniform_rollout":  # (a sampling call: no grad, eval mode)
        from dlmrl.models.uniform_sampler import sample_diffusion_gemma

        model = _diffusion_gemma(case, z).eval()
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(3, z["V"] - 3, (case["B"], case["P"]), generator=g)

        def sample():
            with torch.no_grad():
                sample_diffusion_gemma(model, prompt, torch.ones_like(prompt),
                                       generator=torch.Generator().manual_seed(1))

        return model, None, sample
    from transformers import LlamaConfig, LlamaForCausalLM

    from dlmrl.estimators.mask_plan import MaskPlan
    from dlmrl.estimators.scoring import score
    from dlmrl.models.block_policy import BlockDiffusionPolicy
    from dlmrl.models.families import _tiny_logits
    from dlmrl.models.lora import apply_lora, enable_gradient_checkpointing
    from dlmrl.models.policy import MaskedDiffusionPolicy

    config = LlamaConfig(vocab_size=z["V"], hidden_size=z["H"], intermediate_size=z["I"],
                         num_hidden_layers=z["layers"], num_attention_heads=z["heads"],
                         num_key_value_heads=z["kv"], head_dim=z["H"] // z["heads"], max_position_embeddings=4096,
                         tie_word_embeddings=z["tie"], is_causal=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(getattr(torch, case.get("dtype", "float32")))
    if case.get("lora"):
        model = apply_lora(model, case["lora"][0], 16, 0.0, case["lora"][1])
    if case.get("ckpt"):
        enable_gradient_checkpointing(model)
    model.train()
    common = {"model": model, "tokenizer": None, "mask_token_id": 1, "family": "tiny", "logits_fn": _tiny_logits}
    policy = (BlockDiffusionPolicy(**common, block_size=case.get("block", 4)) if case.get("kind") in ("block",
                                                                                                      "rollout")
              else MaskedDiffusionPolicy(**common))
    if case.get("kind") == "rollout":  # (sampling: no grad, eval mode, the exact key/value cache)
        model.eval()
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(2, z["V"], (case["B"], case["P"]), generator=g)

        def sample():
            with torch.no_grad():
                policy.sample_blocks(prompt, torch.ones_like(prompt, dtype=torch.bool), gen_length=case["L"],
                                     steps=case["L"], temperature=1.0, generator=torch.Generator().manual_seed(1))

        return model, None, sample
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=False)
    b, s, p, length = case["B"], case["S"], case["P"], case["L"]
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(2, z["V"], (b, p), generator=g)
    prompt_mask = torch.ones(b, p, dtype=torch.bool)
    completion = torch.randint(2, z["V"], (b, length), generator=g)
    completion_mask = torch.ones(b, length, dtype=torch.bool)
    masks = torch.rand(s, b, length, generator=g) < 0.5
    masks[..., 0] = True  # (every canvas scores a position: all S x B canvases run)
    plan = MaskPlan(masks=masks, weights=torch.full((s, b), 1.0 / s), t=torch.full((s,), 0.5, dtype=torch.float64))

    def forward():
        return score(policy, prompt, prompt_mask, completion, completion_mask, plan, logits_chunk=case.get("chunk"))

    def step():
        est = forward()
        loss = -(est.sequence / length).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, forward, step


def _saved_bytes(model, forward) -> int:
    """Bytes of the distinct storages autograd keeps during one forward with grad (weights excluded)."""
    import torch

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        est = forward()
    del est
    return sum(seen.values())


def measure(case: dict) -> dict:
    """Run in a fresh process: warm up, build, reset the high-water mark, two steps; see the module docstring."""
    import torch

    torch.set_num_threads(1)
    warm = dict(case, B=2, S=1, P=4, L=16, block=4)
    z = SIZES[case["size"]]
    small = {"H": 32, "layers": 1, "heads": 4, "kv": 2 if z["kv"] < z["heads"] else 4, "I": 64, "V": 256, "tie": z["tie"]}
    _, _, warm_step = _build(warm, small)
    warm_step()
    warm_step()
    del warm_step
    model, forward, step = _build(case, z)
    Path("/proc/self/clear_refs").write_text("5")
    _, before = _status()
    start = time.perf_counter()
    step()
    step()
    seconds = time.perf_counter() - start
    peak, _ = _status()
    saved = None if case.get("ckpt") or forward is None else _saved_bytes(model, forward)
    return {"measured_step_bytes": peak - before, "baseline_rss_bytes": before, "saved_activation_bytes": saved,
            "parameters": sum(p.numel() for p in model.parameters()),
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad), "seconds": round(seconds, 2)}


# ------------------------------------------------------------------------------------------ driver


def run_case(name: str) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=MMAP_THRESHOLD, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, __file__, "--measure", name], capture_output=True, text=True, env=env,
                         timeout=600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"case {name} failed:\n{out.stderr[-3000:]}")
    measured = json.loads(out.stdout.strip().splitlines()[-1])

    row = {"case": name, **CASES[name], "parameters": measured["parameters"], "trainable": measured["trainable"],
           "measured_step_bytes": measured["measured_step_bytes"], "seconds": measured["seconds"]}
    if measured["saved_activation_bytes"] is not None:
        row["saved_activation_bytes"] = measured["saved_activation_bytes"]
    if "lora" in row:
        row["lora"] = list(row["lora"])
    return planned_side(row)


def planned_side(row: dict) -> dict:
    """``row`` (a case's measured fields) with the plan's side filled in from today's plan: the planned step bytes,
    the relative errors, the planned terms (``--replan`` refreshes a results file this way after a plan change,
    without measuring again)."""
    from dlmrl.training.memory_plan import kept_logits_bytes

    name = row["case"]
    plan, arch, settings = plan_for(CASES[name])
    rollout = CASES[name].get("kind") in ("rollout", "uniform_rollout")
    # (the weights are in the baseline; a sampling call builds no optimizer state either)
    planned = (plan.terms["rollout_kv_cache"] + plan.terms["rollout_logits"] + plan.terms["rollout_soft_inputs"]
               if rollout else plan.peak - plan.terms["parameters"])
    measured = row["measured_step_bytes"]
    row.update({"planned_parameters": plan.total_parameters, "planned_step_bytes": planned,
                "relative_error": round((planned - measured) / measured, 4),
                "planned_peak_phase": "rollout" if rollout else plan.peak_phase,
                "planned_terms": {k: v for k, v in plan.terms.items() if v}})
    if row.get("saved_activation_bytes") is not None:
        # (the log-softmax is kept too; DiffusionGemma: the softmax of the self-conditioning inputs, the second of
        # the two copies soft_inputs counts with a trained embedding: the first, the detached input, is held by the
        # scorer, not saved by autograd)
        act = plan.terms["activations"] + kept_logits_bytes(arch, settings) + (
            plan.terms["soft_inputs"] // 2 if settings.full else 0)
        row["activation_relative_error"] = round((act - row["saved_activation_bytes"]) / row["saved_activation_bytes"],
                                                 4)
    return row


def _table(rows: list[dict]) -> str:
    lines = ["| case | params | setting | measured step MB | planned step MB | error | activations error |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        setting = ", ".join(filter(None, [
            r.get("dtype", "float32"), f"LoRA r{r['lora'][0]} {r['lora'][1]}" if r.get("lora") else "full",
            "checkpointing" if r.get("ckpt") else "", f"logits_chunk {r['chunk']}" if r.get("chunk") else "",
            r.get("kind", "diffusion"),
            f"{r['B']} rows, prompt {r['P']} + {r['L']} in blocks of {r['block']}" if r.get("kind") == "rollout" else
            f"{r['B']} rows, prompt {r['P']} + a canvas of {r['L']}" if r.get("kind") == "uniform_rollout" else
            f"{r['B']} rows x {r['S']} steps, prompt {r['P']} + a canvas of {r['L']}" if r.get("kind") == "uniform_train"
            else
            f"{r['B'] * r['S']} canvases x {r['P']}+{(2 if r.get('kind') == 'block' else 1) * r['L']}"]))
        act = f"{r['activation_relative_error']:+.1%}" if "activation_relative_error" in r else "-"
        lines.append(f"| {r['case']} | {r['parameters'] / 1e6:.1f}M | {setting} | "
                     f"{r['measured_step_bytes'] / 1e6:.1f} | {r['planned_step_bytes'] / 1e6:.1f} | "
                     f"{r['relative_error']:+.1%} | {act} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--replan", action="store_true",
                        help="measure nothing: recompute the planned side of --out's cases with today's plan (after a "
                             "plan change), keeping their measurements; records the commit in 'replanned'")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "memory_plan_check.json"))
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(CASES[args.measure])))
        return
    if args.replan:
        replan(Path(args.out))
        return
    import torch

    rows = []
    for name in args.cases:
        rows.append(run_case(name))
        r = rows[-1]
        print(f"{name}: measured {r['measured_step_bytes'] / 1e6:.1f} MB, planned {r['planned_step_bytes'] / 1e6:.1f}"
              f" MB ({r['relative_error']:+.1%})", flush=True)
    result = {
        "what": "memory plan vs measured peak of two training steps (score with grad, backward, AdamW step) per case",
        "method": "peak RSS (VmHWM reset by /proc/self/clear_refs) minus RSS before the steps, fresh subprocess per "
                  f"case, MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}, warm-up on a small model first, 1 thread; "
                  "planned = plan peak - parameters; activations alone checked against autograd's saved tensors",
        "target": "|relative_error| <= 0.25",
        "command": "python benchmarks/memory_plan_check.py",
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "cpus": os.cpu_count()},
        "not_measured": NOT_MEASURED,
        "cases": rows,
    }
    _write(Path(args.out), result)


def _write(out: Path, result: dict) -> None:
    """The summary fields from the cases (worst error, the README's table), then the file."""
    rows = result["cases"]
    worst = max(abs(r["relative_error"]) for r in rows)
    result.update({"worst_relative_error": worst, "within_target": worst <= 0.25, "table": _table(rows)})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(result["table"])
    print(f"worst |relative error| {worst:.1%} ({'within' if worst <= 0.25 else 'OUTSIDE'} the 25% target); "
          f"wrote {out}")


def replan(out: Path) -> None:
    """``--replan``: the planned side of every case in ``out`` recomputed (:func:`planned_side`), the measurements
    kept, and the commit it was done at recorded."""
    import subprocess

    result = json.loads(out.read_text())
    result["cases"] = [planned_side(dict(row)) for row in result["cases"]]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent, check=False).stdout.strip()
    result["replanned"] = (f"planned side recomputed at {commit or 'an unknown commit'} with "
                           "`python benchmarks/memory_plan_check.py --replan`; measured fields from the run above")
    _write(out, result)


if __name__ == "__main__":
    main()
