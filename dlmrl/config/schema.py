"""The config schema: nested dataclasses whose field docs are the ``--help`` text.

Option names follow TRL's ``GRPOConfig`` where one exists.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_TRAIN_CONFIG = "gdpo_sudoku_tiny.yaml"


def default_config_path(name: str = DEFAULT_TRAIN_CONFIG) -> Path:
    """The packaged recipe ``dlmrl/recipes/<name>`` (``dlmrl train`` with no ``--config`` runs it)."""
    from importlib import resources

    return Path(str(resources.files("dlmrl") / "recipes" / name))


#: transformers schedules that need nothing beyond warm-up and total steps.
SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
              "inverse_sqrt")


def doc(default: Any, help: str, **kw) -> Any:
    """A dataclass field with a help string (shown by ``dlmrl <cmd> --help``)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


#: the collapse monitor's directions (``train.collapse_direction``; :mod:`dlmrl.training.collapse`)
COLLAPSE_DIRECTIONS = ("rise", "fall", "both")

@dataclass
class ModelConfig:
    kind: str = doc("diffusion", "Policy kind: diffusion (masked-diffusion LM: sampler + ELBO estimator) | block "
                                 "(block diffusion: blocks of model.block_size written left to right, denoised inside, "
                                 "exact key/value cache, one-pass composite likelihoods) | ar (causal LM: generate + "
                                 "exact token log-probs; task.answer_mode full) | uniform (DiffusionGemma: uniform-"
                                 "noise, self-conditioned block diffusion; its entropy-bounded sampler, the "
                                 "trajectory likelihood or uniform_* ELBO estimators), or a kind a plugin registers "
                                 "(dlmrl list kinds; dlmrl.kinds).")
    name_or_path: str = doc("tiny-sudoku", "Checkpoint: local folder, hub id, or 'tiny-sudoku' (shipped diffusion "
                                           "default) / 'tiny-sudoku-ar' (shipped AR default).")
    family: str = doc("auto", "Family adapter (diffusion, block): auto | llada | dream | masked_lm | tiny | sdar | llada2 "
                              "| llada_moe | nemotron_diffusion | fast_dllm_v2 (dlmrl list families); auto reads "
                              "config.json (model_type / architectures / auto_map), a name overrides it.")
    block_size: int | None = doc(None, "model.kind block: tokens per block B (block-causal attention: bidirectional "
                                       "inside a block, causal across blocks; B = gen_length is full diffusion, B = 1 "
                                       "autoregressive); null = the checkpoint's config.json block_size, else its "
                                       "family's default (llada2: 32). The sampler decodes in these blocks "
                                       "(sampling.block_length does not apply).")
    trust_remote_code: bool = doc(False, "Allow the checkpoint's own modeling code (only if you trust it).")
    dtype: str = doc("float32", "Weights dtype: float32 | bfloat16 | float16 | float64. Log-probs are computed in "
                                "float32 whatever the weights (float64 weights: in float64, for checks where "
                                "equality is the claim); a LoRA adapter stays float32 on a bfloat16 base.")
    fp32_master_weights: bool = doc(
        True, "Full fine-tuning (use_peft false) with dtype bfloat16: train float32 copies of the weights (the "
              "bfloat16 ones upcast exactly) and compute the forward in bfloat16 (torch.autocast; with train.sharding "
              "fsdp2, FSDP2's mixed-precision policy: bfloat16 all-gather, float32 gradient reduction), so AdamW "
              "updates below bfloat16's precision are kept (lr 1e-6 in bfloat16 moves ~2% of the weights). Costs 2 "
              "more bytes per weight; final_model/ holds the float32 weights. false = train the bfloat16 weights "
              "themselves. No effect with other dtypes or LoRA.")
    use_peft: bool = doc(False, "Train a LoRA adapter (peft) instead of the whole model; the KL reference is the "
                                "base with the adapter disabled (no second copy), final_model/ holds the adapter.")
    lora_r: int = doc(16, "LoRA rank r (trainable parameters: r * (in + out) per targeted linear layer).")
    lora_alpha: int = doc(32, "LoRA alpha: the adapter's update B A is scaled by alpha / r.")
    lora_dropout: float = doc(0.05, "Dropout on the LoRA branch's input (train mode only).")
    lora_target_modules: str = doc("all-linear", "Layers that get an adapter: all-linear (every linear layer but "
                                                 "the output head; model.kind uniform: the attention and dense MLP "
                                                 "of the text layers) | a comma list of module names matched as peft "
                                                 "matches them, by module-path suffix, e.g. q_proj,k_proj,v_proj or "
                                                 "self_attn.q_proj; a name no module matches is refused.")
    gradient_checkpointing: bool = doc(False, "Recompute each layer's activations in the backward pass (less "
                                              "memory, more time; same gradients).")
    architecture: dict = field(default_factory=dict, metadata={"help": (
        "The model's architecture numbers, for the memory plan (--dry-run's memory section, train.memory_budget) "
        "when model.name_or_path is a hub id, whose config.json --dry-run does not download: config.json's own "
        "keys, e.g. {model_type: sdar, hidden_size: 2048, num_hidden_layers: 28, num_attention_heads: 16, "
        "num_key_value_heads: 8, head_dim: 128, intermediate_size: 6144, vocab_size: 151936, tie_word_embeddings: "
        "false} (LLaDA's d_model, n_layers, n_heads, n_kv_heads, mlp_hidden_size; MoE: num_experts, "
        "num_experts_per_tok, moe_intermediate_size, num_shared_experts, first_k_dense_replace), and optionally "
        "name_or_path, the model they describe (another model's numbers are not used). A local folder's "
        "config.json wins. Training does not read them.")})


