"""dlmrl on Fast-dLLM v2's own published model code (the checkpoints' ``modeling.py``), on a tiny random checkpoint
built from a local copy of it.

    GIT_LFS_SKIP_SMUDGE=1 git clone https://huggingface.co/Efficient-Large-Model/Fast_dLLM_v2_7B  # the hub's files
    git clone https://github.com/NVlabs/Fast-dLLM        # v2/generation_functions.py: the batched sampler
    python benchmarks/fast_dllm_v2_parity.py Fast_dLLM_v2_7B Fast-dLLM [--work DIR] [--skip-train]

Any folder holding ``configuration.py`` + a ``modeling.py`` that defines ``Fast_dLLM_QwenForCausalLM`` is a copy of
the model code (a hub clone, or a repository that ships the hub's files, e.g. Satgoy152/DualDiffusion's
``FastDLLM-inferencing/Fast_dLLM_v2_7B``); a ``v2/generation_functions.py`` defining ``batch_sample`` (NVlabs'
batched sampler) is used as a second reference. For each model-code copy a tiny random checkpoint is written (2
layers, width 64, 4 query heads over 2 key/value heads; the copy's own ``config.json`` otherwise: Qwen2.5's vocabulary
of 152,064, ``bd_size`` 32), whose code is the copy's files and whose character-level tokenizer carries
``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` and ``|<MASK>|`` at their real ids, ``|<MASK>|`` as an additional
special token (not ``mask_token``), as the release's. Then, with dlmrl and the installed ``transformers``:

- ``load``: ``load_block_policy(path, trust_remote_code=True)`` detects ``fast_dllm_v2``, finds the mask id 151665
  (``|<MASK>|`` in the vocabulary), the block size 32 from ``bd_size``, the prompt cut into blocks, logit shift 1;
  refused without ``trust_remote_code``;
- ``forward``: dlmrl's shifted block-causal logits against one pass of the code's own ``forward`` (its own
  ``eval_mask``, ``block_size=``) shifted as its ``generate`` shifts them (prompts a multiple of the block size);
- ``greedy vs generate``: dlmrl's exact-cache sampler (``temperature 0``, one token per step with the per-block
  schedule, or threshold decoding; the policy's ``sub_block_size`` set to ``generate``'s ``small_block_size``) token
  for token against the code's own ``Fast_dLLM_QwenForCausalLM.generate`` (``temperature=0``, ``threshold=1``: the
  most confident token per step, or the same threshold), several block and sub-block sizes (the release's blocks of 32
  in sub-blocks of 8 among them), prompts a multiple of the block size and longer than one (``generate`` prefills
  only prompts longer than a block). ``generate`` returns the completion up to its first stop token: that prefix is
  compared. A prompt that is not a multiple of the block size is INFO (the layouts differ, see
  :mod:`dlmrl.models.fast_dllm_v2`);
- ``greedy vs batch_sample``: the same against NVlabs' ``v2/generation_functions.py`` ``batch_sample`` bound to the
  model, when a copy is given;
- ``likelihood``: the block trajectory likelihood (one composite pass per step index, logits shifted) against the
  trajectory replayed through the code's own forward, one uncached pass per step, the prediction of position ``i``
  taken from the output at ``i − 1`` (greedy), and against the sampler's own ``token_logprobs`` (sampled);
- ``cache``: cached and uncached rollouts on a left-padded batch (sampled, threshold decoding);
- ``train`` (unless ``--skip-train``): ``dlmrl train --dry-run`` and 2 steps each of ``tracerl`` and ``gdpo`` with
  LoRA on ``q_proj,k_proj,v_proj`` and gradient checkpointing, 2 steps of ``tracerl`` training every weight, and
  ``dlmrl eval`` of the adapter and of the saved full model (its folder must hold the code).

Prints a table (PASS, FAIL, or INFO) and writes ``benchmarks/results/fast_dllm_v2_parity.json``. Exit status 1 if
any check fails. CPU, a few minutes.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "fast_dllm_v2_parity.json"
PROMPT_TEXTS = ["12+7=34+5*6=30-1", "3*4=9-5=8+8=16-2", "8+8=16-2=14+1=15", "5*5=25+1=26*2=52"]  # 16 characters
#: (gen_length, block_size, sub-block size or None, threshold or None, prompt length) for the greedy comparison (one
#: token per step without a threshold); the last two: the release's blocks of 32 in sub-blocks of 8
GREEDY = [(16, 4, None, None, 16), (16, 8, None, None, 16), (16, 2, None, None, 16), (12, 4, None, None, 16),
          (16, 4, None, 0.3, 16), (16, 8, None, 0.5, 16), (16, 8, 4, None, 16), (16, 8, 2, 0.3, 16),
          (64, 32, 8, None, 64), (64, 32, 8, 0.3, 64)]
LORA_TARGETS = "q_proj,k_proj,v_proj"
CODE = ("configuration.py", "modeling.py")
SHRINK = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 2, "max_window_layers": 2, "layer_types": ["full_attention"] * 2}
#: the special tokens of the release's tokenizer (``added_tokens.json``), at their ids
SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "|<MASK>|": 151665}
EOS = 151645
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # (Qwen's ChatML)


# ------------------------------------------------------------------------------------ the copies and the checkpoint


def find_model_code(clone: Path) -> Path | None:
    """The first folder under ``clone`` holding ``configuration.py`` and a ``modeling.py`` defining
    ``Fast_dLLM_QwenForCausalLM`` with a ``generate``."""
    for modeling in sorted(clone.rglob("modeling.py")):
        text = modeling.read_text(errors="replace")
        if "class Fast_dLLM_QwenForCausalLM" in text and "def generate(" in text and (
                modeling.parent / "configuration.py").exists():
            return modeling.parent
    return None


def find_batch_sample(clone: Path) -> Path | None:
    for path in sorted(clone.rglob("generation_functions.py")):
        if "def batch_sample(" in path.read_text(errors="replace"):
            return path
    return None


def save_tokenizer(path: Path) -> None:
    """Character-level ``PreTrainedTokenizerFast`` with :data:`SPECIALS` at their ids (``|<MASK>|`` and
    ``<|im_start|>`` additional special tokens; eos ``<|im_end|>``, pad ``<|endoftext|>``)."""
    from remote_code_checkpoints import _char_vocab
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = _char_vocab()
    vocab = {c: i for i, c in enumerate(chars)} | {"<|unk|>": len(chars)} | SPECIALS
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<|unk|>", padding_side="left",
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["|<MASK>|", "<|im_start|>"])
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)


def build_checkpoint(folder: Path, out: Path) -> Path:
    """The tiny random checkpoint of the model code in ``folder`` (see the module docstring)."""
    from remote_code_checkpoints import _char_vocab, init_weights

    from dlmrl.models.compat import checkpoint_model_class, ensure_default_rope, load_checkpoint_config

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in CODE:
        shutil.copy(folder / name, out / name)
    own = folder / "config.json"
    base = json.loads(own.read_text()) if own.exists() else {
        "architectures": ["Fast_dLLM_QwenForCausalLM"], "model_type": "Fast_dLLM_Qwen", "bd_size": 32,
        "auto_map": {"AutoConfig": "configuration.Fast_dLLM_QwenConfig", "AutoModel": "modeling.Fast_dLLM_QwenModel",
                     "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"},
        "vocab_size": 152064, "rope_theta": 1000000.0, "eos_token_id": EOS, "pad_token_id": EOS,
        "bos_token_id": 151643, "attention_dropout": 0.0, "hidden_act": "silu", "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": None}
    config = {**base, **SHRINK}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_tokenizer(out)
    ensure_default_rope()
    built = load_checkpoint_config(str(out), trust_remote_code=True)
    model = checkpoint_model_class(built, str(out), "AutoModelForCausalLM")(built)
    init_weights(model, len(_char_vocab()), text_gain=2.0)
    model.save_pretrained(out, safe_serialization=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))  # the release's fields, as written
    return out


# ------------------------------------------------------------------------------------ checks


def load(path: Path, block_size: int | None = None):
    from dlmrl.models.loading import load_block_policy

    policy = load_block_policy(str(path), block_size=block_size, trust_remote_code=True)
    policy.model.eval()
    return policy


def prompt_batch(policy, texts):
    enc = policy.tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"].bool()


def check_load(path: Path):
    from dlmrl.models.fast_dllm_v2 import FAST_DLLM_V2_BLOCK_SIZE, FAST_DLLM_V2_MASK_TOKEN_ID

    policy = load(path)
    ok = (policy.family == "fast_dllm_v2" and policy.mask_token_id == FAST_DLLM_V2_MASK_TOKEN_ID
          and policy.tokenizer.mask_token_id is None and policy.block_size == FAST_DLLM_V2_BLOCK_SIZE
          and policy.prompt_blocks and policy.logit_shift == 1)
    return ok, (f"family {policy.family}, mask id {policy.mask_token_id} (|<MASK>| in the vocabulary; the tokenizer's "
                f"mask_token is {policy.tokenizer.mask_token}), block size {policy.block_size} (config.json bd_size), "
                f"prompt cut into blocks {policy.prompt_blocks}, logit shift {policy.logit_shift}, "
                f"{type(policy.model).__name__}")


def code_logits(model, seq: torch.Tensor, block_size: int) -> torch.Tensor:
    """The code's own forward over ``seq (1, T)`` (its own ``eval_mask``, blocks of ``block_size`` from position 0),
    shifted as its ``generate`` shifts a block's logits: ``(T, V)`` float64, row ``i`` = the output at ``i − 1``."""
    out = model(input_ids=seq, block_size=block_size).logits[0].double()
    return torch.cat([out[:1], out[:-1]])


