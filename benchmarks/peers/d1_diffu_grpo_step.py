"""dlmrl's ``diffu_grpo`` training step against d1's own diffu-GRPO trainer, side by side on the same work.

d1 (dllm-reasoning/d1, arXiv 2504.12216) trains LLaDA with ``DiffuGRPOTrainer`` (``diffu-grpo/diffu_grpo_trainer.py``),
a subclass of TRL's ``GRPOTrainer`` at the TRL commit d1 pins (``env.yml``: huggingface/trl@0f88c17, 0.16.0.dev0).
Both tools train the same tiny random checkpoint of LLaDA's published model code for ``--steps`` rollout batches and
the script times them and compares the numerics. Each side runs in its own fresh subprocess (this file with
``--worker dlmrl|d1``); the sides alternate (dlmrl first on even repeats, d1 first on odd ones), ``--repeats`` times.
Usage (d1, its TRL and LLaDA's model code are not dependencies of dlmrl)::

    git clone https://github.com/dllm-reasoning/d1
    git clone https://github.com/NVlabs/Fast-dLLM                  # llada/model/: LLaDA's model code
    git clone https://github.com/huggingface/trl trl-d1 && git -C trl-d1 checkout 0f88c179e30b   # d1's env.yml pin
    python benchmarks/peers/d1_diffu_grpo_step.py d1 --llada-code Fast-dLLM --trl trl-d1 [--steps 4] [--repeats 3]
        [--num-iterations 12] [--prompts 2] [--threads N] [--work DIR] [--output FILE]

``--trl`` goes on the d1 worker's ``PYTHONPATH`` only (without it, the d1 worker imports whatever ``trl`` the Python
has: d1's trainer needs a 0.16-era one). dlmrl's side never imports TRL.

The checkpoint: ``benchmarks/remote_code_checkpoints.build_checkpoint`` on the clone's ``llada/model`` code (2 layers,
width 64, LLaDA-8B-Instruct's config otherwise: vocabulary 126,464, mask id 126,336; character tokenizer), then one
change (:func:`swap_digit_rows`): as built, the random model writes a digit with probability about 1e-4, so every
Sudoku reward is 0 (no advantage, no gradient); the script exchanges the output-head rows of the digits 1-4 with
those of the four tokens the model puts the most probability on at the completion positions of a fixed set of
Sudoku prompts (four pairs of token ids exchanged in the head: the same random model otherwise), after which it
writes a Sudoku value at about a quarter of the cells and the rewards vary within groups.

What is the same on both sides (d1's values: ``diffu-grpo/slurm_scripts/train.yaml`` with ``run.sh``'s μ 12, and
``diffu_grpo_config.py`` where the yaml sets none; dlmrl runs ``configs/diffu_grpo_sudoku_tiny.yaml``, the
``diffu_grpo`` preset with the ``one_step`` estimator, its settings overridden to d1's):

- prompts: dlmrl's Sudoku task in its ``full`` answer mode (the 16 cells all written, as d1's format). Rollout
  ``k`` of repeat ``r`` trains on ``SudokuTask.train_batch(--prompts, seed + r, k)``; d1 gets the same puzzles as a
  ``datasets.Dataset`` of prompt strings ``"<|startoftext|><puzzle>="``, placed so that TRL's ``RepeatRandomSampler``
  (which permutes the dataset with the seed) hands rollout ``k`` the same prompts in the same order (checked in the
  worker, as is the prompt ids d1's tokenizer call gives against dlmrl's ``task.encode``).
- rollouts: G = 6 completions per prompt (d1's ``num_generations``), 16 tokens (the grid), LLaDA's low-confidence
  remasking in blocks of 8 with 8 steps (d1's 256 tokens in blocks of 32 with 128 steps: 2 tokens per step), Gumbel
  sampling at temperature 0.9 (``DiffuGRPOConfig``'s default), no guidance, all ``--prompts`` x G completions in one
  sampling call (d1 ``generation_batch_size``).
- reward: dlmrl's cell accuracy (``dlmrl.rewards.sudoku.sudoku_reward``: correct blank cells / blanks, d1's Sudoku
  rule) on the text dlmrl's ``SudokuTask.decode`` reads from the completion's ids (one cell per token up to EOS, a
  non-digit token a wrong cell). d1's trainer turns the ids into text with ``processing_class.batch_decode``: the d1
  worker's tokenizer instance gets ``SudokuTask.decode`` as its ``batch_decode``, so d1's reward function receives
  the same text. (d1's own ``sudoku_reward_func`` reads the grid from ``<answer>`` tags of its chat prompt, a format
  a random model never writes.)
- objective: d1's one-step log-likelihood (the whole completion masked, each prompt token masked with probability
  ``p_mask_prompt`` 0.15, a fresh prompt mask per inner iteration shared by the old, new and reference scores),
  token ratio clipped at ε 0.5, advantages ``R - group mean`` (no std), k3 KL toward the initial model with β 0.04
  (the LoRA adapter disabled, on both), the loss a token mean over the batch (d1's
  ``(per_token_loss * mask).sum() / mask.sum()``: dlmrl ``train.loss_type=bnpo``; the ``diffu_grpo`` preset's own is
  ``grpo``), μ = ``--num-iterations`` (12) optimizer steps per rollout batch, each on the whole batch (d1
  ``per_device_train_batch_size`` = prompts x G, ``gradient_accumulation_steps`` 1; dlmrl ``steps_per_generation`` 1).
- model: LoRA r 128, α 64, dropout 0.05 on d1's target list (``q_proj,k_proj,v_proj,o_proj,up_proj,down_proj,
  gate_proj``; on LLaDA's code ``q_proj``, ``k_proj``, ``v_proj`` and ``up_proj`` exist), float32, CPU.
- optimizer: AdamW, lr ``--lr`` (d1's 3e-6), betas 0.9/0.99, weight decay 0.1, gradient norm clipped at 0.2, constant
  learning rate (d1: ``constant_with_warmup`` with ``warmup_ratio`` 1e-4, under one step here).

What d1 needs to run here, all in the d1 worker (d1's files are not edited; each is a call-time patch):

- TRL 0.16 under ``transformers`` 5: ``transformers.utils.import_utils._is_package_available`` now returns a tuple,
  which TRL 0.16's ``trl.import_utils`` takes as true for every optional package (it then imports ``mergekit``):
  it is wrapped to return the boolean while ``trl.import_utils`` is imported. ``Trainer`` now calls
  ``_get_train_sampler(dataset)``; TRL 0.16's takes no argument (the worker's subclass accepts and drops it).
  ``GRPOTrainer.__init__`` writes ``model.warnings_issued``, an attribute ``transformers`` 5 models no longer have
  (set to ``{}``).
- ``wandb``: d1's trainer imports it at the top and uses it only with ``report_to`` wandb; a stub module stands in
  while the trainer module is imported.
- Python 3.11: d1 seeds each prompt mask with ``accelerate.utils.set_seed(tensor)``, whose ``random.seed(tensor)``
  Python 3.11 refuses (d1's env is Python 3.10, which hashed the object); the subclass passes ``int(seed)``, the
  value ``torch.manual_seed`` used, so the masks are d1's.
- CPU: d1's ``diffu_grpo_train.py`` loads LLaDA in 4-bit (bitsandbytes, CUDA) with bf16; here float32 weights, no
  quantization, ``use_cpu=True``; its ``torch.cuda.amp.autocast`` blocks and ``torch.cuda.empty_cache()`` calls are
  no-ops on a CPU build. The model is loaded with dlmrl's ``load_checkpoint_model`` (the patches LLaDA's
  ``transformers`` 4 code needs under 5) and handed to d1's trainer as ``diffu_grpo_train.py`` hands its model.
- d1's trainer needs μ > 1 whenever β > 0 (its reference scores reuse a tensor built only for μ > 1) and a LoRA
  adapter (the reference is the model with the adapter disabled): ``--num-iterations`` must be >= 2.

What is not matched, and why:

- the random numbers: the two tools draw their samples, prompt masks and LoRA initialisations from different
  generators (d1 reseeds torch's global generator with each prompt mask's seed), so the comparison of numerics is
  statistical (below), not bit for bit.
- the Gumbel noise's precision: d1 draws it in the model's dtype (float32 here), dlmrl in float64.
- LoRA dropout (0.05) outside the updates: ``Trainer.training_step`` calls ``model.train()`` before TRL's
  ``_prepare_inputs``, so d1 samples its completions and computes its old and reference scores with dropout on, and
  its first update's ratio is not exactly 1; dlmrl samples and scores the old and reference log-probs with dropout
  off (eval mode) and takes the first update's old log-probs from that update's own pass, detached (ratio 1), as
  TRL does for μ = 1. Dropout applies in every update on both sides. This changes the numerics (d1's KL runs higher
  in 2 of 3 seeds), not the passes timed.
- two settings of d1's ``slurm_scripts/train.yaml`` are not carried over, neither of which changes the work here:
  ``sync_ref_model`` (every 64 steps: under LoRA TRL 0.16 keeps no reference model to sync, ``ref_model`` is None)
  and ``generation_batch_size`` 6 (here the whole rollout batch, prompts x G = 12, in one sampling call on both
  sides, which if anything favours d1).
- the step's timing boundary: dlmrl's ``seconds_step`` (``metrics.jsonl``) spans sampling, rewards, old and reference
  scoring and the μ optimizer steps of one rollout batch; d1's rollout batch is μ TRL steps, each timed between the
  ``on_step_begin`` and ``on_step_end`` callbacks (the first holds the generation, rewards and scoring), summed. The
  first rollout batch of each run is left out as warm-up on both sides.

How the numerics are judged: each repeat ``r`` uses seed ``--seed + r`` on both sides (dlmrl ``train.seed``, d1
``seed``) and the prompts of that seed. Per side the script reports the mean over repeats of the mean reward over
the rollouts, of the mean KL over the rollouts (d1's per optimizer step KL averaged over each rollout's μ steps, as
dlmrl averages its inner iterations) and of the mean gradient norm (before clipping), with the standard deviation
over repeats; the tools agree when their means differ by at most 2 standard errors of the difference. With one
repeat there is no verdict.

Writes ``benchmarks/results/peers_d1_diffu_grpo.json`` (``--output``): command, d1, TRL and LLaDA-code commits, dlmrl
commit, machine (with the 1-minute load average before the run), settings, per-repeat numbers (each run with the load
average after it) and the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "peers")]  # (however it is loaded)
from bench_io import write_result
from peer_common import (
    add_run_options,
    agreement,
    agreement_line,
    check_run_options,
    dlmrl_commit,
    git,
    machine,
    number,
    ratio_line,
    run_worker,
    set_threads,
    step_recorder,
)

CONFIG = ROOT / "configs" / "diffu_grpo_sudoku_tiny.yaml"
TRAINER = Path("diffu-grpo") / "diffu_grpo_trainer.py"
D1_TRL_COMMIT = "0f88c179e30b3439467942a08c3190f624d5c423"  # d1's env.yml: trl @ git+...@0f88c17 (0.16.0.dev0)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj")  # diffu_grpo_train.py
MASK_ID = 126336
CELLS = 16


# -- the settings both sides run -----------------------------------------------------------------------------------
def settings(args) -> dict:
    """The run's settings as plain values: d1's (``slurm_scripts/train.yaml``, ``run.sh``'s μ, ``DiffuGRPOConfig``'s
    defaults), shrunk to the tiny Sudoku work where noted; both workers read their options from this one dict."""
    return {
        "prompts_per_step": args.prompts, "num_generations": 6, "num_iterations": args.num_iterations,
        "gen_length": CELLS, "block_length": 8, "diffusion_steps": 8,  # (d1: 256, 32, 128: 2 tokens per step)
        "temperature": 0.9, "remasking": "low_confidence", "cfg_scale": 0.0, "p_mask_prompt": 0.15,
        "epsilon": 0.5, "beta": 0.04, "loss": "token mean over the batch (dlmrl bnpo)",
        "learning_rate": args.lr, "adam_betas": [0.9, 0.99], "weight_decay": 0.1, "max_grad_norm": 0.2,
        "lr_schedule": "constant", "lora_r": 128, "lora_alpha": 64, "lora_dropout": 0.05,
        "lora_target_modules": list(LORA_TARGETS), "dtype": "float32", "device": "cpu",
    }


def dlmrl_overrides(s: dict, steps: int, seed: int, ckpt: str, out_dir: str) -> list[str]:
    """``dlmrl train`` overrides of ``configs/diffu_grpo_sudoku_tiny.yaml`` that give it the settings ``s``."""
    return [f"model.name_or_path={ckpt}", "model.trust_remote_code=true", "model.family=llada",
            f"model.dtype={s['dtype']}", "model.use_peft=true", f"model.lora_r={s['lora_r']}",
            f"model.lora_alpha={s['lora_alpha']}", f"model.lora_dropout={s['lora_dropout']}",
            f"model.lora_target_modules={','.join(s['lora_target_modules'])}", "task.answer_mode=full",
            f"sampling.gen_length={s['gen_length']}", f"sampling.block_length={s['block_length']}",
            f"sampling.steps={s['diffusion_steps']}", f"sampling.temperature={s['temperature']}",
            f"sampling.remasking={s['remasking']}", f"sampling.cfg_scale={s['cfg_scale']}",
            "estimator.name=one_step", f"estimator.p_mask_prompt={s['p_mask_prompt']}", "estimator.samples_per_node=1",
            "train.algorithm=diffu_grpo", f"train.max_steps={steps}", f"train.seed={seed}",
            f"train.prompts_per_step={s['prompts_per_step']}", f"train.num_generations={s['num_generations']}",
            f"train.num_iterations={s['num_iterations']}", "train.steps_per_generation=1",
            f"train.epsilon={s['epsilon']}", f"train.beta={s['beta']}", "train.loss_type=bnpo",
            f"train.learning_rate={s['learning_rate']}",
            f"train.lr_scheduler_type={s['lr_schedule']}", "train.warmup_steps=0",
            f"train.adam_beta1={s['adam_betas'][0]}", f"train.adam_beta2={s['adam_betas'][1]}",
            f"train.weight_decay={s['weight_decay']}", f"train.max_grad_norm={s['max_grad_norm']}",
            "train.collapse_window=0", f"train.save_steps={steps + 1000}", "eval.before=false", "eval.after=false",
            f"output_dir={out_dir}"]


def d1_config_kwargs(s: dict, steps: int, seed: int, out_dir: str) -> dict:
    """``DiffuGRPOConfig`` keyword arguments that give d1's trainer the settings ``s`` (``steps`` rollout batches:
    ``steps * μ`` TRL optimizer steps)."""
    batch = s["prompts_per_step"] * s["num_generations"]
    return {
        "output_dir": out_dir, "max_steps": steps * s["num_iterations"], "seed": seed, "use_cpu": True,
        "bf16": False, "fp16": False, "report_to": "none", "save_strategy": "no", "logging_steps": 1,
        "per_device_train_batch_size": batch, "gradient_accumulation_steps": 1, "generation_batch_size": batch,
        "num_generations": s["num_generations"], "num_iterations": s["num_iterations"],
        "max_completion_length": s["gen_length"], "max_prompt_length": None, "block_length": s["block_length"],
        "diffusion_steps": s["diffusion_steps"], "temperature": s["temperature"], "remasking": s["remasking"],
        "cfg_scale": s["cfg_scale"], "p_mask_prompt": s["p_mask_prompt"], "random_masking": True,
        "mask_id": MASK_ID, "beta": s["beta"], "epsilon": s["epsilon"], "learning_rate": s["learning_rate"],
        "lr_scheduler_type": s["lr_schedule"], "warmup_steps": 0, "adam_beta1": s["adam_betas"][0],
        "adam_beta2": s["adam_betas"][1], "weight_decay": s["weight_decay"], "max_grad_norm": s["max_grad_norm"],
        "gradient_checkpointing": False, "dataloader_num_workers": 0, "log_completions": False,
    }


# -- the checkpoint ------------------------------------------------------------------------------------------------
def swap_digit_rows(head, top_ids: list[int], digit_ids: list[int]) -> list[tuple[int, int]]:
    """Exchange rows ``top_ids[i]`` and ``digit_ids[i]`` of the output head's ``(V, d)`` weight in place (the pairs
    that already coincide, or whose top token is another digit of the list, are left); returns the exchanged pairs.

    Raises:
        ValueError: lists of different lengths, or an id outside the head's rows.
    """
    import torch

    if len(top_ids) != len(digit_ids):
        raise ValueError(f"{len(top_ids)} top tokens for {len(digit_ids)} digits")
    rows = head.weight.shape[0]
    if any(not 0 <= i < rows for i in [*top_ids, *digit_ids]):
        raise ValueError(f"a token id outside the head's {rows} rows: {top_ids}, {digit_ids}")
    pairs = [(t, d) for t, d in zip(top_ids, digit_ids) if t != d and t not in digit_ids]
    with torch.no_grad():
        for t, d in pairs:
            head.weight[[t, d]] = head.weight[[d, t]].clone()
    return pairs


def most_probable_tokens(model, prompt_ids, k: int, temperature: float) -> list[int]:
    """The ``k`` token ids with the largest mean probability (softmax of logits / ``temperature``) over the
    completion positions when each ``(B, P)`` prompt is followed by ``CELLS`` mask tokens (LLaDA's first denoising
    step)."""
    import torch

    x = torch.cat([prompt_ids, torch.full((prompt_ids.shape[0], CELLS), MASK_ID, dtype=prompt_ids.dtype)], 1)
    with torch.no_grad():
        p = (model(x).logits[:, -CELLS:].float() / temperature).softmax(-1)  # (B, CELLS, V)
    return p.mean((0, 1)).topk(k).indices.tolist()


def build_sudoku_checkpoint(clone: Path, out: Path, temperature: float) -> dict:
    """The tiny LLaDA checkpoint of ``clone``'s code with the head rows of the digits 1-4 exchanged
    (:func:`swap_digit_rows`); what was exchanged and the code's commit."""
    import torch
    from remote_code_checkpoints import build_checkpoint, find_code
    from transformers import AutoTokenizer

    from dlmrl.data.tasks import SudokuTask
    from dlmrl.models.compat import load_checkpoint_model

    found = find_code([clone], ("llada",))
    if "llada" not in found:
        raise SystemExit(f"{clone} holds no configuration_llada.py + modeling_llada.py (LLaDA's model code)")
    source = found["llada"]
    build_checkpoint(source, out)
    model = load_checkpoint_model(str(out), True, torch.float32, "AutoModel").eval()
    tok = AutoTokenizer.from_pretrained(out)
    task = SudokuTask(tok, MASK_ID, answer_mode="full")
    examples = task.train_batch(32, 12345, 0)  # (a fixed set, drawn from a seed no run uses)
    ids = task.encode(examples).prompt_ids
    vocab = tok.get_vocab()
    digits = [vocab[str(d)] for d in range(1, 5)]
    top = most_probable_tokens(model, ids, 4, temperature)
    pairs = swap_digit_rows(model.get_output_embeddings(), top, digits)
    config = (out / "config.json").read_text()
    model.save_pretrained(out, safe_serialization=True)
    (out / "config.json").write_text(config)  # (the release's fields, as build_checkpoint wrote them)
    return {"code": f"{source.folder.relative_to(clone)} (configuration_llada.py, modeling_llada.py)",
            "commit": source.commit, "swapped_rows": pairs,
            "swapped_tokens": [[tok.convert_ids_to_tokens(t), tok.convert_ids_to_tokens(d)] for t, d in pairs]}