@dataclass
class TaskConfig:
    name: str = doc("sudoku", "Task name (see dlmrl.data.TASKS): sudoku | gsm8k | math | countdown | dataset (your "
                              "own prompts from task.dataset / task.train_file, scored by train.reward_funcs).")
    answer_mode: str = doc(
        "infill",
        "Sudoku answer format: 'infill' (given digits pre-placed on the canvas, only blanks masked and "
        "scored), 'full' (the whole 16-cell grid is generated) or 'text' (d1's reasoning prompt and a canvas of "
        "sampling.gen_length tokens with the answer inside <answer>: for instruction-tuned models such as LLaDA).",
    )
    train_file: str | None = doc(None, "Optional local training data. sudoku: d1-format CSV/JSONL (default: "
                                       "generated puzzles); gsm8k/math/countdown: a .json/.jsonl/.csv/.parquet "
                                       "file with the dataset's columns (replaces dataset/split).")
    test_file: str | None = doc(None, "Optional local held-out data, same formats. sudoku default: the shipped "
                                      "256-puzzle split; others: test_dataset/test_split. For Countdown, d1's "
                                      "countdown_cd3_test.jsonl (input/output columns) works as is.")
    min_blanks: int = doc(6, "Fewest blank cells in generated training puzzles.")
    max_blanks: int = doc(10, "Most blank cells in generated training puzzles.")
    dataset: str | None = doc(None, "gsm8k/math/countdown: hub name or local file/folder for "
                                    "datasets.load_dataset; null = the task's (gsm8k: openai/gsm8k; math: "
                                    "ankner/math-500, d1's training set; countdown: Jiayi-Pan/Countdown-Tasks-3to4).")
    subset: str | None = doc(None, "Dataset configuration name; null = the task's ('main' for openai/gsm8k).")
    split: str | None = doc(None, "Training split, slicing allowed ('train[:90%]'); null = the task's ('train'; "
                                  "countdown 'train[:-500]'). A local file's only split is 'train'.")
    test_dataset: str | None = doc(None, "Held-out dataset; null = dataset, else the task's (math: "
                                         "HuggingFaceH4/MATH-500).")
    test_split: str | None = doc(None, "Held-out split; null = the task's ('test'; countdown 'train[-500:]', "
                                       "disjoint from its training split).")
    prompt_template: str = doc("d1", "gsm8k/math/countdown training prompts: d1 (d1's RL prompts) | d1_eval (d1's "
                                     "evaluation prompts: \\boxed{} inside <answer>, the answer starts after "
                                     "<reasoning>) | plain | a format string over {question} (countdown also "
                                     "{nums}, {target}).")
    test_prompt_template: str | None = doc(None, "Held-out prompts, same choices; null = prompt_template.")
    chat_template: str = doc("auto", "Wrap prompts in the tokenizer's chat template (with the generation prompt): "
                                     "auto (when the tokenizer has one) | on | off (plain text).")
    format_rewards: str = doc("none", "Format rewards added to correctness: none | d1 (d1's set: gsm8k xmlcount, "
                                      "soft_format, strict_format, int_format; math boxed_in_answer; countdown "
                                      "none) | a comma list of those names.")
    num_numbers: int = doc(0, "countdown: keep only problems with this many numbers (d1 trains on 3); 0 = all.")
    verify_timeout: float = doc(1.0, "math: seconds math-verify may spend on one answer (in a worker process, "
                                     "killed past it; the answer then scores 0).")
    verify_workers: int = doc(2, "math: math-verify worker processes (a thread-safe pool; 2 keeps one serving "
                                 "while a killed one restarts).")
    prompt_column: str = doc("prompt", "dataset: the column holding each prompt, plain text or chat messages "
                                       "[{role, content}, ...] (rendered with the tokenizer's chat template); the "
                                       "other columns reach the reward functions as keyword arguments.")
    num_proc: int | None = doc(None, "Processes datasets.load_dataset uses to prepare data; null = one.")
    cache_dir: str | None = doc(None, "datasets cache folder; null = datasets' default "
                                      "(~/.cache/huggingface/datasets).")
    options: dict = field(default_factory=dict, metadata={"help": (
        "Settings of the named task by the field names of its options class (dlmrl.data.Task.options_class), over "
        "the flat task keys above: a task you register takes its settings here, e.g. task.options.max_digits=3.")})


