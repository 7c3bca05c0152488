"""dlmrl on Nemotron-Labs-Diffusion's own published model code (``modeling_nemotron_labs_diffusion.py`` +
``configuration_nemotron_labs_diffusion.py``), on a tiny random checkpoint built from a local copy of it.

    GIT_LFS_SKIP_SMUDGE=1 git clone https://huggingface.co/nvidia/Nemotron-Labs-Diffusion-8B   # the hub's own files
    python benchmarks/nemotron_diffusion_parity.py Nemotron-Labs-Diffusion-8B [--work DIR] [--skip-train]

``CLONE`` is any folder holding the two files (a hub clone, or a copy of them). The release's third file,
``modeling_ministral.py`` (the Ministral-3 encoder the diffusion model imports), is taken from ``CLONE`` when it has
one; otherwise from ``--ministral`` (default: dlmrl's test stand-in, ``tests/models/remote_code/nemotron_diffusion/
modeling_ministral.py``, written from what the release's file and axolotl's integration call), and the report says
so. The checkpoint: 2 layers, width 64, 4 query heads over 2 key/value heads, head 16; Nemotron-Labs-Diffusion-8B's
``config.json`` otherwise (``dlm_paradigm`` ``bidirectional``, ``block_size`` 32, ``mask_token_id`` 100, Llama-4
query scaling; plain RoPE instead of YaRN, vocabulary 256 instead of 131,072). Then, with dlmrl and the installed
``transformers``:

- ``load``: ``load_block_policy(path, trust_remote_code=True)`` detects ``nemotron_diffusion``, mask id 100 and block
  size 32 from ``config.json``; refused without ``trust_remote_code`` (the block and the AR kind);
- ``paradigm``: ``model.kind block`` on a copy declaring ``dlm_paradigm: autoregressive`` is refused by the config
  check naming the key and the file, and the published code's own forward on that copy is causal (NVIDIA's warning,
  seen on this code); on ``block_diff`` the code builds its flex-attention class, dlmrl the ``bidirectional`` one
  from the same weights (same logits as the ``bidirectional`` copy);
- ``forward``: dlmrl's composite pass (every block next to the clean blocks before it) against the code's own calls
  as ``generate`` makes them (prompt prefilled with ``use_cache=True``, each block called against the cache), in both
  of ``generate``'s layouts: ``causal_context=True`` (its default and dlmrl's, the family's ``clean_context="causal"``:
  the prompt and each finished block cached by a causal pass with every layer switched to ``diffusion_lm=False``, a
  block's first position scored by that pass's last logits) and ``causal_context=False`` (the policy with
  ``clean_context="block"``: bidirectional prefill and cache passes);
- ``greedy``: dlmrl's exact-cache block sampler (``temperature 0``, one token per step) token for token against the
  code's own ``generate(prompt, max_new_tokens, block_length, threshold=None, causal_context=...)`` (EOS check off:
  ``eos_token_id=-1``) in both layouts, for several block sizes, a batch of equal-length prompts in one call and
  left-padded rows; with ``causal_context=True`` also dlmrl's uncached sampler (``cache=False``). The
  ``causal_context=True`` comparisons run on a copy of the checkpoint whose head gives the mask token logit 0
  (:func:`without_mask_mass`): on the random weights the AR head's argmax is often the mask token, which ``generate``
  then writes as a block's first token and denoises, and dlmrl's argmax leaves it out (a trained checkpoint gives it
  no mass);
- ``ar greedy``: ``model.kind ar``'s ``generate`` (transformers' under dlmrl's causal mask) against the code's own
  ``ar_generate`` (which switches every layer to ``diffusion_lm=False``; switched back after);
- ``likelihood``: the block trajectory likelihood (composite passes) against the sampler's own record and against the
  trajectory replayed through the code's own cached calls (both layouts); the AR kind's token log-probs against the code's causal
  forward (``diffusion_lm=False``);
- ``train`` (unless ``--skip-train``): ``dlmrl train --dry-run``, 2 steps with LoRA and with every weight of
  ``tracerl`` (block kind) and ``grpo`` (AR kind), gradient checkpointing on, and ``dlmrl eval`` of each saved
  adapter / model.

Prints a table (PASS, FAIL, or INFO) and writes ``benchmarks/results/nemotron_diffusion_parity.json``. Exit status 1
if any check fails. CPU, about a minute (the CLI runs most of it).
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "nemotron_diffusion_parity.json"
STAND_IN_MINISTRAL = ROOT / "tests" / "models" / "remote_code" / "nemotron_diffusion" / "modeling_ministral.py"
CODE = ("modeling_nemotron_labs_diffusion.py", "configuration_nemotron_labs_diffusion.py")
PROMPT_TEXTS = ["12+7=34+", "3*4=9-5=", "8+8=16-2", "5*5=25+1"]
#: (gen_length, block_size) for the greedy comparison (one token per step, as generate)
GREEDY = [(64, 32), (16, 4), (16, 8), (12, 4)]
MASK_ID = 100
#: Nemotron-Labs-Diffusion-8B's config.json (read through the search index: the hub file as public loaders and ports
#: embed it), shrunk: width, layers, heads and vocabulary; plain RoPE.
CONFIG = {
    "architectures": ["NemotronLabsDiffusionModel"], "model_type": "nemotron_labs_diffusion",
    "auto_map": {"AutoConfig": "configuration_nemotron_labs_diffusion.NemotronLabsDiffusionConfig",
                 "AutoModel": "modeling_nemotron_labs_diffusion.NemotronLabsDiffusionModel"},
    "ar_loss_weight": 1.0, "attention_bias": False, "attention_dropout": 0.0, "attn_implementation": "sdpa",
    "block_size": 32, "bos_token_id": 1, "dlm_loss_weight": None, "dlm_paradigm": "bidirectional",
    "dp_varying_mask_ratio": False, "eos_token_id": 2, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
    "initializer_range": 0.5, "intermediate_size": 128, "mask_token_id": MASK_ID, "max_position_embeddings": 4096,
    "mlp_bias": False, "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "vocab_size": 256, "pad_token_id": 0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "llama_4_scaling_beta": 0.1,
                        "original_max_position_embeddings": 16384},
}


def build_checkpoint(clone: Path, ministral: Path, dest: Path, **changes) -> Path:
    """The tiny checkpoint: the clone's two files, ``modeling_ministral.py`` (the clone's or ``ministral``), a
    character tokenizer as wide as the head (no mask token: the id is ``config.json``'s), random weights."""
    from remote_code_check import REWARD_MODULE  # noqa: F401 (the work folder's reward module is written by main)

    from tests.models.checkpoints import ALPHABET, build_remote_model, char_tokenizer

    config = {k: v for k, v in {**CONFIG, **changes}.items()}
    dest.mkdir(parents=True, exist_ok=True)
    for name in CODE:
        shutil.copy(clone / name, dest / name)
    shutil.copy(clone / "modeling_ministral.py" if (clone / "modeling_ministral.py").is_file() else ministral,
                dest / "modeling_ministral.py")
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    fillers = [f"<t{i}>" for i in range(config["vocab_size"] - 5 - len(ALPHABET))]
    char_tokenizer(["<pad>", "<s>", "</s>", "<mask>", "<unk>", *fillers], bos_token="<s>", eos_token="</s>",
                   pad_token="<pad>", unk_token="<unk>").save_pretrained(dest)
    torch.manual_seed(0)
    build_remote_model(dest, "AutoModel").save_pretrained(dest, safe_serialization=True)
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest


def copy_with(src: Path, dest: Path, **changes) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest)
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, **changes}, indent=2))
    return dest