# -- the dlmrl worker ------------------------------------------------------------------------------------------------
def run_dlmrl_worker(args) -> dict:
    """One dlmrl run (``dlmrl train`` in this process); per rollout batch: seconds, reward, KL, gradient norm."""
    set_threads(args.threads)
    from dlmrl.cli import main as dlmrl_main

    s = settings(args)
    with tempfile.TemporaryDirectory(prefix="peers_d1_dlmrl_") as tmp:
        out_dir = str(Path(tmp) / "run")
        argv = ["train", "--config", str(CONFIG), "--no-progress",
                *dlmrl_overrides(s, args.steps, args.seed, args.checkpoint, out_dir)]
        rc = dlmrl_main(argv)
        if rc:
            raise SystemExit(f"dlmrl train failed (exit {rc}): dlmrl {' '.join(argv)}")
        rows = [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines() if line]
    rows = [r for r in rows if "seconds_step" in r]
    return {"tool": "dlmrl", "seconds_rollout": [r["seconds_step"] for r in rows],
            "reward": [r["reward_mean"] for r in rows], "kl": [r.get("kl") for r in rows],
            "grad_norm": [r.get("grad_norm") for r in rows], "loss": [r.get("loss") for r in rows],
            "seconds_parts": [{"sampling_and_rewards": r.get("seconds_rollout"),
                               "old_scores": r.get("seconds_scoring_old"), "updates": r.get("seconds_update")}
                              for r in rows],
            "command": "dlmrl " + " ".join(a for a in argv if not a.startswith(("output_dir=", "model.name_or_path=")))}