@dataclass
class SamplingConfig:
    gen_length: int = doc(16, "Canvas length L in tokens (16 cells for 4x4 Sudoku).")
    block_length: int = doc(16, "Block length for semi-autoregressive decoding; must divide gen_length.")
    steps: int = doc(4, "Total denoising steps (forward passes) per rollout canvas; must split evenly over blocks "
                        "(model.kind uniform: the most denoising steps per canvas).")
    temperature: float = doc(1.0, "Rollout sampling temperature (0 = greedy). Gumbel noise is float64.")
    remasking: str = doc("low_confidence", "Which masked positions to reveal: low_confidence | random | "
                                           "left_to_right (an autoregressive order, as JustGRPO's rollouts).")
    cfg_scale: float = doc(0.0, "Classifier-free guidance scale s (0 = off).")
    threshold: float | None = doc(
        None, "Threshold parallel decoding (Fast-dLLM, arXiv 2505.22618): each step reveals every masked position of "
              "the block whose confidence (the drawn token's probability under the model's full softmax) is >= "
              "this, at least the most confident one; null = off (the steps schedule). 0 < threshold <= 1; needs "
              "remasking low_confidence. A block then runs until decoded (1 to block_length steps, data-dependent; "
              "steps is unused, any integer >= 1, except for DaGRPO's anchors); the run logs nfe_sampling, the "
              "mean forward passes per completion. Rollouts only: evaluation decodes with eval.steps.")
    threshold_factor: float | None = doc(
        None, "Fast-dLLM's factor rule instead of a fixed threshold: each step reveals the longest run of the most "
              "confident masked positions whose n-th has confidence >= 1 - f / (n + 1), at least one; null = off. "
              "> 0; not with threshold; same step count rules as threshold.")
    sub_block_size: int | None = doc(
        None, "model.kind block: decode each block in sub-blocks of this many positions, left to right (Fast-dLLM v2's "
              "small_block_size, 8 in its generate): a threshold step chooses only among the current sub-block's "
              "masked positions, a scheduled step reveals its tokens in (sub-block, confidence) order; rollouts and "
              "evaluation. null = the whole block at once. An integer from 1 to model.block_size.")
    causal_context: bool | None = doc(
        None, "model.kind block: attend the prompt and the finished blocks token-causally, as an autoregressive model, "
              "and take a block's first token from the output before it (Nemotron-Labs-Diffusion's "
              "generate(causal_context=True), its default), instead of block-causally (false); rollouts, evaluation "
              "and the likelihoods alike (the policy's layout). null = the family's default: true for "
              "nemotron_diffusion, false for the others; true only on a family trained that way (nemotron_diffusion).")
    cache: str = doc(
        "none", "Block caching (Fast-dLLM, arXiv 2505.22618): none | prefix | dual. A block's first pass runs over "
                "the whole sequence and keeps the keys/values before the block (prefix) or outside it (dual); its later "
                "passes feed only the block (and, for prefix, what follows). An approximation for a bidirectional "
                "model (the cached states are stale by the tokens revealed since the block's first pass): the "
                "rollout log-probs are those of the logits used; with the trajectory estimator at merge 1 the run "
                "logs their gap to exact scores (rollout_logp_gap_*) and train.rollout_is_cap corrects it. Families with a cache: tiny (transformers "
                "Llama/Qwen-style models with is_causal=False) and llada (LLaDA's released code, run block by block; "
                "iLLaDA included); others are refused by name. Not with cfg_scale > 0. "
                "Rollouts only.")
    rollout_batch_size: int = doc(
        0, "Rows (completions) per sampling call on each process: a process samples its share of the rollout batch "
           "in calls of at most this many rows, which bounds the sampler's memory (activations, key/value cache, "
           "noise). Each row keeps the random numbers it has in the whole batch, so the completions, their records "
           "and the step's random state are those of one call (up to the model's floating-point batch effects). "
           "0 = the whole share in one call. Single-turn rollouts and AR episodes; not with tools inside the "
           "rollout. Evaluation batches with eval.batch_size.")
    stop_at_eos: bool | None = doc(
        None, "Diffusion kinds: a row ends at the block holding its first EOS (a finished block: model.block_size "
              "for block, sampling.block_length for diffusion); its later blocks are EOS, not decoded and not part "
              "of the completion (no score, loss or length counts them), and a sampling call stops its forward "
              "passes once all its rows have ended (threshold decoding: an ended row leaves the pass). Every block "
              "up to a row's EOS block is decoded as without the stop. null = the kind's default: block true (SDAR's "
              "generate stops there; no position attends a later block), diffusion false (LLaDA's generate decodes "
              "the whole canvas, and a bidirectional scorer would see the EOS filling where a full decode leaves its "
              "own tokens). AR rollouts always end at EOS (null or true). Single-turn rollouts only.")
    entropy_bound: float | None = doc(
        None, "model.kind uniform (DiffusionGemma): the entropy bound gamma of the sampler's acceptance rule (arXiv "
              "2505.24857: each step keeps the lowest-entropy draws whose entropies sum, minus their largest, to at "
              "most gamma; the rest is renoised); > 0; null = the checkpoint's generation_config. Other kinds refuse "
              "it.")
    t_max: float | None = doc(
        None, "model.kind uniform: the temperature of a canvas's first denoising step (the schedule falls linearly "
              "to t_min); > 0; null = the checkpoint's generation_config. Other kinds refuse it.")
    t_min: float | None = doc(
        None, "model.kind uniform: the temperature the schedule falls towards (its last step: t_min + (t_max - "
              "t_min) / steps); > 0 and < t_max; null = the checkpoint's generation_config. Other kinds refuse it.")
    stability_threshold: int | None = doc(
        None, "model.kind uniform: early stopping of a canvas once its argmax is unchanged for this many steps (and "
              "confident: confidence_threshold); integer >= 0; null = the checkpoint's generation_config. Other "
              "kinds refuse it.")
    confidence_threshold: float | None = doc(
        None, "model.kind uniform: early stopping needs the canvas's mean entropy below this; > 0; null = the "
              "checkpoint's generation_config. Other kinds refuse it.")
    draw_last_step: bool = doc(
        False, "model.kind uniform: append each canvas's last step's draw (every position a sample, scored) instead "
               "of its argmax (DiffusionGemma's generate; the argmax adds no likelihood term). Rollouts only; other "
               "kinds refuse true.")

    @property
    def adaptive(self) -> bool:
        """Whether threshold decoding is on (``threshold`` or ``threshold_factor``): the steps are data-dependent."""
        return self.threshold is not None or self.threshold_factor is not None

    @property
    def max_steps(self) -> int:
        """The most steps a rollout can take: ``steps``, or ``gen_length`` with threshold decoding (at least one
        token per step)."""
        return self.gen_length if self.adaptive else self.steps