def check_forward(path: Path, block_size: int = 4):
    policy = load(path, block_size)
    ids, pm = prompt_batch(policy, PROMPT_TEXTS)
    length = 12
    canvas = torch.randint(0, 95, (ids.shape[0], length), generator=torch.Generator().manual_seed(0))
    canvas[:, 5:7] = policy.mask_token_id
    canvas[:, 9:] = policy.mask_token_id
    with torch.no_grad():
        ours = policy.completion_logits(ids, pm, canvas).double()
        theirs = torch.stack([code_logits(policy.model, torch.cat([ids[r], canvas[r]])[None], block_size)
                              for r in range(ids.shape[0])])[:, ids.shape[1]:]
    gap = float((ours - theirs).abs().max())
    return gap <= 1e-4, (f"max |logit gap| {gap:.1e} over 4 prompts x {length} positions (block {block_size}), the "
                         "code's forward under its own eval_mask, shifted as its generate shifts")


def greedy_rows(policy, gen_length: int, block_size: int, threshold: float | None, prompt_len: int,
                sub_block: int | None = None):
    import dataclasses

    policy = dataclasses.replace(policy, sub_block_size=sub_block)
    texts = [(t * 4)[:prompt_len] for t in PROMPT_TEXTS]
    ids, pm = prompt_batch(policy, texts)
    blocks = -(-gen_length // block_size)
    with torch.no_grad():
        out = policy.sample_blocks(ids, pm, gen_length=gen_length, steps=block_size * blocks, temperature=0.0,
                                   threshold=threshold)
    return ids, out


def compare(ours: torch.Tensor, references: list[torch.Tensor]) -> tuple[int, list[int]]:
    same, first_diff = 0, []
    for row, theirs in enumerate(references):
        mine = ours[row, : len(theirs)]
        if torch.equal(theirs, mine):
            same += 1
        else:
            first_diff.append(int((theirs != mine).nonzero()[0, 0]))
    return same, first_diff


def check_greedy(path: Path, gen_length: int, block_size: int, sub_block: int | None, threshold: float | None,
                 prompt_len: int = 16):
    policy = load(path, block_size)
    ids, out = greedy_rows(policy, gen_length, block_size, threshold, prompt_len, sub_block)
    refs = []
    for row in range(ids.shape[0]):
        with torch.no_grad():
            full = policy.model.generate(ids[row : row + 1], max_new_tokens=gen_length, block_size=block_size,
                                         small_block_size=sub_block or block_size, threshold=threshold or 1,
                                         temperature=0, mask_id=policy.mask_token_id, stop_token=EOS)
        refs.append(full[0, prompt_len : prompt_len + gen_length])
    same, first_diff = compare(out.canvas, refs)
    detail = (f"gen {gen_length}, block {block_size}, sub-block {sub_block or block_size}, "
              f"{'threshold ' + str(threshold) if threshold else 'one token per step'}, prompt {prompt_len}: "
              f"{same}/{ids.shape[0]} rows token-identical" + (f" (first difference at {first_diff})" if first_diff
                                                                else ""))
    if prompt_len % block_size:
        return None, detail + " (prompt not a multiple of the block size: the layouts differ)"
    if threshold is not None:  # (not vacuous: some step revealed several tokens of a row)
        several = any(len(r.unique()) < len(r) for r in out.reveal_step)
        detail += f"; a step revealed several tokens: {several}"
    return same == ids.shape[0], detail


def check_batch_sample(path: Path, sampler_file: Path, gen_length: int, block_size: int, sub_block: int | None,
                       threshold: float | None):
    """NVlabs' ``batch_sample`` (``v2/generation_functions.py``) bound to the model, on the 4 prompts at once."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fast_dllm_v2_generation_functions", sampler_file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    import transformers.utils as tu

    own = tu.auto_docstring  # (transformers 5's refuses a class it does not know: the import runs it as identity)
    tu.auto_docstring = lambda obj=None, **_: obj if obj is not None else (lambda o: o)
    try:
        spec.loader.exec_module(module)
    finally:
        tu.auto_docstring = own
    policy = load(path, block_size)
    ids, out = greedy_rows(policy, gen_length, block_size, threshold, 16, sub_block)
    sample = types.MethodType(module.Fast_dLLM_QwenForCausalLM.batch_sample, policy.model)
    seq_len = torch.full((ids.shape[0],), ids.shape[1])
    with torch.no_grad():
        done = sample(ids.clone(), policy.tokenizer, block_size, gen_length, sub_block or block_size, ids.shape[1],
                      seq_len,
                      mask_id=policy.mask_token_id, threshold=threshold or 1.0, stop_token=EOS, temperature=0.0)
    refs = []
    for row in range(ids.shape[0]):
        full = done[row][ids.shape[1] : ids.shape[1] + gen_length]
        stops = (full == EOS).nonzero()
        refs.append(full[: int(stops[0, 0]) + 1] if len(stops) else full)
    same, first_diff = compare(out.canvas, refs)
    return same == ids.shape[0], (
        f"gen {gen_length}, block {block_size}, sub-block {sub_block or block_size}, "
        f"{'threshold ' + str(threshold) if threshold else 'one token per step'}"
        f": {same}/{ids.shape[0]} rows token-identical" + (f" (first difference at {first_diff})" if first_diff else ""))


def reference_trajectory_logprobs(model, prompt: torch.Tensor, canvas: torch.Tensor, reveal_step: torch.Tensor,
                                  block_size: int, mask_id: int) -> torch.Tensor:
    """``(L,)`` log-probs of one row's revealed tokens replayed through the code's own forward: per block and per step,
    one uncached pass over ``[prompt | clean earlier blocks | the block as it was]`` (:func:`code_logits`: its own
    mask, the output at ``i − 1`` predicting token ``i``); ``log_softmax`` with the mask token excluded."""
    p, length = prompt.shape[0], canvas.shape[0]
    out = torch.zeros(length, dtype=torch.float64)
    for lo in range(0, length, block_size):
        hi = min(lo + block_size, length)
        steps = reveal_step[lo:hi]
        for s in steps.unique().tolist():
            block = canvas[lo:hi].masked_fill(steps >= s, mask_id)
            logits = code_logits(model, torch.cat([prompt, canvas[:lo], block])[None], block_size)[p + lo :]
            logits[:, mask_id] = -math.inf
            logp = torch.log_softmax(logits, -1).gather(-1, canvas[lo:hi, None]).squeeze(-1)
            out[lo:hi] = torch.where(steps == s, logp, out[lo:hi])
    return out


def check_likelihood(path: Path, temperature: float, block_size: int = 4):
    from dlmrl.estimators import score
    from dlmrl.estimators.block_plans import block_trajectory_plan

    policy = load(path, block_size)
    ids, pm = prompt_batch(policy, PROMPT_TEXTS[:2])
    with torch.no_grad():
        out = policy.sample_blocks(ids, pm, gen_length=12, steps=12, temperature=temperature,
                                   generator=torch.Generator().manual_seed(1))
        mask = torch.ones_like(out.canvas, dtype=torch.bool)
        plan = block_trajectory_plan(mask, out.reveal_step, block_size, 1,
                                     temperature=temperature if temperature > 0 else 1.0)
        ours = score(policy, ids, pm, out.canvas, mask, plan)
        gap_sampler = float((ours.per_token - out.token_logprobs).abs().max())
        if temperature > 0:  # (dlmrl scores a sampled token at the sampling temperature; the replay at T = 1)
            return gap_sampler <= 1e-4, (f"T {temperature}: trajectory score vs the sampler's token_logprobs, max gap "
                                         f"{gap_sampler:.1e}; {ours.nfe} composite passes for 12 tokens in 3 blocks")
        ref = torch.stack([reference_trajectory_logprobs(policy.model, ids[r], out.canvas[r], out.reveal_step[r],
                                                         block_size, policy.mask_token_id) for r in range(2)])
    gap = float((ours.per_token.double() - ref).abs().max())
    return gap <= 1e-4 and gap_sampler <= 1e-4, (
        f"greedy: max |log-prob gap| {gap:.1e} vs the code's own forward replayed step by step "
        f"({int(out.reveal_step.max()) + 1} steps), {gap_sampler:.1e} vs the sampler's token_logprobs; {ours.nfe} "
        f"composite passes instead of {3 * block_size} uncached ones")


def check_cache(path: Path, block_size: int = 4):
    policy = load(path, block_size)
    ids, pm = prompt_batch(policy, ["12+7=", "3*4=9-5=", "8+"])  # (left padding of 3, 0 and 6)
    kw = {"gen_length": 12, "steps": 12, "temperature": 1.0, "threshold": 0.3}
    with torch.no_grad():
        a = policy.sample_blocks(ids, pm, generator=torch.Generator().manual_seed(2), **kw)
        b = policy.sample_blocks(ids, pm, generator=torch.Generator().manual_seed(2), cache=False, **kw)
    gap = float((a.token_logprobs - b.token_logprobs).abs().max())
    ok = torch.equal(a.canvas, b.canvas) and torch.equal(a.reveal_step, b.reveal_step) and gap <= 1e-4
    return ok, (f"left-padded batch, sampled, threshold 0.3: tokens {'equal' if torch.equal(a.canvas, b.canvas) else 'DIFFER'}"
                f", log-prob gap {gap:.1e}; {a.nfe} passes over the block + {a.cache_passes} cache passes")


def check_train(config: Path, env: dict):
    """2 steps of a ``write_run_config`` run: metrics of 2 steps with finite losses; LoRA: some ``lora_B`` moved from
    0; every weight: the saved folder holds the checkpoint's code (``modeling.py``) and changed weights."""
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
    gaps = [s.get("rollout_logp_gap_max") for s in steps]
    if lora:
        adapter = load_file(str(run / "final_model" / "adapter_model.safetensors"))
        lora_b = [v for k, v in adapter.items() if "lora_B" in k]
        moved = sum(int(v.abs().max() > 0) for v in lora_b)
        changed, what = moved > 0, f"{moved}/{len(lora_b)} lora_B moved from 0"
    else:
        final = run / "final_model"
        start = load_file(str(Path(settings["model"]["name_or_path"]) / "model.safetensors"))
        saved = load_file(str(final / "model.safetensors"))
        moved = sum(int(not torch.equal(saved[k], start[k])) for k in start if k in saved)
        code = sorted(p.name for p in final.glob("*.py"))
        changed = moved > 0 and "modeling.py" in code
        what = f"{moved}/{len(start)} tensors changed, code {code}"
    return len(steps) == 2 and finite and changed, (
        f"{len(steps)} steps in {time.time() - t0:.0f}s ({'LoRA' if lora else 'every weight'}), loss "
        f"{[v if v is None else round(v, 5) for v in losses]}, grad norm {[round(g, 4) for g in grads]}, rollout "
        f"log-prob gap {gaps}, {what}")


def check_copy(report, label: str, folder: Path, work: Path, env: dict, skip_train: bool,
               sampler: Path | None) -> None:
    from remote_code_check import check_dry_run, check_eval, check_refused
    from sdar_parity import check_full_eval, write_run_config

    from dlmrl.models.loading import load_block_policy

    ckpt = build_checkpoint(folder, work / "fast_dllm_v2")
    report.run(label, "load", lambda: check_load(ckpt))
    report.run(label, "refused without trust_remote_code", lambda: check_refused(ckpt, load_block_policy))
    report.run(label, "forward (shifted block-causal logits)", lambda: check_forward(ckpt))
    for gen, block, sub, threshold, plen in GREEDY:
        report.run(label, "greedy vs generate",
                   lambda g=gen, b=block, s=sub, t=threshold, n=plen: check_greedy(ckpt, g, b, s, t, n))
    report.run(label, "greedy vs generate", lambda: check_greedy(ckpt, 16, 4, None, None, prompt_len=14))
    if sampler is not None:
        for gen, block, sub, threshold in [(16, 4, None, None), (16, 8, None, 0.5), (16, 8, 4, 0.3)]:
            report.run(label, "greedy vs batch_sample (NVlabs v2/generation_functions.py)",
                       lambda g=gen, b=block, s=sub, t=threshold: check_batch_sample(ckpt, sampler, g, b, s, t))
    report.run(label, "trajectory likelihood", lambda: check_likelihood(ckpt, 0.0))
    report.run(label, "trajectory likelihood", lambda: check_likelihood(ckpt, 1.0))
    report.run(label, "exact cache", lambda: check_cache(ckpt))
    if skip_train:
        return
    for algorithm in ("tracerl", "gdpo"):
        config = write_run_config(algorithm, ckpt, work, targets=LORA_TARGETS, block_size=4)
        report.run(label, f"dlmrl train --dry-run ({algorithm})", lambda c=config: check_dry_run(c, env))
        report.run(label, f"dlmrl train, 2 steps ({algorithm}, LoRA)", lambda c=config: check_train(c, env))
    report.run(label, "dlmrl eval (LoRA adapter)", lambda c=config: check_eval(c, env))
    config = write_run_config("tracerl", ckpt, work, lora=False, block_size=4)
    report.run(label, "dlmrl train, 2 steps (tracerl, every weight)", lambda c=config: check_train(c, env))
    report.run(label, "dlmrl eval (fully trained model)", lambda c=config: check_full_eval(c, env))


def main(argv: list[str] | None = None) -> int:
    sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
    from remote_code_check import Report, parity_parser, prepare_work, write_report

    parser = parity_parser(__doc__, RESULTS, "local copies (a hub clone of Fast_dLLM_v2_7B or a repository shipping "
                                             "its files; NVlabs/Fast-dLLM for v2/generation_functions.py)")
    args = parser.parse_args(argv)
    work, env = prepare_work(args.work, "fast_dllm_v2_parity_")
    import transformers
    from remote_code_checkpoints import clone_commit

    clones = [c.resolve() for c in args.clones]
    copies = [(c, f) for c in clones if (f := find_model_code(c)) is not None]
    samplers = [(c, s) for c in clones if (s := find_batch_sample(c)) is not None]
    if not copies:
        parser.error(f"no configuration.py + modeling.py defining Fast_dLLM_QwenForCausalLM under {clones}")
    sampler = samplers[0][1] if samplers else None
    report, t0 = Report(), time.time()
    for clone, folder in copies:
        label = f"{clone.name}@{clone_commit(clone)[:7]}"
        check_copy(report, label, folder, work, env, args.skip_train, sampler)
    record = {"transformers": transformers.__version__, "torch": torch.__version__,
              "clones": [{"name": c.name, "commit": clone_commit(c)} for c in clones],
              "code": {f"{c.name}@{clone_commit(c)[:7]}": str(f.relative_to(c.parent)) for c, f in copies},
              "batch_sample": (f"{samplers[0][0].name}@{clone_commit(samplers[0][0])[:7]}: "
                               f"{samplers[0][1].relative_to(samplers[0][0].parent)}") if samplers else None,
              "seconds": round(time.time() - t0)}
    return write_report(report, work, args.out, record)


if __name__ == "__main__":
    sys.exit(main())