# -- the d1 worker ---------------------------------------------------------------------------------------------------
def import_d1_trainer():
    """d1's ``DiffuGRPOTrainer`` and ``DiffuGRPOConfig`` (``diffu-grpo/`` and TRL 0.16 on ``sys.path``), imported
    with the call-time patches the module docstring lists; the worker's subclass of the trainer."""
    import types

    import transformers.utils.import_utils as hf_imports

    original = hf_imports._is_package_available

    def as_boolean(name, return_version=False):  # (transformers 4's contract, which TRL 0.16 relies on)
        found = original(name, return_version=True)
        return found if return_version else found[0]

    hf_imports._is_package_available = as_boolean
    try:
        import trl.import_utils  # (binds the boolean form)
    finally:
        hf_imports._is_package_available = original
    import trl.trainer.grpo_trainer  # noqa: F401  (accelerate checks wandb's spec on import: before the stub)

    sys.modules["wandb"] = types.ModuleType("wandb")
    try:
        from diffu_grpo_config import DiffuGRPOConfig
        from diffu_grpo_trainer import DiffuGRPOTrainer
    finally:
        del sys.modules["wandb"]

    class Peer(DiffuGRPOTrainer):
        def _get_train_sampler(self, dataset=None):  # (transformers 5 passes the dataset; TRL 0.16 reads its own)
            return super()._get_train_sampler()

        def forward_process(self, batch, prompt_index, mask_id, seed=None):  # (Python 3.11: random.seed(tensor))
            return super().forward_process(batch, prompt_index, mask_id, seed=None if seed is None else int(seed))

    return Peer, DiffuGRPOConfig


