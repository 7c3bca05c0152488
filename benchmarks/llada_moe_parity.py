"""dlmrl on LLaDA-MoE's own published model code (``modeling_lladamoe.py``), and on LLaDA's code with iLLaDA's mask
id 5, on tiny random checkpoints built from local copies of the code.

    git clone https://github.com/ZHZisZZ/dllm            # dllm/pipelines/llada/models/: LLaDA-MoE's code (renamed config)
    git clone https://github.com/InfiniTensor/InfiniLM && git -C InfiniLM checkout b795b19   # the released files
    GIT_LFS_SKIP_SMUDGE=1 git clone https://huggingface.co/inclusionAI/LLaDA-MoE-7B-A1B-Instruct  # the hub's own files
    git clone https://github.com/NVlabs/Fast-dLLM        # llada/model/: LLaDA's code, which iLLaDA runs
    git clone https://github.com/ML-GSAI/LLaDA           # generate.py: LLaDA's sampler (LLaDA-MoE's model card's too)
    python benchmarks/llada_moe_parity.py dllm InfiniLM Fast-dLLM LLaDA [--work DIR] [--skip-train]

**LLaDA-MoE**: for each clone holding ``configuration_lladamoe.py`` + ``modeling_lladamoe.py``,
``remote_code_checkpoints.build_checkpoint`` writes a tiny random checkpoint (2 layers, width 64, 8 experts of which 2
per token; the release's config otherwise, as :data:`remote_code_checkpoints.LLADA_MOE_CONFIG` reads it: vocabulary
157,184, ``model_type "llada"``, no ``mask_token_id``; the config class the clone's file declares; a hub clone's own
``config.json`` when it has one), a character tokenizer holding ``<|endoftext|>`` 156892 and ``<|mask|>`` 156895 (no
``mask_token`` role), and its code is the clone's files. Then, with dlmrl and the installed ``transformers``:

- ``load``: ``load_policy(path, trust_remote_code=True)`` detects ``llada_moe`` (not ``llada``, whose ``model_type``
  it shares) and reads the mask id 156895 from the tokenizer's vocabulary; refused without ``trust_remote_code``;
  what ``transformers``' own ``AutoModel`` does without dlmrl's patches (INFO); the loaded model against the class
  built by hand with the same weights;
- ``padding``: whether the code applies a 2-D ``attention_mask`` (INFO: the release discards it, dllm's copy applies
  it) and dlmrl's logits of a left-padded row against the code's forward of the row alone;
- ``greedy``: dlmrl's sampler (``temperature 0``, ``low_confidence``) token for token against LLaDA's ``generate``
  (ML-GSAI/LLaDA ``generate.py``, the model card's sampler) with ``mask_id=156895``, for several block sizes and steps;
  a left-padded batch (dlmrl's rows equal the rows alone; the reference's batched run recorded);
- ``likelihood``: the sampler's recorded log-probabilities of a sampled, left-padded rollout (the trajectory
  likelihood's terms) against each step replayed through the code's forward on the row alone;
- ``experts``: logits and gradients in training and eval mode (the code has one expert loop for both), gradient
  checkpointing (``transformers``' own, which the code supports), ``bfloat16``; and the same code with
  ``moe_router_enable_expert_bias`` on (off in the release, as we read it): loading warns, sampling runs, and every
  backward pass fails on the code's in-place ``routing_weights += self.expert_bias``;
- ``train`` (unless ``--skip-train``): ``dlmrl train --dry-run`` and 2 steps each of ``gdpo`` and ``diffu_grpo`` with
  LoRA on ``q_proj,k_proj,v_proj`` (the LLaDA recipes' model section) and gradient checkpointing, ``dlmrl eval`` of the
  adapter, 2 ``gdpo`` steps training every weight and ``dlmrl eval`` of the saved model.

**iLLaDA**: for each clone holding LLaDA's ``configuration_llada.py`` + ``modeling_llada.py``, a tiny checkpoint of
that code with iLLaDA's shape as its model card gives it (vocabulary 155,136, grouped-query attention, tied
embeddings) and ``mask_token_id: 5`` in ``config.json`` (ML-GSAI/LLaDA's README: iLLaDA reuses LLaDA's inference code
with ``mask_id=5``; the rest of iLLaDA's ``config.json`` is our reading), the tokenizer's id 5 a ``<|mask|>`` it does
not declare as its mask token: ``load`` (family ``llada``, mask id 5), greedy against LLaDA's ``generate`` with
``mask_id=5``, every forward of decoding and scoring fed 5 and never LLaDA's 126336, the likelihood replay, and (unless
``--skip-train``) 2 ``gdpo`` steps with LoRA and with every weight (the tied embedding and head saved once: compat
patch 11), ``dlmrl eval`` of both.

Prints a table (PASS, FAIL, or INFO) and writes ``benchmarks/results/llada_moe_parity.json``. Exit status 1 if any
check fails. CPU, a few minutes.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "llada_moe_parity.json"
PROMPTS = ["12+7=", "3*4=", "9-5=", "8+8="]
#: float32 forwards of the same row in two batch shapes: kernels may sum in another order (a few ulps of logits ~10)
TOL = 1e-4
LLADA_MASK = 126336
ILLADA = {"vocab_size": 155136, "embedding_size": 155136, "n_kv_heads": 2, "weight_tying": True, "mask_token_id": 5,
          "max_sequence_length": 8192, "mlp_hidden_size": 128, "eos_token_id": 1, "pad_token_id": 1}
#: the iLLaDA tokenizer's special tokens: only the mask's id (5) is published; the names and the other ids are ours
ILLADA_SPECIALS = {"<|startoftext|>": 0, "<|endoftext|>": 1, "<|mask|>": 5}
ILLADA_TEXT_OFFSET = 256  # (the characters after the special ids)


def load(path: Path, **kw):
    from dlmrl.models.loading import load_policy

    policy = load_policy(str(path), trust_remote_code=True, **kw)
    policy.model.eval()
    return policy


def encode(policy, texts):
    enc = policy.tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"].bool()


def rel_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-30))


# ------------------------------------------------------------------------------------------------ LLaDA-MoE


def check_load(path: Path, family: str, mask: int):
    policy = load(path)
    config = json.loads((path / "config.json").read_text())
    ok = policy.family == family and policy.mask_token_id == mask
    return ok, (f"family {policy.family} (config.json model_type {config.get('model_type')!r}, architectures "
                f"{config.get('architectures')}), mask id {policy.mask_token_id} (config.json mask_token_id "
                f"{config.get('mask_token_id')}, tokenizer mask_token {policy.tokenizer.mask_token!r}), "
                f"{type(policy.model).__name__}")


@torch.no_grad()
def check_mask_convention(path: Path):
    """Does the code apply a 2-D padding mask? The padded row's logits with the mask against the row alone."""
    policy = load(path)
    ids, pm = encode(policy, ["12+7=34", "9="])
    alone = policy.model(ids[1:, pm[1]]).logits
    masked = policy.model(ids, attention_mask=pm.long()).logits[1:, pm[1]]
    gap = rel_gap(masked, alone)
    return None, (f"the code {'applies' if gap <= TOL else 'ignores'} attention_mask (padded row with the mask vs the "
                  f"row alone: relative gap {gap:.1e})")