@dataclass
class EstimatorConfig:
    name: str | None = doc(None, "Likelihood estimator for training: sdmc | coupled_sdmc | double_mc | coupled | "
                                 "stratified_coupled | one_step | trajectory | spg (model.kind uniform: trajectory | "
                                 "uniform_sdmc | uniform_double_mc | uniform_flat_ce), or a name registered by an "
                                 "--import module (dlmrl list estimators); null = the algorithm preset's "
                                 "recipe estimator (diffu_grpo: one_step, gdpo: sdmc, tracerl: trajectory), else "
                                 "sdmc. An explicit name always wins.")
    num_nodes: int = doc(3, "sdmc/coupled_sdmc: Gauss-Legendre nodes N on [0,1] (double_mc: N*K random times).")
    samples_per_node: int = doc(1, "K: masks per node (sdmc, coupled_sdmc; NFE = N*K), mask/complement pairs "
                                   "(coupled, stratified_coupled; NFE = 2K), prompt masks (one_step; NFE = K) or "
                                   "block-wise masks (spg; NFE = K, SPG uses 2).")
    masking: str = doc("exact_count", "Masking: exact_count | bernoulli | reference (GDPO's code; sdmc only).")
    stratified: bool = doc(False, "double_mc: draw one time per stratum ((k-1)/K, k/K].")
    p_mask_prompt: float = doc(0.15, "one_step: probability of masking each prompt token (d1: 0.15).")
    t_min: float = doc(0.2, "coupled: times t ~ U(t_min, t_max) (DiffuCoder: 0.2, 0.8; 0, 1 is unbiased).")
    t_max: float = doc(0.8, "coupled: upper end of the time interval.")
    merge: int = doc(1, "trajectory: consecutive sampling steps scored from one canvas (TraceRL's shrink; 1 = exact, "
                        "NFE = ceil(steps / merge)).")
    order: str = doc("sampled", "trajectory: sampled (the order the sampler took, from its record) | left_to_right "
                                "(the autoregressive chain rule, JustGRPO; NFE = L / merge; any completion).")
    eubo_beta: float = doc(1.5, "spg: Renyi order beta >= 1 of the upper bound scored on negative-advantage rows "
                                "(SPG: 1.5; 1.0 for Sudoku).")
    mix_weight: float = doc(0.5, "spg: weight omega of the upper bound on negative-advantage rows, the rest the ELBO "
                                 "(1 = SPG's pure EUBO, 0.5 its mixture).")
    mask_block_length: int = doc(0, "spg: block size of the block-wise masks (0 = sampling.block_length, as SPG).")
    self_conditioning: str = doc(
        "detached",
        "model.kind uniform, estimator trajectory: how the gradient treats each replayed step's self-conditioning "
        "input (the previous step's logits): detached (recomputed under the current weights without gradient; a "
        "canvas's steps in batched passes, which estimator.micro_batch can cut into passes of fewer steps) | "
        "through (the exact gradient of the trajectory log-prob, also through the previous steps' logits: one "
        "sequential pass with grad per canvas, its steps' graphs held together, so estimator.micro_batch must be 0 "
        "or >= sampling.steps). The log-prob values are the same. Other kinds and estimators refuse through.")
    options: dict = field(default_factory=dict, metadata={"help": (
        "Settings of the named estimator by its own field names (its class is built as cls(**options) over the "
        "keys above it reads): a registered estimator of your own takes its settings here, e.g. "
        "estimator.options.num_pairs=4.")})
    micro_batch: int = doc(
        0,
        "Most masked canvases per forward call when scoring (0 = all S*B at once; model.kind ar: rows per forward "
        "call; model.kind uniform: the trajectory's step canvases, one row's canvas at one denoising step, per "
        "forward with grad, the ELBO estimators' noise draws per denoiser call). Training uses a two-pass surrogate when the canvases do not fit in one chunk, so peak memory "
        "stays that of one chunk whatever the NFE. Several processes under FSDP or DeepSpeed run the same number "
        "of chunks (the largest share's, padded with chunks of loss weight 0) and reduce gradients on the last.",
    )
    logits_chunk: int = doc(
        0,
        "Token log-probs from the model's output head in chunks of this many scored positions (0 = off: full "
        "logits, (canvases x positions x vocabulary) float32 per forward call). Only the scored positions' final "
        "hidden states go through the head (a diffusion canvas's masked ones, an AR completion), each chunk's "
        "logits recomputed in the backward; the same values up to float rounding. Families without a head split "
        "(masked_lm) take full logits (--dry-run says which). Applies to model.kind ar too.",
    )