def sampler_order(n: int, seed: int) -> list[int]:
    """The dataset order TRL 0.16's ``RepeatRandomSampler(seed=seed)`` visits: ``torch.randperm(n)`` of a
    ``torch.Generator`` seeded with ``seed``."""
    import torch

    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()


def place_for_sampler(items: list, seed: int) -> list:
    """``items`` arranged so that :func:`sampler_order` visits them in their own order: ``placed[order[i]] =
    items[i]``."""
    order = sampler_order(len(items), seed)
    placed = [None] * len(items)
    for i, j in enumerate(order):
        placed[j] = items[i]
    return placed


def sudoku_cell_accuracy(prompts, completions, puzzle, solution, **_):
    """d1-side reward function (d1's signature): dlmrl's Sudoku cell accuracy of each completion's text."""
    from dlmrl.rewards.sudoku import sudoku_reward

    return sudoku_reward(None, list(completions), puzzle=list(puzzle), solution=list(solution))


def run_d1_worker(args) -> dict:
    """One d1 run (``DiffuGRPOTrainer.train`` in this process); per rollout batch (μ TRL steps): seconds summed,
    reward, mean KL and gradient norm over its steps."""
    set_threads(args.threads)
    Peer, DiffuGRPOConfig = import_d1_trainer()
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer

    from dlmrl.data.tasks import SudokuTask
    from dlmrl.models.compat import load_checkpoint_model

    s = settings(args)
    model = load_checkpoint_model(args.checkpoint, True, torch.float32, "AutoModel")
    model.config.use_cache = False
    model.warnings_issued = {}  # (transformers 4's attribute, which TRL 0.16 writes)
    tok = AutoTokenizer.from_pretrained(args.checkpoint)
    tok.pad_token = tok.eos_token  # (diffu_grpo_train.py)
    task = SudokuTask(tok, MASK_ID, answer_mode="full")
    tok.batch_decode = lambda ids, **_: task.decode(torch.as_tensor(ids))  # (the text dlmrl's reward reads)
    p = s["prompts_per_step"]
    examples = [e for step in range(args.steps) for e in task.train_batch(p, args.seed, step)]
    prompts = [tok.bos_token + e.puzzle + "=" for e in examples]
    ours = task.encode(examples[:p]).prompt_ids.tolist()
    theirs = tok(text=prompts[:p], padding=True, padding_side="left", add_special_tokens=False)["input_ids"]
    if ours != theirs:  # (d1's _generate_and_score_completions call)
        raise RuntimeError(f"d1's prompt ids differ from dlmrl's: {theirs[0]} vs {ours[0]}")
    rows = [{"prompt": q, "puzzle": e.puzzle, "solution": e.solution} for q, e in zip(prompts, examples)]
    data = Dataset.from_list(place_for_sampler(rows, args.seed))

    peft_config = LoraConfig(r=s["lora_r"], lora_alpha=s["lora_alpha"], lora_dropout=s["lora_dropout"],
                             target_modules=list(s["lora_target_modules"]), task_type="CAUSAL_LM")
    with tempfile.TemporaryDirectory(prefix="peers_d1_d1_") as tmp:
        config = DiffuGRPOConfig(**d1_config_kwargs(s, args.steps, args.seed, tmp))
        record = step_recorder("kl")
        trainer = Peer(model=model, reward_funcs=[sudoku_cell_accuracy], args=config, train_dataset=data,
                       processing_class=tok, peft_config=peft_config, callbacks=[record])
        order, g, mu = list(trainer._get_train_sampler()), s["num_generations"], s["num_iterations"]
        visited = [data[order[c * p * g * mu + j * g]]["puzzle"] for c in range(args.steps) for j in range(p)]
        if visited != [e.puzzle for e in examples]:
            raise RuntimeError("TRL's sampler does not visit dlmrl's prompts in order (RepeatRandomSampler changed?)")
        trainer.train()
    logs = record.logs
    mu = s["num_iterations"]
    return {"tool": "d1", "seconds_step": record.seconds, "seconds_rollout": rollout_seconds(record.seconds, mu),
            "seconds_parts": [{"first_step": record.seconds[i], "other_steps": sum(record.seconds[i + 1:i + mu])}
                              for i in range(0, len(record.seconds), mu)],
            "reward": [g["reward"] for g in logs if "reward" in g],
            "kl": per_rollout_mean([g["kl"] for g in logs], mu),
            "grad_norm": per_rollout_mean([g.get("grad_norm") for g in logs], mu),
            "loss": per_rollout_mean([g.get("loss") for g in logs], mu)}