def without_mask_mass(src: Path, dest: Path) -> Path:
    """A copy of the checkpoint whose output head gives the mask token logit 0 (its ``diffusion_head`` row zeroed),
    below the other tokens' maxima: a trained checkpoint never predicts the mask token, but the random one's argmax
    often is it, and ``generate(causal_context=True)`` then writes it as a block's first token and denoises it
    (dlmrl's argmax leaves the mask token out), so every later token of the row differs for that reason alone."""
    from safetensors.torch import load_file, save_file

    copy = copy_with(src, dest)
    weights = load_file(str(copy / "model.safetensors"))
    weights["diffusion_head.weight"][MASK_ID] = 0.0
    save_file(weights, str(copy / "model.safetensors"), metadata={"format": "pt"})
    return copy


def checkpoint_note(path: Path) -> str:
    return ", head's mask-token row zeroed" if path.name.endswith("_no_mask_mass") else ""


def load(path: Path, block_size: int | None = None, causal: bool = True):
    """The block policy; ``causal=False``: with ``clean_context="block"`` (``generate(causal_context=False)``'s
    layout) instead of the family's ``"causal"``."""
    import dataclasses

    from dlmrl.models.loading import load_block_policy

    policy = load_block_policy(str(path), block_size=block_size, trust_remote_code=True)
    return policy if causal else dataclasses.replace(policy, clean_context="block")