@dataclass
class TrainConfig:
    algorithm: str = doc("gdpo", "Algorithm preset (dlmrl list algorithms); the fields below left null use the "
                                 "preset's values.")
    learning_rate: float = doc(4e-4, "AdamW learning rate (peak).")
    weight_decay: float = doc(0.0, "AdamW weight decay.")
    adam_beta1: float = doc(0.9, "AdamW beta1.")
    adam_beta2: float = doc(0.99, "AdamW beta2.")
    lr_scheduler_type: str = doc("cosine", "LR schedule: linear | cosine | cosine_with_restarts | polynomial | constant | constant_with_warmup | inverse_sqrt.")
    warmup_steps: int = doc(5, "Warm-up of the LR schedule, in rollout steps (the schedule itself moves once per "
                               "optimizer step: num_iterations * steps_per_generation per rollout step).")
    max_grad_norm: float = doc(1.0, "Gradient clipping norm (0 = off).")
    memory_budget: Any = field(default=None, metadata={"help": (
        "Memory one process (one device) may use: bytes (an integer) or a size with a unit (80GB, 79.6GiB, 500MB; "
        "decimal kB/MB/GB/TB, binary KiB/MiB/GiB/TiB); null = no check. The config check (dlmrl train and its "
        "--dry-run) warns, naming this key, when the memory plan's peak per process exceeds it; --dry-run's memory "
        "section shows the plan term by term. Needs the model's architecture: a local config.json, or "
        "model.architecture for a hub id.")})
    rollout_is_cap: float | None = doc(
        None, "Truncated importance sampling of the rollout/training mismatch (TRL's vllm_importance_sampling_cap): "
              "each token's policy loss is multiplied by min(exp(logp_old - logp_rollout), C), detached, with "
              "logp_rollout the log-prob the sampler recorded for the token and logp_old the exact old-policy score "
              "of the same trajectory; null = off. C >= 1. Needs the trajectory estimator with merge 1 and order "
              "sampled (the only estimator that scores the sampler's own distribution) on a diffusion model, or "
              "model.kind uniform with its trajectory likelihood.")
    max_steps: int = doc(260, "Rollout steps (each: sample, reward, score, num_iterations * steps_per_generation "
                              "optimizer steps; the LR schedule spans them all).")
    prompts_per_step: int = doc(64, "Prompts per rollout step; the batch is prompts_per_step * num_generations completions.")
    num_generations: int = doc(8, "Group size G: completions per prompt.")
    num_iterations: int = doc(1, "Inner iterations mu per rollout batch, each with a fresh MaskPlan (TRL's "
                                 "num_iterations): each is one pass over the batch's steps_per_generation "
                                 "mini-batches.")
    steps_per_generation: int = doc(
        1, "Optimizer steps per pass over a rollout batch (TRL's steps_per_generation with gradient_accumulation_steps "
           "1; verl's ppo_mini_batch_size = prompts_per_step / steps_per_generation prompts): the batch's groups are "
           "shuffled (the step's seed) and cut into this many mini-batches of whole groups, each its own loss (its "
           "mean in the preset's aggregation; dapo: over its own tokens) and one optimizer step; with num_iterations "
           "mu the pass repeats mu times. The old-policy scores are the rollout policy's, taken once per batch, so "
           "from the second step on the ratio, the clip and a KL toward the old policy act. Must divide "
           "prompts_per_step.")
    epsilon: float | None = doc(None, "Clip epsilon (lower; and upper unless epsilon_high is set); null = the "
                                      "preset's (gdpo 0.5, grpo 0.2).")
    epsilon_high: float | None = doc(None, "Upper clip epsilon; null = the preset's (default: epsilon).")
    beta: float | None = doc(None, "KL coefficient beta against the frozen initial model; null = the preset's "
                                   "(gdpo 0: no reference model; grpo 0.04).")
    loss_type: str | None = doc(None, "Loss aggregation: grpo | bnpo | dapo | dr_grpo | segment_mean | sequence_sum, "
                                      "or a name a plugin registered (dlmrl list loss_types); null = the preset's.")
    max_completion_length: int | None = doc(
        None, "dr_grpo: the loss is the token sum over B * max_completion_length (TRL's name); null = the preset's, "
              "0 = the batch's completion width.")
    clip_rule: str | None = doc(
        None, "Where each token's clip range comes from: fixed (epsilon, epsilon_high) | sspo (both times 0.5 + the "
              "sentence's entropy rank) | espo (espo_alpha * group entropy / log|V|) | hapo (entropy-adaptive, "
              "asymmetric), or a name a plugin registered (dlmrl list clip_rules); null = the preset's.")
    dual_clip: float | None = doc(
        None, "Dual clip c > 1: a negative-advantage token's loss is at most c*|A| (dual-clip PPO); null = the "
              "preset's (hapo: 10), 0 = off.")
    delta: float | None = doc(None, "TRL's delta > 1: the unclipped ratio is capped at delta (two-sided clipping, "
                                    "INTELLECT-2); null = the preset's, 0 = off.")
    weighting: str | None = doc(
        None, "Loss weighting: none | egsw (EGSW's group softmax per sequence) | egsw_step (per position), or a name "
              "a plugin registered (dlmrl list weightings); null = the preset's.")
    part_options: dict = field(default_factory=dict, metadata={"help": (
        "Settings of the clip rule, loss type and weighting by their own field names, over the train.* keys of "
        "the same names: {clip_rule: {...}, loss_type: {...}, weighting: {...}}, e.g. "
        "train.part_options.clip_rule.scale=0.5 for a clip rule of your own with a field 'scale'.")})
    egsw_alpha: float | None = doc(None, "egsw: weight alpha of the entropy in the softmax score A + alpha*H; null = "
                                         "the preset's (0.5).")
    egsw_temperature: float | None = doc(None, "egsw: softmax temperature (> 0); null = the preset's (1).")
    entropy_num_groups: int | None = doc(
        None, "ESPO's entropy groups per response (>= 2; ratio level entropy_group, clip rule espo); null = the "
              "preset's (2).")
    entropy_top_fraction: float | None = doc(
        None, "ESPO: fraction rho of a response's tokens, highest entropy first, in group 0 (in (0, 1)); null = the "
              "preset's (0.2).")
    espo_alpha: float | None = doc(None, "espo clip rule: alpha of the range alpha * mean group entropy / log|V|; "
                                         "null = the preset's (0.02).")
    vocab_size: int | None = doc(None, "espo clip rule: |V| (>= 2); null = the preset's, else the tokenizer's size.")
    hapo_entropy_pivot: float | None = doc(
        None, "HAPO: pivot quantile of the log-entropies in its normalisation (loss and adaptive temperature; in "
              "[0, 1]); null = the preset's (0.8).")
    hapo_clip_alpha: float | None = doc(None, "hapo clip rule: alpha of the adaptive ranges; null = the preset's (1).")
    hapo_advantage_beta: float | None = doc(
        None, "HAPO's advantage redistribution beta (>= 0, 0 = off; needs one process); null = the preset's (hapo: 1).")
    kl_kind: str | None = doc(None, "KL estimator: k1 | k2 | k3; null = the preset's (k3).")
    kl_level: str | None = doc(None, "KL level: token | sequence | sequence_sum | sequence_sum_by_length; null = the "
                                     "preset's (token).")
    kl_reference: str | None = doc(
        None, "KL toward: reference (the frozen initial model) | old (the rollout policy's scores, no reference "
              "model; TraceRL); null = the preset's.")
    anchor_weight: float | None = doc(None, "DaGRPO: loss weight of the anchor rows (>= 0); null = the preset's (0.1).")
    importance_sampling_level: str | None = doc(None, "Ratio level: token | sequence | sequence_token | sentence | "
                                                      "entropy_group; null = the preset's (gdpo: sequence).")
    scale_rewards: str | None = doc(None, "Advantage scaling: none (R - mean) | group (/ group std) | batch "
                                          "(/ batch std); null = the preset's advantage (gdpo: none).")
    advantage: str | None = doc(None, "Advantage estimator by name (rloo, gtpo, ...; see objectives."
                                      "advantage_registry); null = the preset's. Exclusive with scale_rewards.")
    dynamic_sampling_max_rounds: int | None = doc(
        None, "Dynamic sampling (dapo): most extra rollout rounds of new prompts per step to fill the batch with "
              "groups whose rewards differ; null = the preset's (dapo: 3).")
    max_completions: int = doc(0, "Rollout budget: stop at the end of the step where the cumulative number of "
                                  "sampled completions (every round, every turn) reaches this (0 = off).")
    env: str | None = doc(None, "Environment: sudoku_feedback | sudoku_retry | multihop | multihop_react | "
                                "multihop_memory (dlmrl.envs.ENVS). Multi-turn presets (flow_grpo) play episodes in "
                                "it, one row per turn; null = the task's default (sudoku: sudoku_feedback; multihop: "
                                "multihop, task.options.context's mode). Any other preset with an env set runs the "
                                "tools inside the rollout: one sequence per trajectory, the observations appended as "
                                "context tokens (never scored), sampling.gen_length its token budget (AR, block, or "
                                "full diffusion in segment rounds; an env that appends its observations: "
                                "multihop_react).")
    max_turns: int = doc(3, "Multi-turn presets and tools inside the rollout: most turns (policy responses) per "
                            "episode.")
    reward_funcs: list[str] = field(default_factory=list, metadata={"help": (
        "task.name dataset: the reward functions, each a registry name (dlmrl list rewards) or an import string "
        "module:function; TRL's signature f(prompts, completions, **columns) -> list[float | None] (None: not "
        "applicable to that completion). A comma list on the command line.")})
    reward_weights: list[float] = field(default_factory=list, metadata={"help": (
        "Weight of each reward function in the summed reward (TRL's reward_weights); empty = all 1.")})
    seed: int = doc(0, "Seed for rollouts, masks and data.")
    save_steps: int = doc(25, "Checkpoint every this many steps (and at the end).")
    sync_ref_model: bool = doc(
        False, "TRL's sync_ref_model (TR-DPO, arXiv 2404.09656): every ref_model_sync_steps optimizer steps the KL "
               "reference moves toward the policy, ref <- alpha * policy + (1 - alpha) * ref. Needs a KL toward the "
               "reference (train.beta > 0). Full fine-tuning: the reference copy's weights; LoRA: a second adapter "
               "(dlmrl_ref). Not with train.sharding or model.kind uniform + LoRA.")
    ref_model_mixup_alpha: float = doc(0.6, "alpha of train.sync_ref_model's mix, in (0, 1] (TRL's default).")
    ref_model_sync_steps: int = doc(512, "Optimizer steps between train.sync_ref_model's mixes (TRL's default).")
    collapse_window: int = doc(
        20, "The collapse monitor (dlmrl.training.collapse): steps in the running baseline (median) of sample_nll, "
            "the policy's negative log-likelihood per token of its own samples, and of kl; 0 = off. A value above "
            "collapse_ratio x its baseline logs collapse: true and warns once, naming the step.")
    collapse_ratio: float = doc(3.0, "The collapse monitor's threshold: a value above this many times its running "
                                     "baseline fires (> 1; ours, NVIDIA's report gives none).")
    collapse_direction: str = doc(
        "rise", "The collapse monitor's direction: rise (sample_nll or kl above collapse_ratio x its baseline: the "
                "entropy blow-up NVIDIA reports) | fall (sample_nll below its baseline / collapse_ratio: the "
                "policy's entropy collapsing, arXiv 2505.22617; kl is not watched) | both (all three).")
    stop_on_collapse: bool = doc(False, "Stop the run after the step the collapse monitor fires on, its checkpoint "
                                        "saved (summary.json stop_reason: collapse; --resume continues).")
    logging_steps: int = doc(1, "Write metrics every this many steps.")
    report_to: str = doc("none", "accelerate tracker: none | tensorboard | wandb | trackio (its package must be "
                                 "installed); metrics.jsonl is written either way.")
    sharding: str = doc(
        "none", "Parameter sharding: none (each process holds the whole model; several processes: data parallel) | "
                "fsdp2 (torch's FSDP2, fully_shard on every decoder layer and the root: parameters, gradients and "
                "AdamW's state split over the processes; CPU/gloo too). Gathered once per rollout, per layer in the "
                "updates (micro-batches padded to the same count on every process); checkpoints through "
                "torch.distributed.checkpoint, resumable on another process count.")