def rollout_seconds(step_seconds: list[float], mu: int) -> list[float]:
    """d1's per-optimizer-step seconds summed over each rollout batch's μ steps.

    Raises:
        ValueError: a count of steps that is not a multiple of μ.
    """
    if len(step_seconds) % mu:
        raise ValueError(f"{len(step_seconds)} steps are not whole rollout batches of {mu}")
    return [sum(step_seconds[i:i + mu]) for i in range(0, len(step_seconds), mu)]


def per_rollout_mean(values: list[float | None], mu: int) -> list[float | None]:
    """The mean of each rollout batch's μ per-step values (None where one is missing)."""
    out = []
    for i in range(0, len(values), mu):
        chunk = values[i:i + mu]
        out.append(None if any(v is None for v in chunk) or len(chunk) < mu else statistics.fmean(chunk))
    return out


# -- the driver ----------------------------------------------------------------------------------------------------
def clone_error(d1: Path, llada_code: Path, trl: Path | None) -> str | None:
    """Why the folders cannot serve (None when they can)."""
    if not (d1 / TRAINER).is_file():
        return (f"{d1} has no {TRAINER}: pass the root of a clone of dllm-reasoning/d1 "
                "(git clone https://github.com/dllm-reasoning/d1)")
    if not any(llada_code.rglob("modeling_llada.py")):
        return (f"{llada_code} holds no modeling_llada.py: pass a clone with LLaDA's model code "
                "(git clone https://github.com/NVlabs/Fast-dLLM: llada/model/)")
    if trl is not None and not (trl / "trl" / "trainer" / "grpo_trainer.py").is_file():
        return (f"{trl} is not a TRL checkout (no trl/trainer/grpo_trainer.py): git clone "
                f"https://github.com/huggingface/trl trl-d1 && git -C trl-d1 checkout {D1_TRL_COMMIT[:12]}")
    return None


