"""dlmrl on SDAR's and TraDo's own published model code, on tiny random checkpoints built from local clones.

    git clone https://github.com/JetAstra/SDAR           # training/model/SDAR-4B-Chat/: the code; generate.py
    git clone https://github.com/Gen-Verse/dLLM-RL       # models/sdar/: TraDo's copy of the code
    pip install triton                                   # (JetAstra's copy imports it for its fused SFT loss)
    python benchmarks/sdar_parity.py SDAR dLLM-RL [--work DIR] [--skip-train]

For each clone holding ``configuration_sdar.py`` + ``modeling_sdar.py``, ``remote_code_checkpoints.build_checkpoint``
writes a tiny random checkpoint (2 layers, width 64, SDAR-4B-Chat's config otherwise: vocabulary 151,936, mask id
151,669, block size 4) whose code is the clone's files. Then, with dlmrl and the installed ``transformers``:

- ``load``: ``load_block_policy(path, trust_remote_code=True)`` detects the ``sdar`` family and reads the mask id
  and block size from ``config.json``; refused without ``trust_remote_code``;
- ``forward``: dlmrl's block-causal pass (the prompt cut into blocks) against one pass of the code under the mask
  SDAR's ``generate.py`` builds (blocks aligned to position 0; prompts a multiple of the block size);
- ``greedy``: dlmrl's exact-cache sampler (``temperature 0``, ``left_to_right``) token for token against SDAR's own
  ``block_diffusion_generate`` (``remasking_strategy="sequential"``, ``top_k=1``: the argmax, revealed left to right),
  for several block sizes and steps per block. SDAR's low-confidence strategies are not comparable greedily: with
  ``top_k=1`` the confidence is the probability after top-k filtering, 1.0 at every position, so the choice among
  ties is the kernel's. A prompt whose length is not a multiple of the block size is reported as INFO: SDAR's sampler
  then completes the prompt's last block with the first generated tokens, dlmrl starts the completion on a block
  (TraceRL's training layout);
- ``likelihood``: the block trajectory likelihood dlmrl trains with (one composite pass per step index) against the
  same trajectory replayed through the code's own forward, one uncached pass per step under SDAR's mask;
- ``cache``: dlmrl's cached and uncached rollouts on a left-padded batch (sampled, threshold decoding);
- ``train`` (unless ``--skip-train``): ``dlmrl train --dry-run`` and 2 steps each of ``tracerl`` and ``gdpo`` on the
  block kind with LoRA and gradient checkpointing, 2 steps of ``tracerl`` training every weight (the recipe's
  setting), and ``dlmrl eval`` of the saved adapter and of the saved full model (its folder must hold the code).

Prints a table (PASS, FAIL, or INFO) and writes ``benchmarks/results/sdar_parity.json``. Exit status 1 if any check
fails. CPU, a few minutes.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "sdar_parity.json"
PROMPT_TEXTS = ["12+7=34+", "3*4=9-5=", "8+8=16-2", "5*5=25+1"]  # 8 characters: 2 blocks of 4, 1 of 8
#: (gen_length, block_size, steps per block) for the greedy comparison
GREEDY = [(16, 4, 4), (16, 4, 2), (16, 2, 2), (16, 8, 8), (16, 8, 4), (12, 4, 4)]


class ReferenceModel(torch.nn.Module):
    """The checkpoint's model as SDAR's ``generate.py`` calls it, with the head axis added to its 3-D mask (TraDo's
    copy of ``modeling_sdar.py`` indexes a 4-D one; JetAstra's takes either)."""

    def __init__(self, model):
        super().__init__()
        self.inner = model

    @property
    def device(self):
        return next(self.inner.parameters()).device

    def forward(self, input_ids, attention_mask=None, **kwargs):
        if attention_mask is not None and attention_mask.dim() == 3:
            attention_mask = attention_mask[:, None]
        return self.inner(input_ids, attention_mask=attention_mask, **kwargs)


def sdar_mask(total: int, block_size: int) -> torch.Tensor:
    """``(1, 1, total, total)`` bool: SDAR ``generate.py``'s block mask (blocks aligned to position 0)."""
    blocks = -(-total // block_size)
    m = torch.tril(torch.ones(blocks, blocks)).repeat_interleave(block_size, 0).repeat_interleave(block_size, 1)
    return m[:total, :total].bool()[None, None]


def load(path: Path, block_size: int | None = None):
    from dlmrl.models.loading import load_block_policy

    return load_block_policy(str(path), block_size=block_size, trust_remote_code=True)


def check_load(path: Path):
    policy = load(path)
    ok = (policy.family == "sdar" and policy.mask_token_id == 151669 and policy.block_size == 4
          and policy.prompt_blocks)
    return ok, (f"family {policy.family}, mask id {policy.mask_token_id}, block size {policy.block_size} (config.json), "
                f"prompt cut into blocks {policy.prompt_blocks}, {type(policy.model).__name__}")


def prompt_batch(policy, texts):
    ids = policy.tokenizer(texts, add_special_tokens=False, return_tensors="pt", padding=True)
    return ids["input_ids"], ids["attention_mask"].bool()


def check_forward(path: Path, block_size: int | None = None, reference_mask=None):
    """dlmrl's block-causal logits against one pass of the code under ``reference_mask(total, 4)`` (default SDAR's
    boolean :func:`sdar_mask`), blocks of 4."""
    reference_mask = reference_mask or sdar_mask
    policy = load(path, block_size)
    ids, pm = prompt_batch(policy, PROMPT_TEXTS[:2])
    g = torch.Generator().manual_seed(0)
    canvas = torch.randint(0, 96, (2, 8), generator=g)
    canvas[:, 5:] = policy.mask_token_id  # (a partly masked last block)
    with torch.no_grad():
        ours = policy.completion_logits(ids, pm, canvas)
        seq = torch.cat([ids, canvas], 1)
        t = seq.shape[1]
        theirs = policy.model(seq, attention_mask=reference_mask(t, 4).expand(2, 1, t, t),
                              position_ids=torch.arange(t)[None].expand(2, t)).logits[:, ids.shape[1]:].float()
    gap = float((ours - theirs).abs().max())
    return gap <= 1e-4, f"max |logit gap| {gap:.1e} over {tuple(ours.shape)} (float32)"


def compare_greedy(path: Path, gen_length: int, block_size: int, steps: int, prompt_len: int, reference,
                   remasking: str, misaligned: str | None):
    """dlmrl's greedy exact-cache rollout of the 4 prompts (cut to ``prompt_len``) against ``reference(policy,
    prompt (1, P)) -> (n,)`` long, the code's own sampler's completion (its first ``n`` tokens are compared); INFO
    with ``misaligned`` (the reason) when the layouts are known to differ."""
    policy = load(path, block_size)
    policy.model.eval()
    texts = [t[:prompt_len] for t in PROMPT_TEXTS]
    ids, pm = prompt_batch(policy, texts)
    blocks = -(-gen_length // block_size)
    with torch.no_grad():
        ours = policy.sample_blocks(ids, pm, gen_length=gen_length, steps=steps * blocks, temperature=0.0,
                                    remasking=remasking)
    same, first_diff = 0, []
    for row in range(ids.shape[0]):
        with torch.no_grad():
            theirs = reference(policy, ids[row : row + 1])
        mine = ours.canvas[row, : len(theirs)]
        if torch.equal(theirs, mine):
            same += 1
        else:
            first_diff.append(int((theirs != mine).nonzero()[0, 0]))
    detail = (f"gen {gen_length}, block {block_size}, {steps} steps/block, prompt {prompt_len}: {same}/{ids.shape[0]} "
              f"rows token-identical" + (f" (first difference at {first_diff})" if first_diff else ""))
    if misaligned is not None:
        return None, f"{detail} ({misaligned})"
    return same == ids.shape[0], detail


def check_greedy(path: Path, generate_fn, gen_length: int, block_size: int, steps: int, prompt_len: int = 8):
    def reference(policy, prompt):
        ref = generate_fn(ReferenceModel(policy.model).eval(), {"input_ids": prompt}, policy.mask_token_id,
                          gen_length=gen_length, block_length=block_size, denoising_steps=steps, temperature=1.0,
                          top_k=1, top_p=1.0, remasking_strategy="sequential")
        return ref[0, prompt_len : prompt_len + gen_length]

    misaligned = (None if prompt_len % block_size == 0
                  else "prompt not a multiple of the block size: the layouts differ, see the docstring")
    return compare_greedy(path, gen_length, block_size, steps, prompt_len, reference, "left_to_right", misaligned)


def reference_trajectory_logprobs(model, ids: torch.Tensor, canvas: torch.Tensor, reveal_step: torch.Tensor,
                                  block_size: int, mask_id: int) -> torch.Tensor:
    """``(L,)`` log-probs of one row's revealed tokens replayed through the code's own forward: for each block and
    each of its steps, one uncached pass over ``[prompt | clean earlier blocks | the block as it was]`` under SDAR's
    mask; ``log_softmax`` with the mask token excluded (dlmrl's sampler's convention)."""
    p, length = ids.shape[1], canvas.shape[0]
    out = torch.zeros(length)
    for lo in range(0, length, block_size):
        hi = min(lo + block_size, length)
        steps = reveal_step[lo:hi]
        for s in steps.unique().tolist():
            block = canvas[lo:hi].masked_fill(steps >= s, mask_id)
            seq = torch.cat([ids[0], canvas[:lo], block])[None]
            t = seq.shape[1]
            logits = model(seq, attention_mask=sdar_mask(t, block_size), position_ids=torch.arange(t)[None]).logits
            logits = logits[0, p + lo :].double()
            logits[:, mask_id] = -math.inf
            logp = torch.log_softmax(logits, -1).gather(-1, canvas[lo:hi, None]).squeeze(-1)
            now = steps == s
            out[lo:hi][now] = logp[now].float()
    return out


def check_likelihood(path: Path, temperature: float, block_size: int | None = None):
    from dlmrl.estimators import score
    from dlmrl.estimators.block_plans import block_trajectory_plan

    policy = load(path, block_size)
    policy.model.eval()
    ids, pm = prompt_batch(policy, PROMPT_TEXTS[:2])
    with torch.no_grad():
        out = policy.sample_blocks(ids, pm, gen_length=12, steps=12, temperature=temperature,
                                   generator=torch.Generator().manual_seed(1))
        mask = torch.ones_like(out.canvas, dtype=torch.bool)
        plan = block_trajectory_plan(mask, out.reveal_step, policy.block_size, 1,
                                     temperature=temperature if temperature > 0 else 1.0)
        ours = score(policy, ids, pm, out.canvas, mask, plan)
        ref = torch.stack([reference_trajectory_logprobs(policy.model, ids[r : r + 1], out.canvas[r],
                                                         out.reveal_step[r], policy.block_size, policy.mask_token_id)
                           for r in range(2)])
    if temperature > 0:  # (dlmrl scores a sampled token at the sampling temperature; the reference replay at T = 1)
        gap_sampler = float((ours.per_token - out.token_logprobs).abs().max())
        return gap_sampler <= 1e-4, (f"T {temperature}: trajectory score vs the sampler's token_logprobs, max gap "
                                     f"{gap_sampler:.1e}; {ours.nfe} composite passes for 12 tokens in 3 blocks")
    gap = float((ours.per_token - ref).abs().max())
    gap_sampler = float((ours.per_token - out.token_logprobs).abs().max())
    return gap <= 1e-4 and gap_sampler <= 1e-4, (f"greedy: max |log-prob gap| {gap:.1e} vs the code's own forward replayed step by step "
                    f"({int(out.reveal_step.max()) + 1} steps), {gap_sampler:.1e} vs the sampler's token_logprobs; "
                    f"{ours.nfe} composite passes instead of {3 * 4} uncached ones")


def check_cache(path: Path, block_size: int | None = None):
    policy = load(path, block_size)
    policy.model.eval()
    ids, pm = prompt_batch(policy, ["12+7=", "3*4=9-5=", "8+"])  # (left padding of 3, 0 and 6)
    kw = {"gen_length": 12, "steps": 12, "temperature": 1.0, "threshold": 0.3}
    with torch.no_grad():
        a = policy.sample_blocks(ids, pm, generator=torch.Generator().manual_seed(2), **kw)
        b = policy.sample_blocks(ids, pm, generator=torch.Generator().manual_seed(2), cache=False, **kw)
    gap = float((a.token_logprobs - b.token_logprobs).abs().max())
    ok = torch.equal(a.canvas, b.canvas) and torch.equal(a.reveal_step, b.reveal_step) and gap <= 1e-4
    return ok, (f"left-padded batch, sampled, threshold 0.3: tokens {'equal' if torch.equal(a.canvas, b.canvas) else 'DIFFER'}"
                f", log-prob gap {gap:.1e}; {a.nfe} passes over the block + {a.cache_passes} cache passes")


def write_run_config(algorithm: str, ckpt: Path, work: Path, lora: bool = True,
                     targets: str = "q_proj,k_proj,v_proj", block_size: int | None = None) -> Path:
    """A 2-step ``algorithm`` run on ``ckpt`` (block kind, LoRA on ``targets`` or every weight, gradient
    checkpointing) with a 4-prompt dataset task; the run folder is named after the checkpoint's folder (one per code
    copy)."""
    from remote_code_check import write_tiny_run

    estimator = ({"name": "trajectory", "order": "sampled", "merge": 1} if algorithm == "tracerl"
                 else {"name": "sdmc", "num_nodes": 2})
    model = {"kind": "block", "name_or_path": str(ckpt), "trust_remote_code": True, "dtype": "float32",
             "use_peft": lora, "lora_r": 8, "lora_alpha": 4, "lora_target_modules": targets,
             "gradient_checkpointing": True, **({} if block_size is None else {"block_size": block_size})}
    return write_tiny_run(work, f"{ckpt.name}_{algorithm}{'' if lora else '_full'}", PROMPT_TEXTS, model,
                          {"gen_length": 8, "steps": 8, "temperature": 1.0}, estimator, {"algorithm": algorithm},
                          eval_steps=8)


def check_train_block(config: Path, env: dict):
    import yaml
    from remote_code_check import run_cli
    from safetensors.torch import load_file

    settings = yaml.safe_load(config.read_text())
    run, lora = Path(settings["output_dir"]), settings["model"]["use_peft"]
    t0 = time.time()
    out = run_cli(["train", "--config", str(config), "--no-progress"], env)
    if out.returncode != 0:
        return False, f"rc {out.returncode}: {out.stderr.strip()[-300:]}"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    losses = [s.get("loss") for s in steps]
    finite = all(v is None or math.isfinite(v) for v in losses) and any(v is not None for v in losses)
    grads = [s.get("grad_norm") for s in steps if s.get("grad_norm") is not None]
    if lora:
        adapter = load_file(str(run / "final_model" / "adapter_model.safetensors"))
        lora_b = [v for k, v in adapter.items() if "lora_B" in k]
        moved = sum(int(v.abs().max() > 0) for v in lora_b)
        changed, what = moved > 0, f"{moved}/{len(lora_b)} lora_B moved from 0"
    else:  # every weight trained: the saved folder holds the code and weights that differ from the start
        final, start = run / "final_model", load_file(str(config.parent / Path(settings["model"]["name_or_path"]).name
                                                          / "model.safetensors"))
        saved = load_file(str(final / "model.safetensors"))
        moved = sum(int(not torch.equal(saved[k], start[k])) for k in start if k in saved)
        code = sorted(p.name for p in final.glob("*.py"))
        changed = moved > 0 and any(name.startswith("modeling_") for name in code)
        what = f"{moved}/{len(start)} tensors changed, code {code}"
    return len(steps) == 2 and finite and changed, (
        f"{len(steps)} steps in {time.time() - t0:.0f}s ({'LoRA' if lora else 'every weight'}), loss "
        f"{[v if v is None else round(v, 5) for v in losses]} (0 at the first inner step: ratio 1, advantages of mean "
        f"0), grad norm {[round(g, 4) for g in grads]}, {what}")


def check_full_eval(config: Path, env: dict):
    """``dlmrl eval`` of a fully trained run's ``final_model`` (the checkpoint's code and the trained weights)."""
    from remote_code_check import check_eval

    ok, detail = check_eval(config, env)
    return ok, detail.replace("adapter reloaded onto the base", "the saved model (its own code, trained weights) reloaded")


def check_family(report, label: str, source, work: Path, env: dict, skip_train: bool, generate_fn=None) -> None:
    from remote_code_check import check_dry_run, check_eval, check_refused
    from remote_code_checkpoints import build_checkpoint

    from dlmrl.models.loading import load_block_policy

    ckpt = build_checkpoint(source, work / f"sdar_{source.clone.name}")
    report.run(label, "load", lambda: check_load(ckpt))
    report.run(label, "refused without trust_remote_code", lambda: check_refused(ckpt, load_block_policy))
    report.run(label, "forward (block-causal logits)", lambda: check_forward(ckpt))
    if generate_fn is None:
        report.add(label, "greedy vs generate.py", None, "no generate.py with block_diffusion_generate in the clones")
    else:
        for gen, block, steps in GREEDY:
            report.run(label, "greedy vs generate.py", lambda g=gen, b=block, s=steps: check_greedy(ckpt, generate_fn, g,
                                                                                                   b, s))
        report.run(label, "greedy vs generate.py", lambda: check_greedy(ckpt, generate_fn, 16, 4, 4, prompt_len=6))
    report.run(label, "trajectory likelihood", lambda: check_likelihood(ckpt, 0.0))
    report.run(label, "trajectory likelihood", lambda: check_likelihood(ckpt, 1.0))
    report.run(label, "exact cache", lambda: check_cache(ckpt))
    if skip_train:
        return
    for algorithm in ("tracerl", "gdpo"):
        config = write_run_config(algorithm, ckpt, work)
        report.run(label, f"dlmrl train --dry-run ({algorithm})", lambda c=config: check_dry_run(c, env))
        report.run(label, f"dlmrl train, 2 steps ({algorithm}, LoRA)", lambda c=config: check_train_block(c, env))
    report.run(label, "dlmrl eval (LoRA adapter)", lambda c=config: check_eval(c, env))
    config = write_run_config("tracerl", ckpt, work, lora=False)
    report.run(label, "dlmrl train, 2 steps (tracerl, every weight)", lambda c=config: check_train_block(c, env))
    report.run(label, "dlmrl eval (fully trained model)", lambda c=config: check_full_eval(c, env))


def find_generate(clones: list[Path]) -> tuple[dict, dict]:
    """``check_family``'s ``generate_fn`` (SDAR's ``block_diffusion_generate`` from the first ``generate.py`` in the
    clones that defines it) and the record's ``generate`` field."""
    from remote_code_check import load_function
    from remote_code_checkpoints import find_function

    found = find_function(clones, "generate.py", "block_diffusion_generate", "denoising_steps")
    generate_fn = load_function(found[0], "block_diffusion_generate") if found else None
    return ({"generate_fn": generate_fn},
            {"generate": None if found is None else f"{found[0].parent.name}/{found[0].name} @ {found[1]}"})


def main(argv: list[str] | None = None) -> int:
    sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
    from remote_code_check import block_family_main

    return block_family_main(argv, __doc__, "sdar", RESULTS, "local clones (JetAstra/SDAR, Gen-Verse/dLLM-RL, a hub clone)",
                             check_family, setup=find_generate)


if __name__ == "__main__":
    sys.exit(main())