@dataclass
class EvalConfig:
    num_puzzles: int = doc(256, "Held-out examples to evaluate, the first of the test split (0 = all of it).")
    steps: int = doc(8, "Denoising steps for evaluation decoding.")
    temperature: float = doc(0.0, "Evaluation temperature (0 = greedy).")
    batch_size: int = doc(256, "Puzzles per evaluation batch.")
    eval_steps: int = doc(0, "Also evaluate the held-out split every this many steps (0 = only before/after).")
    before: bool = doc(True, "Evaluate the starting model before training.")
    after: bool = doc(True, "Evaluate the trained model after training.")
    preset: str = doc("none", "A paper's sampling protocol for evaluation: none | d1 | spg | gdpo: gen lengths 128, 256, "
                              "512 (dlmrl eval; --gen-lengths overrides), steps gen_length/2 (d1, spg) or gen_length "
                              "(gdpo), block 32, greedy, zero-shot, protocol d1. eval.steps, eval.temperature and "
                              "sampling.block_length then do not apply to evaluation.")
    protocol: str | None = doc(None, "How held-out completions are scored: strict (dlmrl's rewards) | d1 (d1's "
                                     "eval/parse_and_get_acc.py item by item: the papers' figures) | d1_fixed (d1 "
                                     "with its plain bugs fixed); null = the preset's (d1), else strict.")