def d1_env(args) -> dict:
    """The d1 worker's environment: the TRL checkout (if given) and d1's ``diffu-grpo/`` first on ``PYTHONPATH``."""
    paths = ([str(args.trl.resolve())] if args.trl else []) + [str((args.d1 / "diffu-grpo").resolve()), str(ROOT)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")])}


def trl_identity(args) -> dict:
    """The TRL the d1 worker imports: version, folder, commit when a git checkout."""
    code = "import trl, os; print(trl.__version__); print(os.path.dirname(trl.__file__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=d1_env(args), check=False)
    if out.returncode != 0:
        raise SystemExit("the d1 worker cannot import trl: pass --trl (a checkout of huggingface/trl at d1's pin "
                         f"{D1_TRL_COMMIT[:12]}) or put a TRL 0.16 on PYTHONPATH\n{out.stderr[-2000:]}")
    version, where = out.stdout.split("\n")[:2]
    return {"version": version, "path": where, "commit": git(Path(where), "rev-parse", "HEAD")}


def run_worker_subprocess(tool: str, args, seed: int) -> dict:
    """This file with ``--worker tool`` in a fresh Python process; its JSON result."""
    argv = [str(args.d1.resolve()), "--llada-code", str(args.llada_code.resolve()), "--worker", tool,
            "--checkpoint", args.checkpoint, "--steps", str(args.steps), "--seed", str(seed), "--lr", str(args.lr),
            "--num-iterations", str(args.num_iterations), "--prompts", str(args.prompts)]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    return run_worker(Path(__file__), argv, tool, d1_env(args) if tool == "d1" else dict(os.environ))


def per_run_summary(run: dict) -> dict:
    """A worker's numbers: median seconds per rollout batch without the first (warm-up), means over the rollouts of
    the reward, the KL and the gradient norm."""
    timed = run["seconds_rollout"][1:]

    def mean(key):
        vals = run.get(key) or []
        return None if not vals or any(v is None for v in vals) else statistics.fmean(vals)

    parts = run.get("seconds_parts", [])[1:]
    return {"median_seconds_rollout": statistics.median(timed) if timed else None,
            "median_seconds_parts": {k: statistics.median(p[k] for p in parts) for k in parts[0]} if parts else None,
            "mean_reward": mean("reward"),
            "mean_kl": mean("kl"), "mean_grad_norm": mean("grad_norm")}


QUANTITIES = (("mean_reward", "mean reward over the rollouts"), ("mean_kl", "mean KL over the rollouts"),
              ("mean_grad_norm", "mean gradient norm (before clipping)"))


def summarize(repeats: list[dict]) -> dict:
    """Per tool the median seconds per rollout batch (over every timed rollout of every repeat), the per-repeat
    ratio dlmrl / d1 of the medians as min / median / max, and the agreement of each of :data:`QUANTITIES`."""
    timed = {t: [x for r in repeats for x in r[t]["seconds_rollout"][1:]] for t in ("dlmrl", "d1")}
    ratios = [r["ratio"] for r in repeats if r["ratio"] is not None]
    out = {"median_seconds_rollout": {t: statistics.median(v) if v else None for t, v in timed.items()},
           "ratio_dlmrl_over_d1": {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios)}
           if ratios else None}
    for key, _ in QUANTITIES:
        out[key] = agreement([r["dlmrl"]["summary"][key] for r in repeats], [r["d1"]["summary"][key] for r in repeats],
                             "d1")
    return out