@torch.no_grad()
def check_padded_logits(path: Path):
    policy = load(path)
    ids, pm = encode(policy, ["12+7=34", "9=", "45+6"])
    ours = policy(ids, pm)
    gaps = [rel_gap(ours[r, pm[r]], policy.model(ids[r:r + 1, pm[r]]).logits[0]) for r in range(len(ids))]
    zero = bool((ours[~pm] == 0).all())
    return max(gaps) <= TOL and zero, (f"dlmrl's logits of each left-padded row vs the code's forward of the row alone: "
                                       f"max relative gap {max(gaps):.1e}; padding positions 0: {zero}")


def reference_generate(clones: list[Path]):
    """LLaDA's ``generate`` (``generate.py`` whose ``generate`` takes ``attention_mask`` and ``remasking`` but no
    ``threshold``: ML-GSAI/LLaDA's, not Fast-dLLM's), ``(function, 'path @ commit')`` or ``None``."""
    from remote_code_check import load_function
    from remote_code_checkpoints import clone_commit

    for clone in clones:
        for path in sorted(clone.rglob("generate.py")):
            head = path.read_text(errors="replace").split("def generate(", 1)
            params = head[1].split(")", 1)[0] if len(head) == 2 else ""
            if "attention_mask" in params and "remasking" in params and "threshold" not in params:
                return load_function(path, "generate"), f"{path.relative_to(clone.parent)} @ {clone_commit(clone)[:12]}"
    return None