@dataclass
class Config:
    """The ``dlmrl train`` / ``dlmrl eval`` config."""

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output_dir: str = doc("runs/gdpo_sudoku_tiny", "Where config.yaml, metrics.jsonl, checkpoints/, summary.json and plots go.")


@dataclass
class PretrainConfig:
    """The ``dlmrl pretrain`` config: SFT of a tiny default on Sudoku solutions or on multi-hop tool-use traces
    (masked-diffusion or next-token)."""

    kind: str = doc("diffusion", "Model kind: 'diffusion' (bidirectional, masked-diffusion SFT, infill), 'block' "
                                 "(block-causal, block-ELBO SFT on d1's full format, dlmrl.pretraining.block), "
                                 "'ar' (causal, next-token SFT on d1's full format) or 'uniform' (a tiny "
                                 "DiffusionGemma, NeMo AutoModel's uniform-noise SFT on d1's full format, "
                                 "dlmrl.pretraining.uniform).")
    output_dir: str = doc("runs/pretrain_tiny", "Where the checkpoint (config, tokenizer, safetensors) is saved.")
    seed: int = doc(0, "Seed for initialisation, data and masks.")
    steps: int = doc(300, "Optimizer steps.")
    batch_size: int = doc(64, "Sequences per step.")
    learning_rate: float = doc(1e-3, "AdamW learning rate (linear warm-up then cosine decay).")
    warmup_steps: int = doc(20, "Warm-up steps.")
    min_blanks: int = doc(2, "Fewest blanks in SFT puzzles.")
    max_blanks: int = doc(5, "Most blanks in SFT puzzles.")
    hidden_size: int = doc(64, "Transformer width.")
    num_layers: int = doc(4, "Transformer layers.")
    num_heads: int = doc(4, "Attention heads.")
    intermediate_size: int = doc(192, "MLP width.")
    eval_puzzles: int = doc(256, "Held-out puzzles evaluated at the end (greedy, infill); multihop: held-out "
                                 "questions (0 = all); recommend: held-out users.")
    task: str = doc("sudoku", "What to SFT on: sudoku (the solutions) | multihop (the scripted agent's tool-use "
                              "traces, dlmrl.pretraining.multihop) | recommend (users' next items as semantic "
                              "IDs, kind ar, dlmrl.pretraining.recommend).")
    task_options: dict = field(default_factory=dict, metadata={"help": (
        "multihop: the task's settings (MultiHopOptions: kb_seed, kb_scale, hops, ...), as task.options of a run; "
        "recommend: RecommendOptions (codebook_sizes, n_train, noise, ...).")})
    block_sizes: str = doc("1,2,4,8,16", "kind block: the block sizes trained on, one drawn per batch (a comma "
                                         "list); the model serves each of them.")
    sft_forms: str = doc("trace,memory", "multihop: the SFT pairs, a comma list of trace (prompt = question, "
                                         "completion = the whole trace) | react | memory (one pair per turn in that "
                                         "episode context mode); recommend: the modes, a comma list of direct | "
                                         "reasoning.")


def iter_fields(cls: type, prefix: str = ""):
    """Yield ``(dotted_key, dataclass_field)`` for every leaf field of a (nested) config class."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        ftype = hints[f.name]
        if dataclasses.is_dataclass(ftype):
            yield from iter_fields(ftype, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, ftype


def help_text(cls: type) -> str:
    """Every config field with its type, default and doc (the ``--help`` listing)."""
    lines = []
    for key, f, ftype in iter_fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        tname = getattr(ftype, "__name__", str(ftype)).replace("typing.", "")
        lines.append(f"  {key} ({tname}, default {default!r})\n      {f.metadata.get('help', '')}")
    return "\n".join(lines)


def parse_block_sizes(text: str) -> list[int]:
    """``"1,2,4"`` → ``[1, 2, 4]`` (the block pretraining's ``block_sizes``).

    Raises:
        ValueError: an entry that is not an integer >= 1, or none at all.
    """
    try:
        sizes = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(b < 1 for b in sizes):
        raise ValueError(f"block_sizes must be a comma list of integers >= 1, got {text!r}")
    return sizes