def format_summary(summary: dict, steps: int, mu: int) -> str:
    med, ratio = summary["median_seconds_rollout"], summary["ratio_dlmrl_over_d1"]
    lines = [(f"median s per rollout batch (μ {mu} optimizer steps; batches 2..{steps}): dlmrl "
              f"{number(med['dlmrl'], '{:.3f}')}, d1 {number(med['d1'], '{:.3f}')}"),
             *ratio_line(ratio, "d1", " (seconds)")]
    lines += [agreement_line(label, summary[key], "d1", "d1") for key, label in QUANTITIES]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Needs clones of dllm-reasoning/d1, of LLaDA's model code (NVlabs/Fast-dLLM) "
                                       f"and TRL at d1's pin {D1_TRL_COMMIT[:12]} (--trl).")
    p.add_argument("d1", type=Path, help="a clone of dllm-reasoning/d1 (holds diffu-grpo/diffu_grpo_trainer.py)")
    p.add_argument("--llada-code", type=Path, required=True,
                   help="a clone holding LLaDA's configuration_llada.py + modeling_llada.py (NVlabs/Fast-dLLM)")
    p.add_argument("--trl", type=Path, default=None,
                   help=f"a TRL checkout for the d1 worker's PYTHONPATH (d1's pin: {D1_TRL_COMMIT[:12]})")
    add_run_options(p, worker="d1", peer="d1", steps=4, units="rollout batches", lr=3e-6, lr_source="d1's ")
    p.add_argument("--num-iterations", type=int, default=12,
                   help="μ: optimizer steps per rollout batch (default 12, d1's run.sh); >= 2 (d1 needs it with "
                        "β > 0)")
    p.add_argument("--prompts", type=int, default=2, help="prompts per rollout batch, x G 6 completions (default 2: "
                                                          "d1's 6 per device x 2 accumulation steps)")
    p.add_argument("--work", type=Path, default=None, help="folder for the tiny checkpoint (default: a temp dir)")
    p.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "peers_d1_diffu_grpo.json"),
                   help="the result JSON (default benchmarks/results/peers_d1_diffu_grpo.json)")
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    check_run_options(p, args, "rollout batch")
    if args.num_iterations < 2:
        p.error("--num-iterations must be >= 2: d1's trainer computes its reference scores only for μ > 1 (β 0.04)")
    if args.prompts < 1:
        p.error("--prompts must be >= 1")
    if not args.worker:
        why = clone_error(args.d1, args.llada_code, args.trl)
        if why:
            p.error(why)
    return args


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.worker:
        result = run_dlmrl_worker(args) if args.worker == "dlmrl" else run_d1_worker(args)
        Path(args.worker_out).write_text(json.dumps(result))
        return None
    from remote_code_check import prepare_work

    work, _ = prepare_work(args.work, "peers_d1_")  # (HF_MODULES_CACHE inside it, before transformers is imported)
    trl = trl_identity(args)
    ckpt = build_sudoku_checkpoint(args.llada_code.resolve(), work / "llada_tiny_sudoku", settings(args)["temperature"])
    args.checkpoint = str(work / "llada_tiny_sudoku")
    print(f"checkpoint: {args.checkpoint} (head rows exchanged: {ckpt['swapped_tokens']})", flush=True)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    started, repeats = time.time(), []
    for r in range(args.repeats):
        seed = args.seed + r
        pair = {"repeat": r, "seed": seed, "order": "dlmrl first" if r % 2 == 0 else "d1 first"}
        for tool in (("dlmrl", "d1") if r % 2 == 0 else ("d1", "dlmrl")):
            run = run_worker_subprocess(tool, args, seed)
            run["summary"] = per_run_summary(run)
            run["load_average_1min_after"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
            pair[tool] = run
            sm = run["summary"]
            parts = ", ".join(f"{k} {v:.2f}" for k, v in (sm["median_seconds_parts"] or {}).items())
            print(f"repeat {r} {tool}: median {sm['median_seconds_rollout']:.3f} s per rollout batch ({parts}), mean "
                  f"reward {sm['mean_reward']:.4f}, mean KL {sm['mean_kl']:.3g}, mean grad norm "
                  f"{sm['mean_grad_norm']:.4f}", flush=True)
        d, t = pair["dlmrl"]["summary"]["median_seconds_rollout"], pair["d1"]["summary"]["median_seconds_rollout"]
        pair["ratio"] = d / t if d and t else None
        repeats.append(pair)
    summary = summarize(repeats)
    print(format_summary(summary, args.steps, args.num_iterations))
    import torch
    import transformers

    result = {
        "benchmark": "peers_d1_diffu_grpo",
        "command": " ".join(["python", "benchmarks/peers/d1_diffu_grpo_step.py",
                             *(sys.argv[1:] if argv is None else [str(a) for a in argv])]),
        "d1": {"commit": git(args.d1, "rev-parse", "HEAD"), "trainer": str(TRAINER)},
        "trl": {**trl, "d1_pin": D1_TRL_COMMIT}, "llada_code": ckpt, "dlmrl_commit": dlmrl_commit(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "machine": {**machine(args.threads), "load_average_1min_before": load_before},
        "settings": {**settings(args), "steps": args.steps, "repeats": args.repeats, "seed": args.seed},
        "seconds": round(time.time() - started, 1), "summary": summary, "repeats": repeats,
    }
    write_result(args.output, result)
    return result


if __name__ == "__main__":
    main()