@torch.no_grad()
def check_likelihood(path: Path):
    """The sampler's recorded log-probabilities (sampled, left-padded batch) against each step replayed through the
    code's forward on the row alone, with the mask token's logit at -inf (the sampler never draws it)."""
    from dlmrl.models.sampler import generate

    policy = load(path)
    ids, pm = encode(policy, PROMPTS + ["7="])
    out = generate(policy, ids, pm, gen_length=8, block_length=4, steps=8, temperature=1.0,
                   generator=torch.Generator().manual_seed(0))
    worst, terms = 0.0, 0
    for row in range(ids.shape[0]):
        prompt = ids[row, pm[row]]
        for step in out.reveal_step[row].unique().tolist():
            canvas = torch.where(out.reveal_step[row] < step, out.canvas[row], policy.mask_token_id)
            logits = policy.model(torch.cat([prompt, canvas])[None]).logits.float()[0, len(prompt):]
            logits[:, policy.mask_token_id] = -math.inf
            here = out.reveal_step[row] == step
            replay = torch.log_softmax(logits, -1).gather(-1, out.canvas[row][:, None])[:, 0]
            worst = max(worst, float((replay[here] - out.token_logprobs[row, here]).abs().max()))
            terms += int(here.sum())
    return worst <= TOL, (f"{terms} token log-probs of a sampled rollout (5 prompts, one left-padded) vs the replay "
                          f"through the code's forward: max |gap| {worst:.1e}")


def _grads(policy, x, clean):
    policy.model.zero_grad(set_to_none=True)
    logits = policy(x)
    torch.log_softmax(logits, -1).gather(-1, clean[..., None]).sum().backward()
    return logits.detach(), {n: p.grad.detach().clone() for n, p in policy.model.named_parameters()
                             if p.grad is not None}


def check_experts(path: Path):
    """Training and eval mode: the same logits and gradients (routed experts included)."""
    policy = load(path)
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, 95, (2, 12), generator=g)
    x = clean.masked_fill(torch.rand(2, 12, generator=g) < 0.5, policy.mask_token_id)
    policy.model.train()
    train_logits, train = _grads(policy, x, clean)
    policy.model.eval()
    eval_logits, evals = _grads(policy, x, clean)
    routed = [n for n in train if ".experts." in n]
    grad_gap = max(rel_gap(evals[n], train[n]) for n in train) if set(evals) == set(train) else math.inf
    ok = rel_gap(eval_logits, train_logits) == 0 and grad_gap == 0 and len(routed) > 0
    return ok, (f"train vs eval mode: logits relative gap {rel_gap(eval_logits, train_logits):.1e}, gradients "
                f"{grad_gap:.1e} over {len(train)} parameters ({len(routed)} routed-expert weights, all with "
                f"gradients in eval mode too)")


def check_expert_bias(source, work: Path):
    """The same code with ``moe_router_enable_expert_bias`` on (the release, as we read it, has it off): loading warns,
    a no-grad rollout runs, and a backward pass fails on the code's in-place ``routing_weights += self.expert_bias``."""
    import warnings

    import remote_code_checkpoints as rc

    from dlmrl.models.sampler import generate

    before = rc.LLADA_MOE_CONFIG["moe_router_enable_expert_bias"]
    rc.LLADA_MOE_CONFIG["moe_router_enable_expert_bias"] = True
    try:
        ckpt = rc.build_checkpoint(source, work / f"llada_moe_bias_{source.clone.name}")
    finally:
        rc.LLADA_MOE_CONFIG["moe_router_enable_expert_bias"] = before
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy = load(ckpt)
    warned = any("moe_router_enable_expert_bias" in str(w.message) for w in caught)
    ids, pm = encode(policy, PROMPTS)
    with torch.no_grad():
        sampled = generate(policy, ids, pm, gen_length=8, block_length=8, steps=8, temperature=1.0,
                           generator=torch.Generator().manual_seed(0))
    policy.model.train()
    try:
        torch.log_softmax(policy(torch.cat([ids, sampled.canvas], 1)), -1).mean().backward()
        error = "none"
    except RuntimeError as e:
        error = str(e).split(":")[0]
    ok = warned and "inplace operation" in error
    return ok, (f"expert bias on: loading warns {warned}; a no-grad rollout runs; backward: {error}")


# --------------------------------------------------------------------------------------------------- iLLaDA


