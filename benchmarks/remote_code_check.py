"""dlmrl on LLaDA's and Dream's own published model code, on tiny random checkpoints built from a local clone.

    git clone https://github.com/NVlabs/Fast-dLLM          # llada/model/ and dream/model/: the checkpoints' code
    git clone https://github.com/ML-GSAI/LLaDA             # generate.py: LLaDA's reference sampler
    python benchmarks/remote_code_check.py Fast-dLLM LLaDA [--work DIR] [--skip-train] [--only llada|dream]

A ``git clone`` of a hub checkpoint without its weights (``GIT_LFS_SKIP_SMUDGE=1 git clone
https://huggingface.co/GSAI-ML/LLaDA-8B-Instruct``) works as well: its ``config.json`` then gives the fields.

For each family whose code the clones hold, ``remote_code_checkpoints.build_checkpoint`` writes a tiny random
checkpoint (2 layers, width 64, the real vocabulary and mask id, the release's other config fields) whose code is
the clone's files, then this script runs, with dlmrl and the installed ``transformers``:

- ``load``: ``load_policy(path, trust_remote_code=True)`` through ``auto_map`` (family detected, mask id), refused
  without ``trust_remote_code``, and what plain ``AutoModel.from_pretrained`` does without dlmrl's patches;
- ``conventions``: the facts dlmrl's family adapter relies on, measured on the real code and on the test suite's
  stand-in (``tests/models/remote_code``): the adapter's logits are the code's own sampler call, whether the forward
  applies a left-padding mask, whether it takes ``position_ids`` and whether shifting them changes the logits, the
  mask id of the code's config default, and dlmrl's left-padding invariance;
- ``dry-run``, 2 training steps with ``gdpo`` and with ``diffu_grpo`` (the LLaDA recipes' ``model`` section: LoRA on
  ``q_proj,k_proj,v_proj``, ``bfloat16``; gradient checkpointing on), then ``dlmrl eval`` of the saved adapter;
- gradient checkpointing (gradients equal to those without it, blocks recomputed), ``bfloat16`` forward;
- threshold decoding (LLaDA: token-identical to Fast-dLLM's ``generate(threshold=...)``);
- greedy decoding token-identical to the code's own sampler (LLaDA: ``generate`` of ``generate.py``; Dream:
  ``diffusion_generate(alg="maskgit_plus")``, run with ``eps=-1e-3`` so its schedule ``int(n·(1 − s/t))`` reveals
  one token per step, dlmrl's schedule with ``steps = gen_length``).

Prints a table (PASS, FAIL, or INFO for a recorded fact) and writes ``benchmarks/results/remote_code_check.json``.
Exit status 1 if any check fails. CPU, a few minutes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "remote_code_check.json"
REWARD_MODULE = '''def text_length(prompts, completions, **columns):
    """Characters of decoded text in the completion, / 8 (any signal that varies across a group)."""
    return [min(len(text), 8) / 8 for text in completions]
'''
PROMPTS = ["12+7=", "3*4=", "9-5=", "8+8="]


class Report:
    """Rows ``(family, check, status, detail)``."""

    def __init__(self):
        self.rows: list[dict] = []

    def add(self, family: str, check: str, ok: bool | None, detail: str) -> None:
        status = "INFO" if ok is None else ("PASS" if ok else "FAIL")
        self.rows.append({"family": family, "check": check, "status": status, "detail": detail})
        print(f"[{status}] {family} {check}: {detail}", flush=True)

    def run(self, family: str, check: str, fn) -> None:
        """Record ``fn() -> (ok, detail)``; an exception is a FAIL naming it."""
        try:
            ok, detail = fn()
        except Exception as e:  # noqa: BLE001 (the table reports any failure)
            ok, detail = False, f"{type(e).__name__}: {str(e)[:300]}"
        self.add(family, check, ok, detail)


def run_cli(args: list[str], env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlmrl.cli", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout, check=False)


# ------------------------------------------------------------------------------------------------- loading


def unpatched_load(path: Path, env: dict) -> tuple[bool | None, str]:
    """What ``transformers``' own ``AutoModel.from_pretrained`` does with the checkpoint code (a fresh process)."""
    code = ("import torch, transformers as t\n"
            f"m = t.AutoModel.from_pretrained({str(path)!r}, trust_remote_code=True, dtype=torch.float32)\n"
            f"m(torch.tensor([[1, 2, 3]]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                         check=False)
    last = [line for line in out.stderr.strip().splitlines() if line.strip()][-1:] or ["(no error)"]
    return None, "loads and runs" if out.returncode == 0 else f"fails: {last[0][:200]}"


def check_load(family: str, path: Path, expected_mask: int):
    from dlmrl.models.loading import load_policy

    policy = load_policy(str(path), trust_remote_code=True)
    ok = policy.family == family and policy.mask_token_id == expected_mask
    return ok, (f"family {policy.family}, mask id {policy.mask_token_id}, {type(policy.model).__name__} from "
                f"{type(policy.model).__module__.split('.')[-1]}.py, tokenizer {type(policy.tokenizer).__name__}")


def check_as_built(family: str, path: Path):
    """The loaded model's logits against the same class built directly (``__init__`` on the CPU, no meta device)
    with the checkpoint's weights put in by ``load_state_dict``: what loading must reproduce."""
    from safetensors.torch import load_file

    from dlmrl.models.compat import checkpoint_model_class, load_checkpoint_config
    from dlmrl.models.loading import load_policy

    policy = load_policy(str(path), trust_remote_code=True)
    config = load_checkpoint_config(str(path), trust_remote_code=True)
    by_hand = checkpoint_model_class(config, str(path))(config)
    missing, unexpected = by_hand.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
    ids = policy.tokenizer(["12+3=45"], add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        gap = _gap(own_call(family, policy.model, ids), own_call(family, by_hand.eval(), ids))
    return gap == 0.0 and not unexpected, (f"max relative logit gap {gap:.1e} (0 expected: same weights, same "
                                           f"kernels); keys not in the file: {sorted(missing) or 'none'}")


def check_refused(path: Path, loader=None):
    """``loader(path)`` (default ``load_policy``) without ``trust_remote_code`` must refuse, naming it."""
    from dlmrl.models.loading import load_policy

    try:
        (loader or load_policy)(str(path))
    except ValueError as e:
        return "trust_remote_code" in str(e), "refused: " + str(e)[:90] + "..."
    return False, "loaded without trust_remote_code"


# --------------------------------------------------------------------------------------------- conventions


def own_call(family: str, model, ids):
    """The logits as the code's own sampler reads them (LLaDA's generate.py: ``model(x).logits``; Dream's
    ``_sample``: ``model(x, "full", None)`` shifted right by one)."""
    if family == "llada":
        return model(ids).logits
    raw = model(ids, "full", None).logits
    return torch.cat([raw[:, :1], raw[:, :-1]], dim=1)


def _gap(a, b) -> float:
    """Largest ``|a − b|`` relative to the largest ``|b|``."""
    return float((a - b).abs().max() / b.abs().max())


#: float32 logits of the same tokens computed at other lengths differ by reduction order (~1e-6 relative); a
#: change in what the tokens attend to moves these random models' logits by O(1) relative
SAME = 1e-4


def conventions(family: str, policy) -> dict:
    """The facts dlmrl's adapter relies on, measured on ``policy``'s model (float32, no grad)."""
    import inspect

    from dlmrl.models.policy import canvas_logits

    model, tok, mask = policy.model, policy.tokenizer, policy.mask_token_id
    short = tok(["12+3="], add_special_tokens=False, return_tensors="pt")["input_ids"]
    ids = torch.cat([short, torch.full((1, 4), mask)], 1)  # (1, T)
    k, t = 6, ids.shape[1]
    padded = torch.cat([torch.full((1, k), tok.pad_token_id), ids], 1)  # (1, k + T)
    attn = torch.cat([torch.zeros(1, k, dtype=torch.long), torch.ones_like(ids)], 1)  # (1, k + T)
    facts = {}
    with torch.no_grad():
        facts["adapter logits = own sampler call"] = bool(torch.equal(policy(ids), own_call(family, model, ids)))
        alone = model(ids).logits if family == "llada" else model(ids, "full", None).logits
        if family == "llada":
            with_mask = model(padded, attention_mask=attn).logits[:, k:]
        else:
            keys = attn.bool()[:, None, None, :].expand(1, 1, k + t, k + t)  # (1, 1, k + T, k + T)
            with_mask = model(padded, keys, (attn.cumsum(-1) - 1).clamp(min=0)).logits[:, k:]
        gap = _gap(with_mask, alone)
        facts["forward applies the padding mask"] = f"{gap <= SAME} (relative gap {gap:.1e})"
        params = inspect.signature(model.forward).parameters
        facts["forward takes position_ids"] = "position_ids" in params
        if "position_ids" in params:  # RoPE is relative: only a gap between positions can change the scores
            gapped = torch.arange(t)[None] + 5 * (torch.arange(t)[None] >= 2)  # (1, T): 0, 1, 7, 8, ...
            gap = _gap(model(ids, "full", gapped).logits, alone)
            facts["position_ids reach the attention (a gap in them changes the logits)"] = (
                f"{gap > SAME} (relative gap {gap:.1e})")
        both = tok(["12+3=", "1234+56="], add_special_tokens=False, padding=True, return_tensors="pt")
        canvas = torch.full((2, 4), mask)
        batched = canvas_logits(policy, both["input_ids"], both["attention_mask"].bool(), canvas)[0]
        single = canvas_logits(policy, short, torch.ones_like(short, dtype=torch.bool), canvas[:1])[0]
        gap = _gap(batched, single)
        facts["dlmrl: a prompt's logits do not depend on its batch's padding"] = f"{gap <= SAME} (relative gap {gap:.1e})"
    facts["mask id: config.json / code's config default"] = (
        f"{getattr(model.config, 'mask_token_id', None)} / {getattr(type(model.config)(), 'mask_token_id', None)}")
    return facts


def compare_conventions(report: Report, family: str, real: dict, stand_in: dict) -> None:
    relied_on = {"adapter logits = own sampler call", "dlmrl: a prompt's logits do not depend on its batch's padding"}
    for key, value in real.items():
        other = stand_in.get(key, "n/a")
        ok = (value is True or str(value).startswith("True")) if key in relied_on else None
        report.add(family, f"convention: {key}", ok, f"real code {value}; stand-in {other}"
                   + ("" if str(other)[:5] == str(value)[:5] or key.startswith("mask id") else " (differs)"))


# ----------------------------------------------------------------------------------------- training, eval


def write_tiny_run(work: Path, name: str, prompts: list[str], model: dict, sampling: dict, estimator: dict,
                   train: dict, eval_steps: int) -> Path:
    """Write ``<work>/<name>.yaml``: a 2-step run of a dataset task on ``prompts`` (``<work>/prompts.jsonl``, train and
    held-out) with a tiny batch (2 prompts x 2, mu 2) and the ``text_length`` reward, into ``<work>/runs/<name>``."""
    import yaml

    data = work / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    config = {
        "model": model,
        "task": {"name": "dataset", "train_file": str(data), "test_file": str(data)},
        "sampling": sampling,
        "estimator": estimator,
        "train": {**train, "max_steps": 2, "prompts_per_step": 2, "num_generations": 2, "num_iterations": 2,
                  "save_steps": 100, "reward_funcs": ["remote_code_rewards:text_length"]},
        "eval": {"num_puzzles": 2, "steps": eval_steps, "batch_size": 2, "before": False, "after": False},
        "output_dir": str(work / "runs" / name),
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def write_run_config(family: str, algorithm: str, ckpt: Path, work: Path) -> Path:
    """The recipe's ``model`` section (LoRA targets, dropout, dtype) on ``ckpt``, with gradient checkpointing on,
    the algorithm's recipe settings, a 4-prompt dataset task and a tiny batch."""
    import yaml

    recipe = yaml.safe_load((ROOT / "configs" / f"llada_{algorithm}_sudoku.yaml").read_text())
    model = {**recipe["model"], "name_or_path": str(ckpt), "family": family, "lora_r": 8, "lora_alpha": 4,
             "gradient_checkpointing": True}
    sampling = {**recipe["sampling"], "gen_length": 8, "block_length": 4, "steps": 4}
    return write_tiny_run(work, f"{family}_{algorithm}", PROMPTS, model, sampling, recipe["estimator"],
                          recipe["train"], eval_steps=4)


def check_dry_run(config: Path, env: dict):
    out = run_cli(["train", "--config", str(config), "--dry-run"], env)
    return out.returncode == 0 and "algorithm" in out.stdout, f"rc {out.returncode}; " + (
        out.stdout.strip().splitlines()[0][:80] if out.returncode == 0 else out.stderr.strip()[-300:])


def check_train(config: Path, env: dict, n_layers: int):
    import yaml
    from safetensors.torch import load_file

    run = Path(yaml.safe_load(config.read_text())["output_dir"])
    t0 = time.time()
    out = run_cli(["train", "--config", str(config), "--no-progress"], env)
    if out.returncode != 0:
        return False, f"rc {out.returncode}: {out.stderr.strip()[-300:]}"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    adapter = load_file(str(run / "final_model" / "adapter_model.safetensors"))
    lora_b = {k: v for k, v in adapter.items() if "lora_B" in k}
    targets = sorted({k.split(".lora_B")[0].rsplit(".", 1)[-1] for k in lora_b})
    moved = sum(int(v.abs().max() > 0) for v in lora_b.values())  # lora_B starts at 0
    losses = [s.get("loss") for s in steps]  # None: a step whose groups all had equal rewards (nothing to score)
    finite = all(v is None or math.isfinite(v) for v in losses) and any(v is not None for v in losses)
    ok = len(steps) == 2 and finite and moved > 0 and len(lora_b) == 3 * n_layers
    return ok, (f"{len(steps)} steps in {time.time() - t0:.0f}s, loss {[v if v is None else round(v, 5) for v in losses]}"
                f", LoRA on {targets} x {len(lora_b) // max(len(targets), 1)} layers, {moved}/{len(lora_b)} lora_B "
                f"moved from 0")


def check_eval(config: Path, env: dict):
    import yaml

    run = Path(yaml.safe_load(config.read_text())["output_dir"])
    out = run_cli(["eval", "--model", str(run / "final_model")], env)
    if out.returncode != 0:
        return False, f"rc {out.returncode}: {out.stderr.strip()[-300:]}"
    result = json.loads(out.stdout)
    return True, (f"adapter reloaded onto the base; {result['num_examples']} held-out prompts, mean_reward "
                  f"{result['mean_reward']}")


# ------------------------------------------------------------------------------ checkpointing, dtype


def check_gradient_checkpointing(family: str, path: Path):
    """Gradients of a fixed masked-token loss with and without activation checkpointing (float32, train mode)."""
    from dlmrl.models.families import FAMILIES
    from dlmrl.models.loading import load_policy
    from dlmrl.models.lora import enable_gradient_checkpointing

    def grads(checkpointing: bool):
        policy = load_policy(str(path), trust_remote_code=True)
        policy.model.train()
        if checkpointing:
            enable_gradient_checkpointing(policy.model, FAMILIES.get(family).activation_checkpointing)
        calls = []
        block = next(m for n, m in policy.model.named_modules() if n.endswith(("blocks.0", "layers.0")))
        block.register_forward_pre_hook(lambda *_: calls.append(1))  # (a recompute may stop before the end)
        ids = policy.tokenizer(["12+3=4567"], add_special_tokens=False, return_tensors="pt")["input_ids"]
        noisy = ids.clone()
        noisy[:, 5:] = policy.mask_token_id
        logp = torch.log_softmax(policy(noisy), -1).gather(-1, ids[..., None])[0, 5:, 0]
        (-logp.sum()).backward()
        return {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}, len(calls)

    plain, plain_calls = grads(False)
    ckpt, ckpt_calls = grads(True)
    # the recomputed forward runs the same float32 kernels on the same inputs: identical up to rounding
    # (CPU kernels are deterministic, so 0 expected; 1e-6 relative allows a different reduction order)
    diff = max(float((plain[n] - ckpt[n]).abs().max() / plain[n].abs().max().clamp(min=1e-30)) for n in plain)
    ok = set(plain) == set(ckpt) and diff <= 1e-6 and ckpt_calls == 2 * plain_calls
    return ok, (f"block 0 ran {plain_calls}x without, {ckpt_calls}x with checkpointing (recomputed in backward); "
                f"max relative gradient difference {diff:.1e}")


def check_bf16(path: Path):
    from dlmrl.models.loading import load_policy

    policy = load_policy(str(path), trust_remote_code=True, dtype="bfloat16")
    ids = policy.tokenizer(["12+3="], add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = policy(torch.cat([ids, torch.full((1, 4), policy.mask_token_id)], 1))
    dtypes = {p.dtype for p in policy.model.parameters()}
    ok = dtypes == {torch.bfloat16} and bool(torch.isfinite(logits).all())
    return ok, f"weights {sorted(str(d) for d in dtypes)}, logits {logits.dtype} finite: {bool(torch.isfinite(logits).all())}"


# ---------------------------------------------------------------------------------------------- decoding


def load_function(path: Path, name: str):
    """``name`` from the Python file ``path`` (its folder on ``sys.path`` while it imports)."""
    import importlib.util

    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"_reference_{path.parent.name}_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return getattr(module, name)


def prompts_of(policy, texts: list[str]):
    from dlmrl.data.encoding import encode_prompts

    return encode_prompts(policy.tokenizer, texts)


SETTINGS = [(16, 16, 16), (16, 8, 8), (16, 8, 4)]  # (gen_length, block_length, steps)


def check_llada_greedy(policy, reference, label: str, batch: int = 2):
    """dlmrl's greedy canvas against LLaDA's ``generate`` on an unpadded batch of ``batch``, per setting."""
    from dlmrl.models.sampler import generate

    ids = policy.tokenizer(["12+3=", "45+6="][:batch], add_special_tokens=False, return_tensors="pt")["input_ids"]
    same = []
    for gen, block, steps in SETTINGS:
        ours = generate(policy, ids, torch.ones_like(ids, dtype=torch.bool), gen_length=gen, block_length=block,
                        steps=steps).canvas
        theirs = reference(policy.model, ids, steps=steps, gen_length=gen, block_length=block, temperature=0.0,
                           remasking="low_confidence", mask_id=policy.mask_token_id)
        theirs = theirs[0] if isinstance(theirs, tuple) else theirs
        same.append(bool(torch.equal(ours, theirs[:, ids.shape[1]:])))
    return all(same), f"{label}: token-identical in {sum(same)}/{len(same)} settings (gen, block, steps) {SETTINGS}"


def check_llada_padded(policy, reference):
    """A left-padded batch: dlmrl's canvas of the short prompt equals its canvas alone; LLaDA's batched
    ``generate`` (which passes the mask to the model) is recorded."""
    from dlmrl.models.sampler import generate

    tok = policy.tokenizer
    both = tok(["12+3=", "1234+56="], add_special_tokens=False, padding=True, return_tensors="pt")
    alone = tok(["12+3="], add_special_tokens=False, return_tensors="pt")["input_ids"]
    kw = {"gen_length": 16, "block_length": 8, "steps": 8}
    ours_b = generate(policy, both["input_ids"], both["attention_mask"].bool(), **kw).canvas[0]
    ours_a = generate(policy, alone, torch.ones_like(alone, dtype=torch.bool), **kw).canvas[0]
    ref_b = reference(policy.model, both["input_ids"], attention_mask=both["attention_mask"], temperature=0.0,
                      mask_id=policy.mask_token_id, **kw)[0, both["input_ids"].shape[1]:]
    ref_a = reference(policy.model, alone, temperature=0.0, mask_id=policy.mask_token_id, **kw)[0, alone.shape[1]:]
    return bool(torch.equal(ours_b, ours_a)), (
        f"dlmrl batched = alone: {bool(torch.equal(ours_b, ours_a))}; dlmrl alone = reference alone: "
        f"{bool(torch.equal(ours_a, ref_a))}; reference batched = reference alone: {bool(torch.equal(ref_b, ref_a))}")


def check_llada_threshold(policy, fast_generate, threshold: float = 0.5):
    from dlmrl.models.sampler import generate

    ids = policy.tokenizer(["12+3="], add_special_tokens=False, return_tensors="pt")["input_ids"]
    rows = []
    for gen, block, steps in [(16, 16, 16), (16, 8, 8)]:
        ours = generate(policy, ids, torch.ones_like(ids, dtype=torch.bool), gen_length=gen, block_length=block,
                        steps=steps, threshold=threshold)
        x, nfe = fast_generate(policy.model, ids, steps=steps, gen_length=gen, block_length=block, temperature=0.0,
                               remasking="low_confidence", mask_id=policy.mask_token_id, threshold=threshold)
        rows.append((bool(torch.equal(ours.canvas, x[:, ids.shape[1]:])), ours.nfe, int(nfe)))
    ok = all(r[0] for r in rows) and any(r[1] < 16 for r in rows)
    return ok, (f"threshold {threshold}: token-identical {sum(r[0] for r in rows)}/{len(rows)}; NFE dlmrl/Fast-dLLM "
                f"{[(r[1], r[2]) for r in rows]} for 16 tokens")


def check_dream_greedy(policy):
    """dlmrl (``steps = gen_length``, one block) against Dream's ``diffusion_generate`` (maskgit_plus, greedy)."""
    import contextlib
    import copy
    import io

    from dlmrl.models.sampler import generate

    ids = policy.tokenizer(["12+3=", "45+6="], add_special_tokens=False, return_tensors="pt")["input_ids"]
    same = []
    for gen in (8, 16):
        ours = generate(policy, ids, torch.ones_like(ids, dtype=torch.bool), gen_length=gen, block_length=gen,
                        steps=gen).canvas
        with contextlib.redirect_stdout(io.StringIO()):  # (Fast-dLLM's copy prints its step count and time)
            out = policy.model.diffusion_generate(
                ids, generation_config=copy.deepcopy(policy.model.generation_config), max_new_tokens=gen, steps=gen,
                eps=-1e-3, alg="maskgit_plus", temperature=0.0, output_history=False, return_dict_in_generate=False)
        out = out.sequences if hasattr(out, "sequences") else out
        same.append(bool(torch.equal(ours, out[:, ids.shape[1]:])))
    return all(same), f"diffusion_generate(alg=maskgit_plus, eps=-1e-3): token-identical {sum(same)}/{len(same)} (gen 8, 16)"


def dream_generate_as_documented(policy):
    """Dream's README call, ``diffusion_generate(ids, max_new_tokens=..., steps=...)`` with no generation config
    (dlmrl never calls it; recorded)."""
    import contextlib
    import io

    ids = policy.tokenizer(["12+3="], add_special_tokens=False, return_tensors="pt")["input_ids"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            policy.model.diffusion_generate(ids, max_new_tokens=4, steps=4)
    except Exception as e:  # noqa: BLE001 (recorded)
        return None, f"fails: {type(e).__name__}: {e} (pass generation_config=model.generation_config)"
    return None, "runs"


def check_threshold_runs(policy):
    from dlmrl.models.sampler import generate

    ids = policy.tokenizer(["12+3="], add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = generate(policy, ids, torch.ones_like(ids, dtype=torch.bool), gen_length=16, block_length=8, steps=8,
                   threshold=0.5)
    ok = not bool((out.canvas == policy.mask_token_id).any())
    return ok, f"decoded 16 tokens in {out.nfe} passes (no reference: Fast-dLLM's Dream rule differs)"


# -------------------------------------------------------------------------------------------------- main


def check_family(report: Report, source, clones: list[Path], work: Path, env: dict, skip_train: bool) -> dict:
    from remote_code_checkpoints import MASK_IDS, build_checkpoint, find_function

    from dlmrl.models.loading import load_policy
    from tests.models.checkpoints import save_dream_like, save_llada_like

    family = source.family
    ckpt = build_checkpoint(source, work / f"{family}_tiny")
    report.add(family, "code", None, f"{source.folder.relative_to(source.clone.parent)} @ {source.commit[:12]}")
    report.run(family, "load without dlmrl (transformers' AutoModel)", lambda: unpatched_load(ckpt, env))
    report.run(family, "load (auto_map + trust_remote_code)", lambda: check_load(family, ckpt, MASK_IDS[family]))
    report.run(family, "refused without trust_remote_code", lambda: check_refused(ckpt))
    report.run(family, "loaded = built by hand from the same weights", lambda: check_as_built(family, ckpt))
    policy = load_policy(str(ckpt), trust_remote_code=True)
    stand_in_path = (save_llada_like if family == "llada" else save_dream_like)(work / f"{family}_stand_in")
    stand_in = load_policy(str(stand_in_path), trust_remote_code=True)
    facts = {"real": conventions(family, policy), "stand_in": conventions(family, stand_in)}
    compare_conventions(report, family, facts["real"], facts["stand_in"])
    n_layers = int(policy.model.config.n_layers if family == "llada" else policy.model.config.num_hidden_layers)
    report.run(family, "gradient checkpointing", lambda: check_gradient_checkpointing(family, ckpt))
    report.run(family, "bfloat16", lambda: check_bf16(ckpt))
    with torch.no_grad():
        if family == "llada":
            ref = find_function(clones, "generate.py", "generate", "attention_mask")
            fast = find_function(clones, "generate.py", "generate", "threshold")
            if ref is not None:
                reference = load_function(ref[0], "generate")
                where = f"{ref[0].relative_to(ref[0].parents[1])} @ {ref[1][:12]}"
                report.run(family, "greedy = LLaDA generate()", lambda: check_llada_greedy(policy, reference, where))
                report.run(family, "left padding", lambda: check_llada_padded(policy, reference))
            if fast is not None:
                fast_generate = load_function(fast[0], "generate")
                where = f"{fast[0].relative_to(fast[0].parents[2])} @ {fast[1][:12]}"
                report.run(family, "greedy = Fast-dLLM generate()",
                           lambda: check_llada_greedy(policy, lambda *a, **k: fast_generate(*a, **k)[0], where, 1))
                report.run(family, "threshold decoding = Fast-dLLM", lambda: check_llada_threshold(policy, fast_generate))
        else:
            report.run(family, "Dream diffusion_generate() without generation_config",
                       lambda: dream_generate_as_documented(policy))
            report.run(family, "greedy = Dream diffusion_generate()", lambda: check_dream_greedy(policy))
            report.run(family, "threshold decoding", lambda: check_threshold_runs(policy))
    if not skip_train:
        for algorithm in ("gdpo", "diffu_grpo"):
            config = write_run_config(family, algorithm, ckpt, work)
            if algorithm == "gdpo":
                report.run(family, "dlmrl train --dry-run", lambda c=config: check_dry_run(c, env))
            report.run(family, f"train 2 steps: {algorithm}", lambda c=config: check_train(c, env, n_layers))
        report.run(family, "dlmrl eval (saved adapter)", lambda: check_eval(work / f"{family}_gdpo.yaml", env))
    return facts


def markdown(report: Report) -> str:
    lines = ["| family | check | result | detail |", "|---|---|---|---|"]
    lines += [f"| {r['family']} | {r['check']} | {r['status']} | {r['detail'].replace('|', '/')} |" for r in report.rows]
    return "\n".join(lines)


def prepare_work(work: Path | None, prefix: str) -> tuple[Path, dict]:
    """The folder for checkpoints and runs (a new temp dir when ``work`` is None) holding the reward module, with
    ``HF_MODULES_CACHE`` pointed inside it (call before ``transformers`` is imported), and the environment for the
    CLI runs (the folder and dlmrl on ``PYTHONPATH``)."""
    work = (work or Path(tempfile.mkdtemp(prefix=prefix))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    (work / "remote_code_rewards.py").write_text(REWARD_MODULE)
    os.environ["HF_MODULES_CACHE"] = str(work / "hf_modules")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return work, env


def write_report(report: Report, work: Path, out: Path, record: dict) -> int:
    """Print the report as a table and write ``record`` (with the rows and the table) to ``out`` as JSON, paths inside
    ``work`` written as ``<work>/...``; the exit status: 1 if any check failed."""
    for row in report.rows:
        row["detail"] = row["detail"].replace(str(work), "<work>")
    table = markdown(report)
    print("\n" + table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**record, "rows": report.rows, "table": table}, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return int(any(r["status"] == "FAIL" for r in report.rows))


def parity_parser(doc: str, results: Path, clones_help: str) -> argparse.ArgumentParser:
    """The arguments every parity script takes: the clones, ``--work``, ``--out``, ``--skip-train``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("clones", nargs="+", type=Path, help=clones_help)
    parser.add_argument("--work", type=Path, default=None, help="folder for checkpoints and runs (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=results)
    parser.add_argument("--skip-train", action="store_true", help="no CLI runs (dry-run, train, eval)")
    return parser


def block_family_main(argv, doc: str, family: str, results: Path, clones_help: str, check_family, setup=None) -> int:
    """``main`` of a block family's parity script (``sdar_parity.py``, ``llada2_parity.py``): for each clone holding
    the family's code, ``check_family(report, label, source, work, env, skip_train, **kwargs)``; ``setup(clones)``
    returns those ``kwargs`` and extra fields for the JSON record."""
    parser = parity_parser(doc, results, clones_help)
    args = parser.parse_args(argv)
    work, env = prepare_work(args.work, f"{family}_parity_")
    import transformers
    from remote_code_checkpoints import CODE_FILES, clone_commit, find_code

    clones = [c.resolve() for c in args.clones]
    kwargs, extra = setup(clones) if setup is not None else ({}, {})
    report, t0, code = Report(), time.time(), {}
    for clone in clones:
        source = find_code([clone], (family,)).get(family)
        if source is None:
            continue
        label = f"{clone.name}@{source.commit[:7]}"
        code[label] = str(source.folder.relative_to(source.clone.parent))
        check_family(report, label, source, work, env, args.skip_train, **kwargs)
    if not code:
        parser.error(f"no {' + '.join(CODE_FILES[family][:2])} under {clones}")
    record = {"transformers": transformers.__version__, "torch": torch.__version__,
              "clones": [{"name": c.name, "commit": clone_commit(c)} for c in clones], "code": code, **extra,
              "seconds": round(time.time() - t0)}
    return write_report(report, work, args.out, record)


def main(argv: list[str] | None = None) -> int:
    parser = parity_parser(__doc__, RESULTS, "local clones (Fast-dLLM, ML-GSAI/LLaDA, a hub clone)")
    parser.add_argument("--only", choices=["llada", "dream"], default=None, help="check one family")
    args = parser.parse_args(argv)
    work, env = prepare_work(args.work, "remote_code_check_")  # (before transformers is imported)
    sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
    import transformers
    from remote_code_checkpoints import clone_commit, find_code

    clones = [c.resolve() for c in args.clones]
    sources = find_code(clones)
    if not sources:
        parser.error(f"no modeling_llada.py / modeling_dream.py (with their configuration_*.py) under {clones}")
    report, facts, t0 = Report(), {}, time.time()
    for source in sources.values():
        if args.only not in (None, source.family):
            continue
        facts[source.family] = check_family(report, source, clones, work, env, args.skip_train)
    record = {
        "transformers": transformers.__version__, "torch": torch.__version__,
        "clones": [{"name": c.name, "commit": clone_commit(c)} for c in clones],
        "code": {s.family: f"{s.folder.relative_to(s.clone.parent)} @ {s.commit}" for s in sources.values()},
        "seconds": round(time.time() - t0), "conventions": facts,
    }
    return write_report(report, work, args.out, record)


if __name__ == "__main__":
    sys.exit(main())