def context_pass(model, ids: torch.Tensor, cache, causal: bool):
    """The code's cache pass of ``generate(causal_context=causal)``: with ``causal``, every layer switched to
    ``diffusion_lm=False`` and ``use_causal_mask=True`` (switched back after); else bidirectional."""
    if causal:
        set_diffusion_lm(model, False)
    try:
        return model(ids, past_key_values=cache, use_cache=True, use_causal_mask=causal)
    finally:
        set_diffusion_lm(model, True)


def layout(causal: bool) -> str:
    return f"causal_context={causal}"


def load_ar(path: Path):
    from dlmrl.models.ar import load_ar_policy

    return load_ar_policy(str(path), trust_remote_code=True)


def prompt_batch(policy, texts):
    enc = policy.tokenizer(texts, add_special_tokens=False, return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"].bool()


def set_diffusion_lm(model, on: bool) -> None:
    for layer in model.encoder.layers:
        layer.self_attn.diffusion_lm = on


# ------------------------------------------------------------------------------------------ load, paradigm


def check_load(path: Path):
    policy = load(path)
    ok = (policy.family == "nemotron_diffusion" and policy.mask_token_id == MASK_ID and policy.block_size == 32
          and not policy.prompt_blocks and policy.clean_context == "causal" and policy.logit_shift == 0
          and type(policy.model).__name__ == "NemotronLabsDiffusionModel")
    return ok, (f"family {policy.family}, mask id {policy.mask_token_id} (config.json), block size {policy.block_size} "
                f"(config.json), clean context {policy.clean_context!r} (generate's default causal_context=True), "
                f"{type(policy.model).__name__} from "
                f"{type(policy.model).__module__.split('.')[0]}")


def check_refused(path: Path):
    from dlmrl.models.ar import load_ar_policy
    from dlmrl.models.loading import load_block_policy

    said = []
    for loader in (load_block_policy, load_ar_policy):
        try:
            loader(str(path))
        except ValueError as e:
            said.append("trust_remote_code" in str(e))
        else:
            said.append(False)
    return all(said), f"block kind and AR kind refused naming trust_remote_code: {said}"


def check_autoregressive_refused(path: Path, work: Path):
    from dlmrl.config import Config, ConfigError, apply_overrides, validate
    from dlmrl.models.compat import load_checkpoint_model
    from dlmrl.models.nemotron_diffusion import patch_mask_keywords

    declared = copy_with(path, work / "declared_autoregressive", dlm_paradigm="autoregressive")
    cfg = Config()
    apply_overrides(cfg, [f"model.name_or_path={declared}", "model.kind=block", "model.trust_remote_code=true",
                          "task.answer_mode=text", "sampling.gen_length=32", "sampling.steps=32"])
    try:
        validate(cfg, for_training=False)
        refused, message = False, "not refused"
    except ConfigError as e:
        message = str(e)
        refused = "dlm_paradigm 'autoregressive'" in message and str(declared / "config.json") in message
    model = load_checkpoint_model(str(declared), True, torch.float32, "AutoModel")  # (the published code)
    patch_mask_keywords(sys.modules[type(model.encoder).__module__])  # (its causal path under transformers 5)
    ids = torch.randint(5, 200, (1, 8), generator=torch.Generator().manual_seed(0))
    other = ids.clone()
    other[0, -1] += 1
    with torch.no_grad():
        causal = torch.equal(model(ids).logits[:, :-1], model(other).logits[:, :-1])
    return refused and causal, (f"config check: {message[:160]}...; the published code's forward on that declaration "
                                f"is causal: {causal}")


def check_block_diff(path: Path, work: Path):
    from dlmrl.models.compat import load_checkpoint_model

    declared = copy_with(path, work / "declared_block_diff", dlm_paradigm="block_diff")
    own = load_checkpoint_model(str(declared), True, torch.float32, "AutoModel")
    own_class = type(own.encoder.layers[0].self_attn).__name__
    ours, plain = load(declared, block_size=4), load(path, block_size=4)
    ids, pm = prompt_batch(plain, PROMPT_TEXTS[:2])
    canvas = torch.randint(5, 200, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        gap = float((ours.completion_logits(ids, pm, canvas) - plain.completion_logits(ids, pm, canvas)).abs().max())
    ok = (own_class == "NemotronLabsDiffusionFlexAttention" and ours.model.config.dlm_paradigm == "block_diff"
          and type(ours.model.encoder.layers[0].self_attn).__name__ == "Ministral3Attention" and gap == 0.0)
    return ok, (f"the code builds {own_class}; dlmrl builds {type(ours.model.encoder.layers[0].self_attn).__name__} "
                f"(config keeps {ours.model.config.dlm_paradigm!r}); logits vs the bidirectional copy: gap {gap:.1e}")


# ------------------------------------------------------------------------------------------ forward, greedy


def check_forward(path: Path, causal: bool):
    policy = load(path, block_size=4, causal=causal)
    ids, pm = prompt_batch(policy, PROMPT_TEXTS[:2])
    length = 10
    clean = torch.randint(5, 200, (2, length), generator=torch.Generator().manual_seed(2))
    noisy = clean.masked_fill(torch.rand(2, length, generator=torch.Generator().manual_seed(3)) < 0.5, MASK_ID)
    model, gap = policy.model, 0.0
    with torch.no_grad():
        ours = policy.completion_logits(ids, pm, noisy, clean=clean)
        for row in range(2):
            out = context_pass(model, ids[row:row + 1], None, causal)
            for lo in range(0, length, 4):
                hi = min(lo + 4, length)
                theirs = model(noisy[row:row + 1, lo:hi], past_key_values=out.past_key_values,
                               use_cache=False).logits[0].float()
                if causal:  # (generate writes a block's first token from the cache pass's last logits)
                    theirs[0] = out.logits[0, -1].float()
                gap = max(gap, float((ours[row, lo:hi] - theirs).abs().max()))
                out = context_pass(model, clean[row:row + 1, lo:hi], out.past_key_values, causal)
    first = "; a block's first position vs the causal pass's last logits" if causal else ""
    return gap <= 1e-4, (f"{layout(causal)}: max |logit gap| {gap:.1e} over {tuple(ours.shape)}, blocks of 4 (last of "
                         f"2), float32{first}")


def reference_generate(model, prompts: torch.Tensor, gen_length: int, block_size: int,
                       causal: bool = True) -> torch.Tensor:
    try:
        out, _ = type(model).generate(model, prompts, max_new_tokens=gen_length, block_length=block_size,
                                      threshold=None, causal_context=causal, temperature=0.0, eos_token_id=-1)
    finally:
        set_diffusion_lm(model, True)  # (generate switches the layers back itself; an exception would not)
    return out[:, prompts.shape[1]:]


def check_greedy(path: Path, gen_length: int, block_size: int, causal: bool, cache: bool = True):
    policy = load(path, block_size=block_size, causal=causal)
    ids, pm = prompt_batch(policy, PROMPT_TEXTS)
    with torch.no_grad():
        ours = policy.sample_blocks(ids, pm, gen_length=gen_length, steps=gen_length, temperature=0.0, cache=cache)
        theirs = reference_generate(policy.model, ids, gen_length, block_size, causal)
    return compare_rows(ours.canvas, theirs, f"{layout(causal)}, gen {gen_length}, block {block_size}, 1 token/step"
                        f"{'' if cache else ', dlmrl without its cache'}{checkpoint_note(path)}: ",
                        "(the code's generate on the batch of equal-length prompts)")


def compare_rows(ours: torch.Tensor, theirs: torch.Tensor, head: str, tail: str):
    """PASS when every row is token-identical, or differs only where the code's ``generate`` left the mask token
    (its argmax over the whole vocabulary was the mask token, so the position stayed masked to the block's end;
    dlmrl's sampler never writes it): reported with the count."""
    same = sum(int(torch.equal(a, b)) for a, b in zip(ours, theirs))
    differ = ours != theirs
    at_mask = int((differ & (theirs == MASK_ID)).sum())
    other = int((differ & (theirs != MASK_ID)).sum())
    note = ("" if not differ.any() else f"; elsewhere generate left the mask token {at_mask}x (the random model's "
            f"argmax there is the mask id; dlmrl never writes it) and differs at {other} other positions")
    return other == 0, f"{head}{same}/{len(ours)} rows token-identical{note} {tail}"


def check_greedy_padded(path: Path, causal: bool, gen_length: int = 16, block_size: int = 4):
    policy = load(path, block_size=block_size, causal=causal)
    texts = ["12+7=", "3*4=9-5=", "8+"]
    ids, pm = prompt_batch(policy, texts)
    with torch.no_grad():
        ours = policy.sample_blocks(ids, pm, gen_length=gen_length, steps=gen_length, temperature=0.0)
        theirs = torch.cat([reference_generate(policy.model, ids[r:r + 1, pm[r]], gen_length, block_size, causal)
                            for r in range(len(texts))])
    return compare_rows(ours.canvas, theirs, f"{layout(causal)}{checkpoint_note(path)}, left-padded batch (padding 3, "
                        "0, 6) vs generate per unpadded prompt: ", "")


def check_ar_greedy(path: Path, new: int = 12):
    policy = load_ar(path)
    ids, pm = prompt_batch(policy, ["12+7=", "3*4=9-5=", "8+"])
    model = policy.model
    with torch.no_grad():
        ours = policy.generate(ids, pm, max_new_tokens=new, temperature=0.0)
        same, compared = 0, []
        try:
            for r in range(len(ids)):
                out, _ = type(model).ar_generate(model, ids[r:r + 1, pm[r]], max_new_tokens=new, eos_token_id=-1)
                n = int(ours.completion_mask[r].sum())  # (dlmrl stops at the tokenizer's EOS)
                compared.append(n)
                same += int(torch.equal(ours.completion[r, :n], out[0, int(pm[r].sum()):][:n]))
        finally:
            set_diffusion_lm(model, True)  # (ar_generate leaves every layer causal)
    return same == len(ids), (f"{same}/{len(ids)} rows token-identical to the code's ar_generate (left-padded batch vs "
                              f"each unpadded prompt; {compared} tokens compared, up to the first EOS)")


# ------------------------------------------------------------------------------------------ likelihoods


def replay(model, prompt: torch.Tensor, canvas: torch.Tensor, reveal_step: torch.Tensor,
           block_size: int, causal: bool = True) -> torch.Tensor:
    """``(L,)`` log-probs of one row's revealed tokens through the code's own calls: the prompt prefilled, each block's
    steps called against the cache with the tokens revealed before that step, ``log_softmax`` with the mask token
    excluded (dlmrl's sampler's convention), the finished block cached; with ``causal`` (``generate``'s
    ``causal_context=True``) the prefill and cache passes causal (:func:`context_pass`) and a block's first token
    scored by the last logits of the cache pass before it."""
    length, out = canvas.shape[0], torch.zeros(canvas.shape[0])
    ctx = context_pass(model, prompt, None, causal)
    for lo in range(0, length, block_size):
        hi = min(lo + block_size, length)
        steps = reveal_step[lo:hi]
        for s in steps.unique().tolist():
            block = canvas[lo:hi].masked_fill(steps >= s, MASK_ID)[None]
            logits = model(block, past_key_values=ctx.past_key_values, use_cache=False).logits[0].double()
            if causal:
                logits[0] = ctx.logits[0, -1].double()
            logits[:, MASK_ID] = -math.inf
            logp = torch.log_softmax(logits, -1).gather(-1, canvas[lo:hi, None])[:, 0]
            now = steps == s
            out[lo:hi][now] = logp[now].float()
        ctx = context_pass(model, canvas[None, lo:hi], ctx.past_key_values, causal)
    return out


def check_likelihood(path: Path, temperature: float, causal: bool = True):
    from dlmrl.estimators import score
    from dlmrl.estimators.block_plans import block_trajectory_plan

    policy = load(path, block_size=4, causal=causal)
    ids, pm = prompt_batch(policy, PROMPT_TEXTS[:2])
    with torch.no_grad():
        out = policy.sample_blocks(ids, pm, gen_length=12, steps=12, temperature=temperature,
                                   generator=torch.Generator().manual_seed(4))
        mask = torch.ones_like(out.canvas, dtype=torch.bool)
        plan = block_trajectory_plan(mask, out.reveal_step, 4, 1, temperature=temperature if temperature > 0 else 1.0)
        ours = score(policy, ids, pm, out.canvas, mask, plan)
        ref = torch.stack([replay(policy.model, ids[r:r + 1], out.canvas[r], out.reveal_step[r], 4, causal)
                           for r in range(2)])
    gap_sampler = float((ours.per_token - out.token_logprobs).abs().max())
    if temperature > 0:  # (the trajectory scores a sampled token at its temperature; the replay at T = 1)
        return gap_sampler <= 1e-4, (f"{layout(causal)}, T {temperature}: trajectory score vs the sampler's record, "
                                     f"max gap {gap_sampler:.1e}; {ours.nfe} composite passes for 12 tokens in 3 "
                                     "blocks")
    gap = float((ours.per_token - ref).abs().max())
    return gap <= 1e-4 and gap_sampler <= 1e-4, (
        f"{layout(causal)}, greedy: max |log-prob gap| {gap:.1e} vs the code's cached calls replayed step by step, "
        f"{gap_sampler:.1e} vs the sampler's record; {ours.nfe} composite passes instead of 12 calls")


def check_ar_likelihood(path: Path):
    policy = load_ar(path)
    ids, pm = prompt_batch(policy, ["12+7=", "3*4=9-5="])
    completion = torch.randint(5, 200, (2, 6), generator=torch.Generator().manual_seed(5))
    model, gap = policy.model, 0.0
    with torch.no_grad():
        logp, _ = policy.token_logprobs(ids, pm, completion, torch.ones_like(completion, dtype=torch.bool))
        set_diffusion_lm(model, False)  # (the code's causal path, as ar_generate switches it)
        try:
            for r in range(2):
                seq = torch.cat([ids[r, pm[r]], completion[r]])[None]
                logits = type(model).forward(model, seq, use_causal_mask=True).logits[0, -7:-1].float()
                theirs = torch.log_softmax(logits, -1).gather(-1, completion[r, :, None])[:, 0]
                gap = max(gap, float((logp[r] - theirs).abs().max()))
        finally:
            set_diffusion_lm(model, True)
    return gap <= 1e-4, f"AR token log-probs vs the code's causal forward: max gap {gap:.1e} (left-padded batch)"


# ------------------------------------------------------------------------------------------ training, eval


def write_run(kind: str, ckpt: Path, work: Path, lora: bool) -> Path:
    from remote_code_check import write_tiny_run

    model = {"kind": kind, "name_or_path": str(ckpt), "trust_remote_code": True, "dtype": "float32",
             "use_peft": lora, "lora_r": 8, "lora_alpha": 4, "lora_dropout": 0.0,
             "lora_target_modules": "q_proj,k_proj,v_proj,o_proj", "gradient_checkpointing": True}
    if kind == "block":
        model["block_size"] = 4
        sampling = {"gen_length": 8, "steps": 8, "temperature": 1.0}
        estimator, train = {"name": "trajectory", "order": "sampled", "merge": 1}, {"algorithm": "tracerl"}
    else:
        sampling, estimator, train = {"gen_length": 8, "temperature": 1.0}, {}, {"algorithm": "grpo"}
    name = f"{ckpt.name}_{kind}{'' if lora else '_full'}"
    path = write_tiny_run(work, name, PROMPT_TEXTS, model, sampling, estimator, train, eval_steps=8)
    import yaml

    config = yaml.safe_load(path.read_text())
    config["train"]["reward_funcs"] = ["nemotron_rewards:digit_sum"]  # (text_length is 1 for every completion here)
    if kind == "ar":  # (no estimator section, no diffusion eval steps for the AR kind)
        config.pop("estimator", None)
        config["eval"].pop("steps", None)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


REWARDS = '''def digit_sum(prompts, completions, **columns):
    """The digits of the decoded completion, summed, / 100: a signal that varies across a group (the tiny
    checkpoint's completions are mostly filler tokens <t17>..., whose digits count)."""
    return [sum(int(c) for c in text if c.isdigit()) / 100 for text in completions]
'''


def check_train(config: Path, env: dict):
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
    if lora:
        adapter = load_file(str(run / "final_model" / "adapter_model.safetensors"))
        lora_b = [v for k, v in adapter.items() if "lora_B" in k]
        moved = sum(int(v.abs().max() > 0) for v in lora_b)
        changed, what = moved > 0, f"{moved}/{len(lora_b)} lora_B moved from 0"
    else:
        start = load_file(str(Path(settings["model"]["name_or_path"]) / "model.safetensors"))
        saved = load_file(str(run / "final_model" / "model.safetensors"))
        moved = sum(int(not torch.equal(saved[k], start[k])) for k in start if k in saved)
        kept = json.loads((run / "final_model" / "config.json").read_text()).get("dlm_paradigm")
        code = sorted(p.name for p in (run / "final_model").glob("*.py"))
        changed = moved > 0 and "modeling_nemotron_labs_diffusion.py" in code and kept == CONFIG["dlm_paradigm"]
        what = f"{moved}/{len(start)} tensors changed, code {code}, dlm_paradigm {kept!r} kept"
    return len(steps) == 2 and finite and changed, (
        f"{len(steps)} steps in {time.time() - t0:.0f}s, loss {[v if v is None else round(v, 5) for v in losses]}, "
        f"{what}")


def check_eval(config: Path, env: dict):
    import yaml
    from remote_code_check import run_cli

    run = Path(yaml.safe_load(config.read_text())["output_dir"])
    out = run_cli(["eval", "--model", str(run / "final_model")], env)
    if out.returncode != 0:
        return False, f"rc {out.returncode}: {out.stderr.strip()[-300:]}"
    result = json.loads(out.stdout)
    return True, f"reloaded; {result['num_examples']} held-out prompts, mean_reward {result['mean_reward']}"


def check_clone(report, label: str, clone: Path, ministral: Path, work: Path, env: dict, skip_train: bool) -> None:
    from remote_code_check import check_dry_run

    ckpt = build_checkpoint(clone, ministral, work / f"nemotron_{clone.name}")
    own = (clone / "modeling_ministral.py").is_file()
    report.add(label, "modeling_ministral.py", None if not own else True,
               "the clone's own" if own else f"not in the clone: {ministral} (written for dlmrl's tests, not the "
               "release's)")
    report.run(label, "load", lambda: check_load(ckpt))
    report.run(label, "refused without trust_remote_code", lambda: check_refused(ckpt))
    report.run(label, "paradigm: autoregressive refused", lambda: check_autoregressive_refused(ckpt, work))
    report.run(label, "paradigm: block_diff", lambda: check_block_diff(ckpt, work))
    for causal in (True, False):
        report.run(label, "forward (composite vs the code's cached calls)", lambda c=causal: check_forward(ckpt, c))
    # (causal_context=True on the copy whose head never prefers the mask token: without_mask_mass)
    no_mask = without_mask_mass(ckpt, work / f"{ckpt.name}_no_mask_mass")
    for causal, path in ((True, no_mask), (False, ckpt)):
        for gen, block in GREEDY:
            report.run(label, f"greedy vs generate({layout(causal)})",
                       lambda g=gen, b=block, c=causal, p=path: check_greedy(p, g, b, c))
        report.run(label, f"greedy vs generate({layout(causal)}) (left padding)",
                   lambda c=causal, p=path: check_greedy_padded(p, c))
    report.run(label, "greedy vs generate(causal_context=True) (dlmrl uncached)",
               lambda: check_greedy(no_mask, 16, 4, True, cache=False))
    report.run(label, "AR greedy vs ar_generate", lambda: check_ar_greedy(ckpt))
    for causal in (True, False):
        report.run(label, "trajectory likelihood", lambda c=causal: check_likelihood(ckpt, 0.0, c))
        report.run(label, "trajectory likelihood", lambda c=causal: check_likelihood(ckpt, 1.0, c))
    report.run(label, "AR likelihood", lambda: check_ar_likelihood(ckpt))
    if skip_train:
        return
    for kind in ("block", "ar"):
        for lora in (True, False):
            config = write_run(kind, ckpt, work, lora)
            what = f"{kind}, {'LoRA' if lora else 'every weight'}"
            if lora:
                report.run(label, f"dlmrl train --dry-run ({kind})", lambda c=config: check_dry_run(c, env))
            report.run(label, f"dlmrl train, 2 steps ({what})", lambda c=config: check_train(c, env))
            report.run(label, f"dlmrl eval ({what})", lambda c=config: check_eval(c, env))


def main(argv: list[str] | None = None) -> int:
    sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
    from remote_code_check import parity_parser, prepare_work

    parser = parity_parser(__doc__, RESULTS, "local copies of the release's files (a hub clone, or the two files)")
    parser.add_argument("--ministral", type=Path, default=STAND_IN_MINISTRAL,
                        help="modeling_ministral.py for a copy that has none")
    parser.add_argument("--source", default=None, help="where the copy's files come from (recorded in the JSON)")
    args = parser.parse_args(argv)
    work, env = prepare_work(args.work, "nemotron_parity_")
    (work / "nemotron_rewards.py").write_text(REWARDS)
    import warnings

    import transformers
    from remote_code_check import Report, write_report
    from remote_code_checkpoints import clone_commit

    warnings.simplefilter("ignore")  # (transformers' deprecations, dlmrl's paradigm notes: the table says what counts)
    transformers.logging.set_verbosity_error()  # (the tiny config's rope_parameters keys are the release's)
    report, t0, code = Report(), time.time(), {}
    for clone in (c.resolve() for c in args.clones):
        if not all((clone / name).is_file() for name in CODE):
            parser.error(f"{clone} holds no {' + '.join(CODE)}")
        commit = clone_commit(clone)
        label = f"{clone.name}@{commit[:7]}"
        ministral = args.ministral.resolve()
        code[label] = {"commit": commit, **{name: len((clone / name).read_text(encoding="utf-8")) for name in CODE},
                       "modeling_ministral.py": "clone" if (clone / "modeling_ministral.py").is_file()
                       else str(ministral.relative_to(ROOT) if ministral.is_relative_to(ROOT) else ministral)}
        check_clone(report, label, clone, args.ministral.resolve(), work, env, args.skip_train)
    record = {"transformers": transformers.__version__, "torch": torch.__version__, "code": code, "source": args.source,
              "seconds": round(time.time() - t0)}
    return write_report(report, work, args.out, record)


if __name__ == "__main__":
    sys.exit(main())