def build_illada(source, out: Path) -> Path:
    """A tiny checkpoint of LLaDA's code (``source``) with iLLaDA's shape and mask id 5 (:data:`ILLADA`): the release's
    LLaDA config shrunk (:func:`remote_code_checkpoints.checkpoint_config`) with :data:`ILLADA` over it, a character
    tokenizer with :data:`ILLADA_SPECIALS` (no mask role) and the characters from id 256, random weights
    (:func:`remote_code_checkpoints.init_weights`; the tied embedding, which is the output head, times 0.2 and the
    characters' rows 2.5 times larger: 96 of 155,136 tokens, which sampled
    completions must hit often enough, and not always, for a text reward to vary)."""
    import shutil

    from remote_code_checkpoints import (
        CHAT_TEMPLATES,
        CODE_FILES,
        _char_vocab,
        checkpoint_config,
        init_weights,
    )
    from safetensors.torch import save_file
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from dlmrl.models.compat import checkpoint_model_class, ensure_default_rope, load_checkpoint_config

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in CODE_FILES["llada"]:
        shutil.copy(source.folder / name, out / name)
    config = {**checkpoint_config(source), **ILLADA}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    chars = _char_vocab()
    vocab = {c: ILLADA_TEXT_OFFSET + i for i, c in enumerate(chars)} | {"<|unk|>": ILLADA_TEXT_OFFSET + len(chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab | ILLADA_SPECIALS, unk_token="<|unk|>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<|unk|>", padding_side="left",
                                  bos_token="<|startoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|mask|>"])
    tok.chat_template = CHAT_TEMPLATES["llada"]
    tok.save_pretrained(out)
    ensure_default_rope()
    built = load_checkpoint_config(str(out), trust_remote_code=True)
    model = checkpoint_model_class(built, str(out), "AutoModel")(built)
    init_weights(model, 0)
    with torch.no_grad():  # (the tied head is the N(0, 1) embedding: scaled down so that the predictions do not
        # saturate, where LLaDA's float32 softmax rounds the top probabilities to ties and greedy parity is rounding)
        wte = model.model.transformer.wte.weight
        wte *= 0.2
        wte[ILLADA_TEXT_OFFSET:ILLADA_TEXT_OFFSET + len(chars)] *= 2.5  # (completions mix text and other tokens)
    # (save_pretrained refuses the tied matrix under transformers 5: LLaDA's tie_weights makes ``ff_out`` the ``wte``
    # module but declares no tied keys; the file holds ``wte`` once, as a tied release does)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not k.endswith("transformer.ff_out.weight")}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def check_illada_load(path: Path):
    from dlmrl.models.families import is_illada

    ok, detail = check_load(path, "llada", 5)
    illada = is_illada(json.loads((path / "config.json").read_text()))
    return ok and illada, f"{detail}; detected as iLLaDA's config: {illada}"


@torch.no_grad()
def check_illada_mask(path: Path, reference):
    """Greedy decoding (one forward hook recording every input) and scoring of an iLLaDA checkpoint: the masked
    positions hold 5 and 126336 appears nowhere; the canvas equals LLaDA's generate with mask_id=5."""
    from dlmrl.models.sampler import generate

    policy = load(path)
    seen = []
    hook = policy.model.register_forward_pre_hook(
        lambda m, args, kw: seen.append((args[0] if args else kw["input_ids"]).clone()), with_kwargs=True)
    ids, pm = encode(policy, ["12+3=", "45+6="])  # (unpadded: LLaDA's generate is given no attention mask here)
    try:
        out = generate(policy, ids, pm, gen_length=16, block_length=8, steps=8)
        canvas = out.canvas.clone()
        canvas[:, ::3] = policy.mask_token_id
        policy(torch.cat([ids, canvas], 1))  # (scoring a noised completion)
    finally:
        hook.remove()
    fives = sum(int((x[:, ids.shape[1]:] == 5).sum()) for x in seen)
    llada = sum(int((x == LLADA_MASK).sum()) for x in seen)
    theirs = reference(policy.model, ids, steps=8, gen_length=16, block_length=8, temperature=0.0,
                       remasking="low_confidence", mask_id=5)
    same = bool(torch.equal(out.canvas, theirs[:, ids.shape[1]:]))
    ok = policy.mask_token_id == 5 and fives > 0 and llada == 0 and same
    return ok, (f"mask id {policy.mask_token_id}; {len(seen)} forwards held 5 at {fives} masked positions and 126336 at "
                f"{llada}; greedy canvas = LLaDA generate(mask_id=5): {same}")


