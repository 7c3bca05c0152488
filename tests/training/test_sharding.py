"""FSDP2 sharding (``train.sharding: fsdp2``, :mod:`dlmrl.training.sharding`) on CPU processes (gloo).

Two processes sharding every decoder layer and the root train the parameters a 1-process unsharded run trains,
for the diffusion, block and AR kinds (after 1 step, the checkpoint's torch.distributed.checkpoint files, and
after 2, ``final_model/``); a run stopped after its first checkpoint and resumed equals the uninterrupted one
bit for bit, and a 1-process checkpoint resumes on 2 processes (torch.distributed.checkpoint reshards); each
process holds about half of the parameters and of AdamW's state.

Tolerance: with two processes every gradient entry is the same sum split in two partial sums (each process's
rows), added by FSDP2's reduce-scatter; the order differs from the 1-process sum, so parameters agree to rounding.
As in ``tests/training/test_multiprocess.py`` the runs are compared in float64, under its ``TOLERANCE`` (derived
there: AdamW's lr/ε amplification of a reordered sum in float64, ~3e-14 observed, 1e-9 allowed, 1e6 below the
second step's movement, which is checked).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dlmrl.config import ConfigError, default_job_config
from dlmrl.training.checkpoint import SHARDED_DIR, damaged_file
from dlmrl.training.trainer import train
from tests.helpers import crash_then_resume
from tests.training.test_multiprocess import TOLERANCE, free_port

LR = 1e-3
COMMON = ["max_steps=2", "prompts_per_step=4", "num_generations=4", "warmup_steps=0", f"learning_rate={LR}",
          "save_steps=1", "eval.before=false", "eval.after=false", "model.dtype=float64"]
#: the kinds, with micro-batched scoring where the kind has it (processes then run padded, equal pass counts)
KINDS = {
    "diffusion": ["num_iterations=2", "estimator.micro_batch=5"],
    "block": ["model.kind=block", "model.name_or_path=tiny-sudoku-block", "model.block_size=4", "task.answer_mode=full",
              "sampling.steps=8", "algorithm=tracerl", "estimator.name=trajectory", "estimator.merge=1",
              "estimator.micro_batch=5"],
    "ar": ["model.kind=ar", "model.name_or_path=tiny-sudoku-ar", "task.answer_mode=full", "algorithm=grpo",
           "estimator.micro_batch=3"],
}
SHARDED = ["train.sharding=fsdp2"]
WORKER = Path(__file__).with_name("fsdp2_worker.py")


def launch_jobs(jobs: list[dict], tmp_path: Path, processes: int = 2) -> None:
    """Run the jobs in ``processes`` CPU processes (gloo) through one ``torch.distributed.run`` launch."""
    spec = tmp_path / "jobs.json"
    spec.write_text(json.dumps(jobs))
    cmd = [sys.executable, "-m", "dlmrl.training.cpu_launch", "--nnodes", "1", "--nproc_per_node", str(processes),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(WORKER), str(spec)]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["ACCELERATE_USE_CPU"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")])
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-6000:]


def one_process(overrides: list[str], out: Path, resume: bool = False) -> dict:
    return train(default_job_config([f"output_dir={out}", *overrides]), resume=resume, progress=False)


def final(out: Path) -> dict[str, torch.Tensor]:
    """``final_model/``'s weights (a LoRA run's: its adapter)."""
    folder = out / "final_model"
    name = "adapter_model.safetensors" if (folder / "adapter_model.safetensors").is_file() else "model.safetensors"
    return load_file(str(folder / name))


def checkpoint_model(folder: Path) -> dict[str, torch.Tensor]:
    """The model tensors of a checkpoint: ``model.safetensors`` (unsharded), else its torch.distributed.checkpoint
    files read back in this process (``dcp_to_torch_save``; no process group needed)."""
    if (folder / "model.safetensors").is_file():
        return load_file(str(folder / "model.safetensors"))
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = folder.parent / f"{folder.name}.pt"
    dcp_to_torch_save(str(folder / SHARDED_DIR), str(target))
    return torch.load(target, weights_only=False)["model"]


def max_diff(a: dict, b: dict) -> float:
    """Max |a − b| over the tensors both hold (an unsharded checkpoint may hold a tied head twice; a LoRA
    checkpoint names its adapter ``default``, ``final_model/``'s adapter file does not)."""
    a, b = ({k.replace(".default.", "."): v for k, v in d.items()} for d in (a, b))
    shared = [k for k in a if k in b]
    assert shared and all(k in a for k in b if k != "lm_head.weight"), (sorted(a), sorted(b))
    return max((a[k] - b[k]).abs().max().item() for k in shared)


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def assert_same_training(sharded: Path, plain: Path, tol: float = TOLERANCE) -> None:
    """Parameters after 1 step (checkpoints) and 2 steps (final models) within ``tol``, not vacuously; the same
    rollouts (rewards) and loss statistics."""
    for step in ("step-1", "step-2"):
        assert damaged_file(sharded / "checkpoints" / step) is None  # (every file listed with its checksum)
    after_one = checkpoint_model(plain / "checkpoints" / "step-1")
    assert max_diff(checkpoint_model(sharded / "checkpoints" / "step-1"), after_one) < tol
    diff = max_diff(final(sharded), final(plain))
    print(f"max |sharded - one process| = {diff:.3g}")
    assert diff < tol
    moved = max_diff(final(plain), after_one)
    assert moved > 0.1 * LR > 1e3 * tol  # (the second step moved the parameters by about lr)
    assert all(t.dtype == torch.float64 for t in final(plain).values())
    for r2, r1 in zip(rows(sharded), rows(plain), strict=True):
        for key in ("reward_mean", "rows_scored", "completions_total", "lr"):
            assert r2[key] == r1[key], key
        for key in ("loss", "grad_norm"):
            assert r2[key] == pytest.approx(r1[key], rel=1e-6, abs=1e-9), key


def assert_half_each(out: Path, processes: int = 2) -> None:
    """Each process holds its dim-0 shard of every parameter (and of AdamW's two moments of each trained one):
    together the whole, each at most ``whole / W`` plus one row of each tensor (``torch.chunk``'s rounding)."""
    parts = [json.loads((out / f"bytes_{r}.json").read_text()) for r in range(processes)]
    whole, row = parts[0]["whole_params"], parts[0]["row_bytes"]
    trained, trained_row = parts[0]["whole_trained"], parts[0]["trained_row_bytes"]
    assert sum(p["params"] for p in parts) == whole
    # (AdamW: exp_avg and exp_avg_sq of each trained parameter, in its dtype)
    assert sum(p["optimizer"] for p in parts) == 2 * trained
    for p in parts:
        assert p["params"] <= whole / processes + row
        assert p["optimizer"] <= 2 * (trained / processes + trained_row)


def test_two_processes_shard_as_one_process_and_resume(tmp_path, monkeypatch):
    """One launch of 2 processes, the diffusion kind (GDPO, μ = 2, micro-batched scoring): the 1-process unsharded
    parameters after 1 and 2 steps, each process holding half the bytes; a crash after the first checkpoint resumes
    bit for bit; a 1-process sharded checkpoint resumes on 2 processes (torch.distributed.checkpoint reshards on
    load)."""
    diffusion = [*COMMON, *KINDS["diffusion"]]
    one_process(diffusion, tmp_path / "plain")
    # a 1-process sharded run stopped after its first checkpoint, resumed below on 2 processes
    crash_then_resume(monkeypatch, lambda resume: None if resume else one_process(
        [*diffusion, *SHARDED], tmp_path / "one_to_two"), 1)
    launch_jobs([
        {"overrides": [*diffusion, *SHARDED, f"output_dir={tmp_path / 'two'}"]},
        {"overrides": [*diffusion, *SHARDED, f"output_dir={tmp_path / 'crashed'}"], "crash_step": 1},
        {"overrides": [*diffusion, *SHARDED, f"output_dir={tmp_path / 'one_to_two'}"], "resume": True},
    ], tmp_path)
    assert_same_training(tmp_path / "two", tmp_path / "plain")
    assert_half_each(tmp_path / "two")
    a, b = final(tmp_path / "two"), final(tmp_path / "crashed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # (bit for bit)
    assert [r["loss"] for r in rows(tmp_path / "crashed")] == [r["loss"] for r in rows(tmp_path / "two")]
    assert max_diff(final(tmp_path / "one_to_two"), final(tmp_path / "plain")) < TOLERANCE


@pytest.mark.slow
def test_two_processes_shard_the_block_ar_and_lora_runs_as_one_process(tmp_path):
    """One launch of 2 processes: the block kind (TraceRL, trajectory estimator, composite passes), the AR kind
    (GRPO with its KL reference, a second sharded model whose passes run gathered), each with micro-batched
    scoring, and a LoRA run (the adapter inside the peft wrapper sharded with its layers) reach the 1-process
    unsharded parameters after 1 and 2 steps, each process holding half the bytes."""
    runs = {"block": KINDS["block"], "ar": KINDS["ar"],
            "lora": [*KINDS["diffusion"], "model.use_peft=true", "model.lora_dropout=0"]}
    for name, extra in runs.items():
        one_process([*COMMON, *extra], tmp_path / f"plain_{name}")
    launch_jobs([{"overrides": [*COMMON, *extra, *SHARDED, f"output_dir={tmp_path / name}"]}
                 for name, extra in runs.items()], tmp_path)
    for name in runs:
        assert_same_training(tmp_path / name, tmp_path / f"plain_{name}")
        assert_half_each(tmp_path / name)
    assert rows(tmp_path / "ar")[-1]["kl"] > 0


# -- one process (no launch) --------------------------------------------------------------------------------


def test_one_process_sharded_run_is_the_unsharded_run_and_resumes_exactly(tmp_path, monkeypatch):
    """A 1-process FSDP2 run (a world of one) takes the unsharded run's steps exactly, writes torch.distributed.
    checkpoint files listed in its manifest, and a crash after the first checkpoint resumes bit for bit."""
    overrides = [*COMMON, *KINDS["diffusion"]]
    one_process(overrides, tmp_path / "plain")
    one_process([*overrides, *SHARDED], tmp_path / "sharded")
    assert max_diff(final(tmp_path / "sharded"), final(tmp_path / "plain")) == 0
    step = tmp_path / "sharded" / "checkpoints" / "step-1"
    manifest = json.loads((step / "dlmrl_checkpoint.json").read_text())
    assert f"{SHARDED_DIR}/.metadata" in manifest["sha256"] and not (step / "model.safetensors").exists()
    crash_then_resume(monkeypatch, lambda resume: one_process([*overrides, *SHARDED], tmp_path / "crashed",
                                                              resume=resume), 1)
    a, b = final(tmp_path / "sharded"), final(tmp_path / "crashed")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_damaged_shard_file_is_found_before_resuming(tmp_path):
    one_process([*COMMON, "max_steps=1", *SHARDED], tmp_path / "run")
    shard = next((tmp_path / "run" / "checkpoints" / "step-1" / SHARDED_DIR).glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert "its contents changed" in damaged_file(shard.parent.parent)


def test_accelerate_fsdp_or_deepspeed_under_dlmrl_sharding_is_refused():
    from types import SimpleNamespace

    from dlmrl.training.sharding import check_launch

    for kind in ("DistributedType.FSDP", "DistributedType.DEEPSPEED"):
        with pytest.raises(ConfigError, match="train.sharding.*fsdp2 shards the model itself"):
            check_launch(SimpleNamespace(distributed_type=kind))
    check_launch(SimpleNamespace(distributed_type="DistributedType.MULTI_CPU"))


def test_an_unknown_sharding_is_named():
    from dlmrl.config import validate

    with pytest.raises(ConfigError, match="train.sharding.*unknown sharding 'zero3'"):
        validate(default_job_config(["train.sharding=zero3"]))


# -- every family's layers ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    """The remote-code stand-ins (tests/models/remote_code) and the shipped tiny Llama, as float64 policies."""
    from dlmrl.models.loading import load_policy
    from tests.models.checkpoints import BUILDERS, isolated_remote_code

    root = tmp_path_factory.mktemp("sharded_families")
    with isolated_remote_code(root / "hf_modules"):
        policies = {kind: load_policy(str(BUILDERS[kind](root / kind)), trust_remote_code=True, dtype="float64")
                    for kind in ("llada", "dream", "sdar", "llada2", "llada_moe")}
        policies["tiny"] = load_policy("tiny-sudoku", dtype="float64")
        yield policies


#: the class ``fully_shard`` wraps one at a time in each family (LLaDA's stand-in names its block ``Block``, the real
#: code ``LLaDALlamaBlock``: both found as the model's one repeated block list; Dream's stand-in has no layer list,
#: the real Dream is a Qwen2 with ``Qwen2DecoderLayer`` in ``_no_split_modules``)
LAYER_CLASS = {"llada": "Block", "dream": None, "sdar": "SDARDecoderLayer", "llada2": "LLaDA2MoeDecoderLayer",
               "llada_moe": "LLaDAMoEDecoderLayer", "tiny": "LlamaDecoderLayer"}


@pytest.mark.parametrize("kind", list(LAYER_CLASS))
def test_every_family_is_sharded_by_decoder_layer_and_computes_the_same(kind, stand_ins):
    """The decoder layers found (none nested: LLaDA2's experts stay inside their layer), and on a world of one the
    sharded model's logits, gathered or per layer, equal the unsharded model's exactly (sharding moves storage,
    not arithmetic)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from dlmrl.models.policy import canvas_logits
    from dlmrl.training.sharding import decoder_layers, ensure_process_group, gathered, shard_module

    policy = dataclasses.replace(stand_ins[kind], model=copy.deepcopy(stand_ins[kind].model))
    layers = decoder_layers(policy.model)
    assert {type(m).__name__ for m in layers} == ({LAYER_CLASS[kind]} if LAYER_CLASS[kind] else set())
    listed = {id(m) for m in layers}
    assert not any(id(c) in listed for m in layers for c in m.modules() if c is not m)  # (none inside another)
    g = torch.Generator().manual_seed(0)
    lo = policy.tokenizer.convert_tokens_to_ids("0")
    prompt, canvas = torch.randint(lo, lo + 10, (2, 4), generator=g), torch.randint(lo, lo + 10, (2, 3), generator=g)
    pm = torch.ones(2, 4, dtype=torch.bool)
    before = canvas_logits(policy, prompt, pm, canvas)
    created = not dist.is_initialized()
    ensure_process_group("cpu")
    try:
        count, _ = shard_module(policy.model, init_device_mesh("cpu", (1,)))
        assert count == len(layers)
        assert torch.equal(canvas_logits(policy, prompt, pm, canvas), before)  # (per layer)
        with gathered(policy.model):
            assert torch.equal(canvas_logits(policy, prompt, pm, canvas), before)
    finally:
        if created:
            dist.destroy_process_group()