# ---------------------------------------------------------------------------------------------- training


def write_config(name: str, ckpt: Path, work: Path, family: str, algorithm: str, lora: bool = True) -> Path:
    """A 2-step run on ``ckpt``: the LLaDA recipe's ``model`` section (LoRA on ``q_proj,k_proj,v_proj``, or every weight)
    and algorithm settings, gradient checkpointing, float32, a 4-prompt dataset task and a tiny batch."""
    import yaml
    from remote_code_check import write_tiny_run

    recipe = yaml.safe_load((ROOT / "configs" / f"llada_{algorithm}_sudoku.yaml").read_text())
    model = {**recipe["model"], "name_or_path": str(ckpt), "family": family, "lora_r": 8, "lora_alpha": 4,
             "gradient_checkpointing": True, "dtype": "float32", "use_peft": lora}
    model.pop("architecture", None)
    sampling = {**recipe["sampling"], "gen_length": 8, "block_length": 4, "steps": 4}
    path = write_tiny_run(work, f"{name}_{algorithm}{'' if lora else '_full'}", PROMPTS, model, sampling,
                          recipe["estimator"], recipe["train"], eval_steps=4)
    # 4 groups of 2 per step (write_tiny_run's 2): a random tiny model's completions often tie on the text reward
    # within a pair, and a step whose every group ties has nothing to train on
    config = yaml.safe_load(path.read_text())
    config["train"]["prompts_per_step"] = 4
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def check_llada_moe(report, label: str, source, clones: list[Path], work: Path, env: dict, skip_train: bool,
                    reference) -> None:
    from remote_code_check import (
        check_as_built,
        check_bf16,
        check_dry_run,
        check_eval,
        check_gradient_checkpointing,
        check_llada_greedy,
        check_llada_padded,
        check_refused,
        check_train,
        unpatched_load,
    )
    from remote_code_checkpoints import MASK_IDS, build_checkpoint
    from sdar_parity import check_full_eval, check_train_block

    ckpt = build_checkpoint(source, work / f"llada_moe_{source.clone.name}")
    report.add(label, "code", None, f"{source.folder.relative_to(source.clone.parent)} @ {source.commit[:12]}")
    report.run(label, "load without dlmrl (transformers' AutoModel)", lambda: unpatched_load(ckpt, env))
    report.run(label, "load (auto_map + trust_remote_code)", lambda: check_load(ckpt, "llada_moe", MASK_IDS["llada_moe"]))
    report.run(label, "refused without trust_remote_code", lambda: check_refused(ckpt))
    # (own_call("llada", ...) is model(ids).logits, LLaDA-MoE's own call too)
    report.run(label, "loaded = built by hand from the same weights", lambda: check_as_built("llada", ckpt))
    report.run(label, "convention: attention_mask", lambda: check_mask_convention(ckpt))
    report.run(label, "left padding (logits)", lambda: check_padded_logits(ckpt))
    policy = load(ckpt)
    with torch.no_grad():
        if reference is None:
            report.add(label, "greedy = LLaDA generate()", None, "no LLaDA generate.py in the clones")
        else:
            fn, where = reference
            report.run(label, "greedy = LLaDA generate()", lambda: check_llada_greedy(policy, fn, where))
            report.run(label, "left padding (decoding)", lambda: check_llada_padded(policy, fn))
    report.run(label, "trajectory likelihood", lambda: check_likelihood(ckpt))
    report.run(label, "experts: training = eval mode", lambda: check_experts(ckpt))
    report.run(label, "gradient checkpointing", lambda: check_gradient_checkpointing("llada_moe", ckpt))
    report.run(label, "bfloat16", lambda: check_bf16(ckpt))
    report.run(label, "expert bias on: dlmrl warns, the code's backward fails", lambda: check_expert_bias(source, work))
    if skip_train:
        return
    name = f"llada_moe_{source.clone.name}"
    n_layers = int(policy.model.config.num_hidden_layers)
    for algorithm in ("gdpo", "diffu_grpo"):
        config = write_config(name, ckpt, work, "llada_moe", algorithm)
        if algorithm == "gdpo":
            report.run(label, "dlmrl train --dry-run", lambda c=config: check_dry_run(c, env))
        report.run(label, f"dlmrl train, 2 steps ({algorithm}, LoRA)", lambda c=config: check_train(c, env, n_layers))
    report.run(label, "dlmrl eval (LoRA adapter)", lambda: check_eval(work / f"{name}_gdpo.yaml", env))
    config = write_config(name, ckpt, work, "llada_moe", "gdpo", lora=False)
    report.run(label, "dlmrl train, 2 steps (gdpo, every weight)", lambda c=config: check_train_block(c, env))
    report.run(label, "dlmrl eval (fully trained model)", lambda c=config: check_full_eval(c, env))


def check_illada(report, label: str, source, work: Path, env: dict, skip_train: bool, reference) -> None:
    from remote_code_check import check_eval, check_llada_greedy, check_train
    from sdar_parity import check_full_eval, check_train_block

    ckpt = build_illada(source, work / f"illada_{source.clone.name}")
    report.add(label, "code", None, f"{source.folder.relative_to(source.clone.parent)} @ {source.commit[:12]} "
                                    f"(LLaDA's code, iLLaDA's config: {json.dumps(ILLADA)})")
    report.run(label, "load (iLLaDA config: family llada, mask id 5)", lambda: check_illada_load(ckpt))
    if reference is None:
        report.add(label, "mask 5 in decoding and scoring, greedy = LLaDA generate(mask_id=5)", None,
                   "no LLaDA generate.py in the clones")
    else:
        report.run(label, "mask 5 in decoding and scoring, greedy = LLaDA generate(mask_id=5)",
                   lambda: check_illada_mask(ckpt, reference[0]))
        policy = load(ckpt)
        with torch.no_grad():
            report.run(label, "greedy = LLaDA generate() (mask_id 5)",
                       lambda: check_llada_greedy(policy, reference[0], reference[1]))
    report.run(label, "trajectory likelihood", lambda: check_likelihood(ckpt))
    if skip_train:
        return
    name = f"illada_{source.clone.name}"
    config = write_config(name, ckpt, work, "llada", "gdpo")
    report.run(label, "dlmrl train, 2 steps (gdpo, LoRA)", lambda: check_train(config, env, 2))
    report.run(label, "dlmrl eval (LoRA adapter)", lambda: check_eval(config, env))
    # (every weight: the tied matrix saved once, compat patch 11)
    config = write_config(name, ckpt, work, "llada", "gdpo", lora=False)
    report.run(label, "dlmrl train, 2 steps (gdpo, every weight)", lambda c=config: check_train_block(c, env))
    report.run(label, "dlmrl eval (fully trained model)", lambda c=config: check_full_eval(c, env))


def main(argv: list[str] | None = None) -> int:
    sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
    from remote_code_check import Report, parity_parser, prepare_work, write_report

    parser = parity_parser(__doc__, RESULTS, "local copies (dllm, InfiniLM@b795b19 or a hub clone of LLaDA-MoE; "
                                             "Fast-dLLM; ML-GSAI/LLaDA)")
    args = parser.parse_args(argv)
    work, env = prepare_work(args.work, "llada_moe_parity_")
    import transformers
    from remote_code_checkpoints import clone_commit, find_code

    clones = [c.resolve() for c in args.clones]
    reference = reference_generate(clones)
    report, t0, code = Report(), time.time(), {}
    for clone in clones:
        found = find_code([clone], ("llada_moe", "llada"))
        if "llada_moe" in found:
            source = found["llada_moe"]
            label = f"LLaDA-MoE {clone.name}@{source.commit[:7]}"
            code[label] = str(source.folder.relative_to(source.clone.parent))
            check_llada_moe(report, label, source, clones, work, env, args.skip_train, reference)
        elif "llada" in found:  # (a copy of LLaDA-MoE's code may sit next to LLaDA's: LLaDA-MoE is checked there)
            source = found["llada"]
            label = f"iLLaDA {clone.name}@{source.commit[:7]}"
            code[label] = str(source.folder.relative_to(source.clone.parent))
            check_illada(report, label, source, work, env, args.skip_train, reference)
    if not code:
        parser.error(f"no configuration_lladamoe.py + modeling_lladamoe.py (or LLaDA's files) under {clones}")
    record = {"transformers": transformers.__version__, "torch": torch.__version__,
              "clones": [{"name": c.name, "commit": clone_commit(c)} for c in clones], "code": code,
              "reference_generate": reference[1] if reference else None, "seconds": round(time.time() - t0)}
    return write_report(report, work, args.out, record)


if __name__ == "__main__":
    sys.exit(main())
