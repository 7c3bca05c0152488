"""Configs: nested dataclasses whose field docs are the ``--help`` text, YAML files, ``key=value`` overrides.

Overrides use dotted keys (``train.learning_rate=1e-5``) or, when a leaf name is unique across
sections, the bare leaf (``learning_rate=1e-5``). Values are parsed with YAML rules and checked
against the field's type. Every unknown key or bad value raises ``ConfigError`` naming the key
(and the file and line for YAML input) before any model is loaded.
Option names follow TRL's ``GRPOConfig`` where one exists.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dlmrl.errors import ConfigError

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


@dataclass
class ModelConfig:
    kind: str = doc("diffusion", "Policy kind: diffusion (masked-diffusion LM: sampler + ELBO estimator) | ar "
                                 "(causal LM: generate + exact token log-probs; task.answer_mode full).")
    name_or_path: str = doc("tiny-sudoku", "Checkpoint: local folder, hub id, or 'tiny-sudoku' (shipped diffusion "
                                           "default) / 'tiny-sudoku-ar' (shipped AR default).")
    family: str = doc("auto", "Family adapter (diffusion): auto | llada | dream | masked_lm | tiny; auto reads "
                              "config.json (model_type / architectures / auto_map), a name overrides it.")
    trust_remote_code: bool = doc(False, "Allow the checkpoint's own modeling code (only if you trust it).")
    dtype: str = doc("float32", "Weights dtype: float32 | bfloat16 | float16. Log-probs are computed in float32 "
                                "whatever the weights; a LoRA adapter stays float32 on a bfloat16 base.")
    use_peft: bool = doc(False, "Train a LoRA adapter (peft) instead of the whole model; the KL reference is the "
                                "base with the adapter disabled (no second copy), final_model/ holds the adapter.")
    lora_r: int = doc(16, "LoRA rank r (trainable parameters: r * (in + out) per targeted linear layer).")
    lora_alpha: int = doc(32, "LoRA alpha: the adapter's update B A is scaled by alpha / r.")
    lora_dropout: float = doc(0.05, "Dropout on the LoRA branch's input (train mode only).")
    lora_target_modules: str = doc("all-linear", "Layers that get an adapter: all-linear (every linear layer but "
                                                 "the output head) | a comma list of module names matched as name "
                                                 "suffixes, e.g. q_proj,k_proj,v_proj.")
    gradient_checkpointing: bool = doc(False, "Recompute each layer's activations in the backward pass (less "
                                              "memory, more time; same gradients).")


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


@dataclass
class SamplingConfig:
    gen_length: int = doc(16, "Canvas length L in tokens (16 cells for 4x4 Sudoku).")
    block_length: int = doc(16, "Block length for semi-autoregressive decoding; must divide gen_length.")
    steps: int = doc(4, "Total denoising steps (forward passes) per rollout canvas; must split evenly over blocks.")
    temperature: float = doc(1.0, "Rollout sampling temperature (0 = greedy). Gumbel noise is float64.")
    remasking: str = doc("low_confidence", "Which masked positions to reveal: low_confidence | random | "
                                           "left_to_right (an autoregressive order, as JustGRPO's rollouts).")
    cfg_scale: float = doc(0.0, "Classifier-free guidance scale s (0 = off).")
    threshold: float | None = doc(
        None, "Threshold parallel decoding (Fast-dLLM, arXiv 2505.22618): each step reveals every masked position of "
              "the block whose confidence (the drawn token's probability under the model's full softmax) is >= "
              "this, at least the most confident one; null = off (the steps schedule). 0 < threshold <= 1; needs "
              "remasking low_confidence. A block then runs until decoded (1 to block_length steps, data-dependent; "
              "steps must still split over the blocks but does not set the pace); the run logs nfe_sampling, the "
              "mean forward passes per completion. Rollouts only: evaluation decodes with eval.steps.")
    threshold_factor: float | None = doc(
        None, "Fast-dLLM's factor rule instead of a fixed threshold: each step reveals the longest run of the most "
              "confident masked positions whose n-th has confidence >= 1 - f / (n + 1), at least one; null = off. "
              "> 0; not with threshold; same step count rules as threshold.")
    cache: str = doc(
        "none", "Block caching (Fast-dLLM, arXiv 2505.22618): none | prefix | dual. A block's first pass runs over "
                "the whole sequence and keeps the keys/values before the block (prefix) or outside it (dual); its later "
                "passes feed only the block (and, for prefix, what follows). An approximation for a bidirectional "
                "model (the cached states are stale by the tokens revealed since the block's first pass): the "
                "rollout log-probs are those of the logits used; with the trajectory estimator at merge 1 the run "
                "logs their gap to exact scores (rollout_logp_gap_*) and train.rollout_is_cap corrects it. Families with a cache: tiny (transformers "
                "Llama/Qwen-style models with is_causal=False); others are refused by name. Not with cfg_scale > 0. "
                "Rollouts only.")

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
                                 "stratified_coupled | one_step | trajectory | spg; null = the algorithm preset's "
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
    micro_batch: int = doc(
        0,
        "Most masked canvases per forward call when scoring (0 = all S*B at once). Training uses a "
        "two-pass surrogate when the canvases do not fit in one chunk, so peak memory stays that of one "
        "chunk whatever the NFE.",
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
    warmup_steps: int = doc(5, "Warm-up steps of the LR schedule.")
    max_grad_norm: float = doc(1.0, "Gradient clipping norm (0 = off).")
    rollout_is_cap: float | None = doc(
        None, "Truncated importance sampling of the rollout/training mismatch (TRL's vllm_importance_sampling_cap): "
              "each token's policy loss is multiplied by min(exp(logp_old - logp_rollout), C), detached, with "
              "logp_rollout the log-prob the sampler recorded for the token and logp_old the exact old-policy score "
              "of the same trajectory; null = off. C >= 1. Needs the trajectory estimator with merge 1 and order "
              "sampled (the only estimator that scores the sampler's own distribution) on a diffusion model.")
    max_steps: int = doc(260, "Rollout steps (each: sample, reward, score, num_iterations updates).")
    prompts_per_step: int = doc(64, "Prompts per rollout step; the batch is prompts_per_step * num_generations completions.")
    num_generations: int = doc(8, "Group size G: completions per prompt.")
    num_iterations: int = doc(1, "Inner iterations mu per rollout batch, each with a fresh MaskPlan.")
    epsilon: float | None = doc(None, "Clip epsilon (lower; and upper unless epsilon_high is set); null = the "
                                      "preset's (gdpo 0.5, grpo 0.2).")
    epsilon_high: float | None = doc(None, "Upper clip epsilon; null = the preset's (default: epsilon).")
    beta: float | None = doc(None, "KL coefficient beta against the frozen initial model; null = the preset's "
                                   "(gdpo 0: no reference model; grpo 0.04).")
    loss_type: str | None = doc(None, "Loss aggregation: grpo | bnpo | dapo | dr_grpo | segment_mean; null = the "
                                      "preset's.")
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
    env: str | None = doc(None, "Environment of multi-turn presets (flow_grpo): sudoku_feedback | sudoku_retry "
                                "(dlmrl.envs.ENVS); null = the task's default (sudoku: sudoku_feedback).")
    max_turns: int = doc(3, "Multi-turn presets: most turns (policy responses) per episode.")
    reward_funcs: list[str] = field(default_factory=list, metadata={"help": (
        "task.name dataset: the reward functions, each a registry name (dlmrl list rewards) or an import string "
        "module:function; TRL's signature f(prompts, completions, **columns) -> list[float | None] (None: not "
        "applicable to that completion). A comma list on the command line.")})
    reward_weights: list[float] = field(default_factory=list, metadata={"help": (
        "Weight of each reward function in the summed reward (TRL's reward_weights); empty = all 1.")})
    seed: int = doc(0, "Seed for rollouts, masks and data.")
    save_steps: int = doc(25, "Checkpoint every this many steps (and at the end).")
    logging_steps: int = doc(1, "Write metrics every this many steps.")
    report_to: str = doc("none", "accelerate tracker: none | tensorboard | wandb | trackio (its package must be "
                                 "installed); metrics.jsonl is written either way.")


@dataclass
class EvalConfig:
    num_puzzles: int = doc(256, "Held-out examples to evaluate, the first of the test split (0 = all of it).")
    steps: int = doc(8, "Denoising steps for evaluation decoding.")
    temperature: float = doc(0.0, "Evaluation temperature (0 = greedy).")
    batch_size: int = doc(256, "Puzzles per evaluation batch.")
    eval_steps: int = doc(0, "Also evaluate the held-out split every this many steps (0 = only before/after).")
    before: bool = doc(True, "Evaluate the starting model before training.")
    after: bool = doc(True, "Evaluate the trained model after training.")


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
    """The ``dlmrl pretrain`` config: SFT of a tiny default on Sudoku solutions (masked-diffusion or next-token)."""

    kind: str = doc("diffusion", "Model kind: 'diffusion' (bidirectional, masked-diffusion SFT, infill) or 'ar' "
                                 "(causal, next-token SFT on d1's full format).")
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
    eval_puzzles: int = doc(256, "Held-out puzzles evaluated at the end (greedy, infill).")


# --------------------------------------------------------------------------------------------
# generic machinery


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


#: section names accepted for another: ``sampler.threshold`` is ``sampling.threshold``
_SECTION_ALIASES = {"sampler": "sampling"}


def _unalias(key: str) -> str:
    """``key`` with an aliased section name replaced (``sampler.cache`` -> ``sampling.cache``)."""
    head, dot, rest = key.partition(".")
    return f"{_SECTION_ALIASES[head]}.{rest}" if dot and head in _SECTION_ALIASES else key


def _resolve_key(cls: type, key: str) -> str:
    keys = [k for k, _, _ in iter_fields(cls)]
    if _unalias(key) in keys:
        key = _unalias(key)
    if key in keys:
        return key
    leaf = [k for k in keys if k.rsplit(".", 1)[-1] == key]
    if len(leaf) == 1:
        return leaf[0]
    if len(leaf) > 1:
        raise ConfigError(f"config key {key!r} is ambiguous; use one of {leaf}")
    import difflib

    # section names too: a misspelt section ("trian:") should point at "train", not at a leaf that looks alike
    sections = sorted({k.split(".", 1)[0] for k in keys if "." in k})
    close = difflib.get_close_matches(key, sections + keys + [k.rsplit('.', 1)[-1] for k in keys], n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(f"unknown config key {key!r}.{hint} (see --help for every key)")


def _coerce(key: str, ftype: Any, value: Any, where: str = "") -> Any:
    origin = typing.get_origin(ftype)
    args = typing.get_args(ftype)
    if origin is list:  # (a comma list from the command line, a YAML list, or one bare value)
        if value is None:
            return []
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            value = [value]
        return [_coerce(f"{key}[{i}]", args[0], v, where) for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        ftype = next(a for a in args if a is not type(None))
    if ftype in (int, float) and isinstance(value, str):
        # YAML 1.1 reads "3e-5" as a string; accept any number Python can parse.
        try:
            value = int(value) if ftype is int else float(value)
        except ValueError:
            pass
    ok = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str),
    }[ftype](value)
    if not ok:
        raise ConfigError(f"{where}config key {key!r} expects {ftype.__name__}, got {value!r}")
    if ftype is float and not math.isfinite(value):
        raise ConfigError(f"{where}config key {key!r} must be a finite number, got {value!r}")
    return float(value) if ftype is float else value


def _set(obj: Any, dotted: str, value: Any) -> None:
    *path, leaf = dotted.split(".")
    for p in path:
        obj = getattr(obj, p)
    setattr(obj, leaf, value)


def apply_mapping(cfg: Any, mapping: dict, where: str = "", prefix: str = "") -> None:
    """Apply a nested mapping (from YAML) to ``cfg``; unknown keys raise ``ConfigError``."""
    fields = {k: t for k, _, t in iter_fields(type(cfg))}
    for k, v in mapping.items():
        key = f"{prefix}{k}"
        is_section = any(f.startswith(key + ".") for f in fields)
        if is_section and (v is None or isinstance(v, dict)):
            apply_mapping(cfg, v or {}, where, prefix=key + ".")
            continue
        if key not in fields:
            if is_section:
                raise ConfigError(f"{where}config key {key!r} is a section; give it a mapping of settings")
            key = _resolve_key(type(cfg), key)  # a unique bare leaf name, or raises with a suggestion
        _set(cfg, key, _coerce(key, fields[key], v, where))


def mapping_keys(cls: type, mapping: dict) -> set[str]:
    """The dotted keys of ``cls`` that a mapping (as :func:`apply_mapping` takes it: nested sections, dotted keys,
    unique bare leaf names) sets; an empty section sets none.

    Raises:
        ConfigError: an unknown or ambiguous key.
    """
    sections = {k.rsplit(".", 1)[0] for k, _, _ in iter_fields(cls) if "." in k}
    return {_resolve_key(cls, k) for k, v in flatten(mapping) if not (v is None and k in sections)}


def _yaml_line(path: Path, dotted: str) -> str:
    """``"<file> line N: "`` for the line that sets ``dotted`` (section-aware), else ``"<file>: "``."""
    *sections, leaf = dotted.split("[", 1)[0].split(".")  # (a list entry, key[i], is set on its key's line)
    section = sections[0] if sections else None
    current = None
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            current = line.strip()[:-1]
        stripped = line.strip()
        top = bool(line) and not line[0].isspace()
        if stripped.startswith(f"{leaf}:") and (current == section if not top else section is None or top):
            return f"{path} line {i}: "
    return f"{path}: "


def _yaml_error_place(e: yaml.YAMLError) -> str:
    """`` line N, column M`` of a YAML parse error (1-based), or ``""``."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    return f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _yaml_problem(e: yaml.YAMLError) -> str:
    """The parse error in one line, with the likely cause for the indentation errors YAML reports cryptically."""
    problem = " ".join(str(getattr(e, "problem", None) or e).split())
    context = getattr(e, "context", None)
    text = f"{problem} ({' '.join(context.split())})" if context else problem
    if "block end" in text or "mapping values are not allowed" in text or "could not find expected ':'" in text:
        text += "; check the indentation of this line against the lines above (every key of a section indented the " \
                "same, with spaces)"
    if "\\t" in problem or "tab" in problem:
        text += "; YAML does not allow tabs for indentation"
    return text


def _key_in(message: str) -> str:
    return message.split("'")[1] if "'" in message else ""


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load`` that refuses a key given twice in one mapping (YAML's default keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (first on line {seen[key] + 1}); keep one",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml(cfg: Any, path: str | Path) -> None:
    """Update ``cfg`` from a YAML file; errors name the file and (when found) the line."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"config file {path} is not a file (a folder?)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise ConfigError(f"{path} line {line}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})") from None
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror or e}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}{_yaml_error_place(e)}: invalid YAML: {_yaml_problem(e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    try:
        apply_mapping(cfg, data)
    except ConfigError as e:
        raise ConfigError(f"{_yaml_line(path, _key_in(str(e)))}{e}") from None


def locate_error(error: ConfigError, path: str | Path | None, overrides: list[str] = ()) -> ConfigError:
    """Prefix a validation error with where its key was set: the command-line override that set it (overrides win
    over the file), else the YAML file and line, when there is one."""
    key = _key_in(str(error))
    if key:
        for o in overrides:
            name = _unalias(o.split("=", 1)[0].strip())
            if name and (name == key or key.endswith("." + name) or name.endswith("." + key)):
                return ConfigError(f"command-line override {o!r}: {error}")
    if path is None or str(error).startswith(str(path)) or not Path(path).is_file():
        return error
    try:
        return ConfigError(f"{_yaml_line(Path(path), key)}{error}")
    except (OSError, UnicodeDecodeError):  # (load_yaml reported an unreadable file already)
        return error


def apply_overrides(cfg: Any, overrides: list[str]) -> None:
    """Apply ``key=value`` strings (value parsed as YAML) to ``cfg``."""
    fields = {k: t for k, _, t in iter_fields(type(cfg))}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        raw_key, raw = item.split("=", 1)
        key = _resolve_key(type(cfg), raw_key.strip())
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        optional = typing.get_origin(fields[key]) in (typing.Union, types.UnionType)
        if fields[key] is str or (optional and str in typing.get_args(fields[key])):
            value = raw if value is not None and not isinstance(value, str) else value
        _set(cfg, key, _coerce(key, fields[key], value))


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def flatten(d: dict, prefix: str = ""):
    """``(dotted key, value)`` pairs of a nested dict (``{"train": {"seed": 0}}`` → ``("train.seed", 0)``)."""
    for k, v in d.items():
        yield from flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]


def save_yaml(cfg: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"config key {key!r}: {msg}")


def estimator_settings(cfg: Config) -> tuple[str, EstimatorConfig]:
    """The training estimator's name and settings: ``estimator.name`` with the ``estimator`` section as it is;
    with the name null, the algorithm preset's recipe estimator (``AlgorithmPreset.estimator``; diffu_grpo:
    one_step, just_grpo: trajectory) with the recipe's ``estimator_options`` over the section (just_grpo:
    ``order: left_to_right``); else ``sdmc``. An invalid algorithm setting counts as having none (validation
    reports it)."""
    if cfg.estimator.name is not None:
        return cfg.estimator.name, cfg.estimator
    try:
        preset = build_preset(cfg)
    except ConfigError:
        return "sdmc", cfg.estimator
    if preset.estimator is None:
        return "sdmc", cfg.estimator
    return preset.estimator, dataclasses.replace(cfg.estimator, **dict(preset.estimator_options))


def estimator_name(cfg: Config) -> str:
    """The training estimator's name (:func:`estimator_settings`)."""
    return estimator_settings(cfg)[0]


def build_estimator(e: EstimatorConfig, name: str | None = None, sampling: SamplingConfig | None = None):
    """The estimator the ``estimator`` section describes (``factory.make_estimator``; raises its ValueError).

    ``name`` (e.g. :func:`estimator_name`) replaces ``e.name``; with both ``None`` it is ``sdmc``. ``sampling``
    (default: the defaults) gives the trajectory estimator its temperature (``sampling.temperature``, 1 when
    greedy) and steps (the most a rollout takes: ``gen_length`` with threshold decoding), and SPG its block length
    when ``estimator.mask_block_length`` is 0.
    """
    from dlmrl.estimators.factory import make_estimator

    s = sampling or SamplingConfig()
    return make_estimator(name or e.name or "sdmc", e.num_nodes, e.samples_per_node, e.masking, e.stratified,
                          e.p_mask_prompt, e.t_min, e.t_max, e.merge, e.order, e.eubo_beta, e.mix_weight,
                          e.mask_block_length or s.block_length, s.temperature if s.temperature > 0 else 1.0,
                          s.max_steps)


#: trackers ``train.report_to`` accepts (accelerate's ``log_with`` names) and the package each needs
TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


def tracker_available(name: str) -> bool:
    """Whether the package of tracker ``name`` (:data:`TRACKERS`) is installed (accelerate's own check)."""
    from accelerate import utils

    return bool(getattr(utils, f"is_{name}_available")())


def validate(cfg: Config, for_training: bool = True, data: bool = True) -> None:
    """Check every value of a train/eval config against its allowed range and the registries.

    Args:
        data: also check the task's data (local files loaded, held-out size) and resolve ``train.reward_funcs``
            (importing the modules their import strings name); ``False`` when the caller built the task itself
            (the Python API, :class:`dlmrl.api.Trainer`, which checks its datasets and reward functions).
    Raises:
        ConfigError: naming the first bad key.
    """
    from dlmrl.data import TASKS
    from dlmrl.estimators import ESTIMATORS

    m, t, s, tr, ev = cfg.model, cfg.task, cfg.sampling, cfg.train, cfg.eval
    _check(m.kind in ("diffusion", "ar"), "model.kind", f"unknown policy kind {m.kind!r}; use diffusion or ar")
    if for_training:  # (first: a preset on the wrong policy kind is the likeliest mistake to report)
        _check_algorithm(cfg)
    from dlmrl.models.families import FAMILIES

    _check(m.family == "auto" or m.family in FAMILIES, "model.family",
           f"unknown family {m.family!r}; known: auto, {', '.join(FAMILIES.names())}")
    shipped = {"diffusion": "tiny-sudoku", "ar": "tiny-sudoku-ar"}
    _check(m.name_or_path != shipped["ar" if m.kind == "diffusion" else "diffusion"], "model.name_or_path",
           f"{m.name_or_path!r} is the shipped {'AR' if m.kind == 'diffusion' else 'diffusion'} model; "
           f"model.kind is {m.kind!r} (use {shipped[m.kind]!r} or set model.kind)")
    sudoku_grid = t.name == "sudoku" and t.answer_mode != "text"  # (the tiny model's 16-cell canvas)
    _check(m.kind != "ar" or not sudoku_grid or t.answer_mode == "full", "task.answer_mode",
           "model.kind 'ar' generates the whole grid left to right: use answer_mode full (or text)")
    _check(m.dtype in ("float32", "bfloat16", "float16"), "model.dtype", f"unknown dtype {m.dtype!r}")
    _check_lora(m)
    _check(t.name in TASKS, "task.name", f"unknown task {t.name!r}; known: {TASKS.names()}")
    _check(t.answer_mode in ("infill", "full", "text"), "task.answer_mode", "must be 'infill', 'full' or 'text'")
    _check(1 <= t.min_blanks <= t.max_blanks <= 12, "task.min_blanks", "need 1 <= min_blanks <= max_blanks <= 12")
    if data:
        for key, path in (("task.train_file", t.train_file), ("task.test_file", t.test_file)):
            _check(path is None or Path(path).exists(), key, f"file {path} does not exist")
        test_size = _check_data_files(t)
        if test_size == 0:  # (the dataset task names no held-out data)
            _check(not (ev.before or ev.after or ev.eval_steps), "eval.before",
                   f"task {t.name!r} has no held-out data; set task.test_file, task.test_dataset or task.test_split, "
                   "or turn held-out evaluation off (eval.before: false, eval.after: false, eval.eval_steps: 0)")
        else:
            _check(ev.num_puzzles <= test_size, "eval.num_puzzles",
                   f"{ev.num_puzzles} puzzles asked, the held-out split has {test_size}")
        _check_reward_funcs(cfg)
    _check(not sudoku_grid or s.gen_length == 16, "sampling.gen_length",
           f"the sudoku task's canvas is 16 cells with answer_mode {t.answer_mode!r}; set 16 (answer_mode text "
           "takes any length)")
    _check(s.gen_length >= 1 and s.block_length >= 1, "sampling.gen_length", "lengths must be >= 1")
    _check(s.gen_length % s.block_length == 0, "sampling.block_length",
           f"gen_length {s.gen_length} is not divisible by block_length {s.block_length}")
    blocks = s.gen_length // s.block_length
    for key, steps in (("sampling.steps", s.steps), ("eval.steps", ev.steps)):
        _check(steps >= blocks and steps % blocks == 0, key, f"{steps} steps do not split evenly over {blocks} blocks")
    _check(s.temperature >= 0, "sampling.temperature", "must be >= 0")
    _check(ev.temperature >= 0, "eval.temperature", "must be >= 0")
    from dlmrl.models.sampler import REMASKING

    _check(s.remasking in REMASKING, "sampling.remasking", f"must be one of {', '.join(REMASKING)}")
    _check(s.cfg_scale >= 0, "sampling.cfg_scale", "must be >= 0")
    _check_threshold(cfg)
    _check_cache(cfg)
    name, e = estimator_settings(cfg)
    _check(name in ESTIMATORS, "estimator.name", f"unknown estimator {name!r}; known: {ESTIMATORS.names()}")
    _check(name != "exact", "estimator.name",
           "'exact' enumerates 2^L - 1 masks; it is for analysis (dlmrl estimators), train with 'sdmc'")
    _check(not (name == "trajectory" and m.kind == "diffusion" and s.cfg_scale > 0), "sampling.cfg_scale",
           "the trajectory estimator scores the sampler's own token distribution, but with classifier-free "
           "guidance the sampler draws from guided logits the scorer does not compute; set cfg_scale 0 or use an "
           "ELBO estimator")
    _warn_estimator_fields(cfg, name, e)
    _check(not (name == "double_mc" and e.masking == "reference"), "estimator.masking",
           "double_mc with 'reference' masking has infinite expectation (weight 1/t near t = 0); "
           "use exact_count or bernoulli")
    if name in ESTIMATORS:
        try:
            build_estimator(e, name, s)
        except (ValueError, TypeError) as err:
            # the estimators name their own argument first; map it to the config field
            arg = str(err).split()[0]
            fields = {"num_samples": "samples_per_node", "num_pairs": "samples_per_node", "coupled": "t_min",
                      "beta": "eubo_beta", "mix": "mix_weight", "block_length": "mask_block_length"}
            field_name = fields.get(arg, arg if arg in {f.name for f in dataclasses.fields(e)} else "name")
            _check(False, f"estimator.{field_name}", f"{err} (estimator {name!r})")
    if name == "spg" and m.kind == "diffusion":  # (the block masks tile the canvas the sampler fills)
        block = e.mask_block_length or s.block_length
        _check(s.gen_length % block == 0, "estimator.mask_block_length",
               f"the spg block masks' length {block} must divide sampling.gen_length {s.gen_length}")
    _check(e.merge <= 1 << 20, "estimator.merge", f"must be at most 2^20 (any merge >= the steps scores one canvas), "
           f"got {e.merge}")
    _check(isinstance(e.micro_batch, int) and not isinstance(e.micro_batch, bool) and e.micro_batch >= 0,
           "estimator.micro_batch", f"must be an integer >= 0 (0 = all canvases at once), got {e.micro_batch!r}")
    _check(tr.learning_rate > 0, "train.learning_rate", "must be > 0")
    _check(tr.lr_scheduler_type in SCHEDULERS, "train.lr_scheduler_type", f"must be one of {', '.join(SCHEDULERS)}")
    _check(tr.max_steps >= 0, "train.max_steps", "must be >= 0")
    _check(tr.prompts_per_step >= 1, "train.prompts_per_step", "must be >= 1")
    _check(tr.num_generations >= 2, "train.num_generations", "group size G must be >= 2 (advantages need a group)")
    _check(tr.num_iterations >= 1, "train.num_iterations", "must be >= 1")
    _check(tr.max_grad_norm >= 0, "train.max_grad_norm", "must be >= 0")
    _check_rollout_is_cap(cfg, name, e)
    _check(tr.save_steps >= 1, "train.save_steps", "must be >= 1")
    _check(tr.logging_steps >= 1, "train.logging_steps", "must be >= 1")
    _check(tr.report_to in ("none", *TRACKERS), "train.report_to",
           f"unknown tracker {tr.report_to!r}; use none, {', '.join(TRACKERS)}")
    _check(tr.report_to == "none" or tracker_available(tr.report_to), "train.report_to",
           f"{tr.report_to!r} needs the {TRACKERS.get(tr.report_to)} package, which is not installed: pip install "
           f"{TRACKERS.get(tr.report_to)} (or use none; metrics.jsonl is always written)")
    _check(ev.eval_steps >= 0, "eval.eval_steps", "must be >= 0")
    _check(ev.num_puzzles >= 0, "eval.num_puzzles", "must be >= 0 (0 = the whole held-out split)")
    _check(ev.batch_size >= 1, "eval.batch_size", "must be >= 1")


def use_the_algorithms_estimator(cfg: Config, overrides: list[str]) -> bool:
    """Give a config built on the default recipe its algorithm's own estimator when ``overrides`` change the
    algorithm but name no ``estimator.*`` key; True if it did. Prints a line on stderr saying so.

    The default recipe's estimator (``trajectory``, merge 2) is its GDPO's choice; ``dlmrl train
    algorithm=diffu_grpo`` means diffu_grpo with its own estimator (``one_step``), as a config file naming no
    estimator gets (``estimator.name: null`` = the preset's recipe estimator). Only for a diffusion model and an
    estimator section the overrides left as the recipe has it.
    """
    import sys

    recipe = _default_recipe()
    chosen = any(_resolve_key(Config, o.split("=", 1)[0].strip()).startswith("estimator.") for o in overrides)
    if (cfg.model.kind != "diffusion" or cfg.train.algorithm == recipe.train.algorithm or chosen
            or cfg.estimator != recipe.estimator):
        return False
    cfg.estimator = EstimatorConfig()
    print(f"dlmrl: train.algorithm={cfg.train.algorithm}: the default recipe's estimator ({recipe.estimator.name}, "
          f"merge {recipe.estimator.merge}) is its {recipe.train.algorithm}'s; using {cfg.train.algorithm}'s own "
          f"({estimator_name(cfg)}; set an estimator.* key to choose another)", file=sys.stderr)
    return True


def default_job_config(overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """The validated config that ``dlmrl train key=value ...`` (no ``--config``) runs: the default recipe, the
    overrides, and :func:`use_the_algorithms_estimator`. ``Config()`` alone differs from it in the estimator
    (the dataclass leaves ``estimator.name`` null: the algorithm's own).

    Raises:
        ConfigError: a bad override or value (naming the key).
    """
    cfg = Config()
    load_yaml(cfg, default_config_path())
    apply_overrides(cfg, list(overrides))
    validate(cfg)
    if use_the_algorithms_estimator(cfg, list(overrides)):
        validate(cfg)
    return cfg


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_threshold(cfg: Config) -> None:
    """``sampling.threshold`` / ``threshold_factor``: ranges, exclusive, low-confidence remasking, diffusion only."""
    s = cfg.sampling
    _check(s.threshold is None or (_is_number(s.threshold) and 0 < s.threshold <= 1), "sampling.threshold",
           f"must be in (0, 1] (a probability the drawn token's confidence must reach) or null, got {s.threshold!r}")
    _check(s.threshold_factor is None or (_is_number(s.threshold_factor) and s.threshold_factor > 0),
           "sampling.threshold_factor", f"must be > 0 or null, got {s.threshold_factor!r}")
    _check(s.threshold is None or s.threshold_factor is None, "sampling.threshold_factor",
           "set sampling.threshold or sampling.threshold_factor, not both")
    if s.adaptive:
        key = "sampling.threshold" if s.threshold is not None else "sampling.threshold_factor"
        _check(s.remasking == "low_confidence", key,
               f"compares the model's confidence in its drawn token: needs sampling.remasking low_confidence "
               f"(got {s.remasking!r})")
        _check(cfg.model.kind == "diffusion", key,
               "is a diffusion-sampler setting; model.kind 'ar' decodes left to right (set it null)")


def _check_cache(cfg: Config) -> None:
    """``sampling.cache``: a known mode, diffusion only, no guidance, and a family that has a cache when it is named
    (``model.family: auto`` is checked when the model loads)."""
    from dlmrl.models.block_cache import CACHE_MODES

    s = cfg.sampling
    _check(s.cache in CACHE_MODES, "sampling.cache", f"must be one of {', '.join(CACHE_MODES)}, got {s.cache!r}")
    if s.cache == "none":
        return
    _check(cfg.model.kind == "diffusion", "sampling.cache",
           "is the diffusion sampler's block cache; model.kind 'ar' decodes with transformers' own key/value cache "
           "(set it none)")
    _check(s.cfg_scale == 0, "sampling.cache", "is not implemented with classifier-free guidance (sampling.cfg_scale "
                                               "> 0); set one of them off")
    if cfg.model.family not in (None, "auto"):
        check_cache_family(cfg.model.family, s.cache)


def check_cache_family(family: str | None, mode: str, model: str | None = None) -> None:
    """Refuse ``sampling.cache = mode`` for a model family without a block cache (validation, when the family is
    named; the trainer, once ``family: auto`` has been detected at load).

    Raises:
        ConfigError: naming ``sampling.cache``, the model when given, the family and why.
    """
    from dlmrl.models.families import cached_logits_of

    try:
        cached_logits_of(family, mode)
    except ValueError as err:
        where = f" with model {model!r}" if model else ""
        raise ConfigError(f"config key 'sampling.cache'{where}: {err}") from None


def _check_rollout_is_cap(cfg: Config, name: str, e: EstimatorConfig) -> None:
    """``train.rollout_is_cap``: ``>= 1``, and only where the old-policy scores are the sampler's own distribution."""
    cap = cfg.train.rollout_is_cap
    if cap is None:
        return
    _check(_is_number(cap) and cap >= 1, "train.rollout_is_cap",
           f"must be >= 1 (a cap below 1 would scale down tokens the rollout drew exactly as the policy would) or "
           f"null, got {cap!r}")
    _check(cfg.model.kind == "diffusion", "train.rollout_is_cap",
           "corrects diffusion rollouts; model.kind 'ar' rollouts record no log-probs (set it null)")
    exact = name == "trajectory" and e.merge == 1 and e.order == "sampled"
    _check(exact, "train.rollout_is_cap",
           f"needs estimator.name trajectory with estimator.merge 1 and estimator.order sampled, the exact "
           f"likelihood of the sampler's own steps (got {name!r}, merge {e.merge}, order {e.order!r}): other "
           "estimators' per-token scores are not log-probs of the distribution the rollout drew from")


@functools.lru_cache(maxsize=1)
def _default_recipe() -> Config:
    """The packaged default recipe, read once (callers only read it)."""
    recipe = Config()
    load_yaml(recipe, default_config_path())
    return recipe


def _warn_estimator_fields(cfg: Config, name: str, e: EstimatorConfig) -> None:
    """Warn about ``estimator`` fields set away from their defaults that ``name`` does not read (they would be
    ignored silently), and about training with an estimator of infinite variance. A value of the dataclass
    defaults or of the default recipe counts as unset, so ``dlmrl train estimator.name=sdmc`` does not blame
    the user for the recipe's own ``merge: 2``."""
    import warnings

    from dlmrl.estimators.factory import FIELDS_USED

    if cfg.model.kind != "diffusion" or name not in FIELDS_USED:
        return
    defaults = (EstimatorConfig(), _default_recipe().estimator)
    ignored = [f.name for f in dataclasses.fields(e) if f.name not in ("name", "micro_batch")
               and f.name not in FIELDS_USED[name] and all(getattr(e, f.name) != getattr(d, f.name) for d in defaults)]
    if ignored:
        warnings.warn(f"config keys {', '.join(f'estimator.{k}' for k in ignored)} do not apply to the {name!r} "
                      f"estimator (it reads {', '.join(sorted(FIELDS_USED[name])) or 'none of them'}) and are "
                      "ignored", UserWarning, stacklevel=3)
    bernoulli_dmc = name == "double_mc" and e.masking == "bernoulli"
    bernoulli_coupled = name == "coupled" and e.masking == "bernoulli" and (e.t_min == 0 or e.t_max == 1)
    if bernoulli_dmc or bernoulli_coupled:
        warnings.warn(f"estimator {name!r} with bernoulli masking{'' if bernoulli_dmc else ' and t reaching 0 or 1'} "
                      "has infinite variance (a lone masked token weighs 1/t as t -> 0): its gradients are heavy-"
                      "tailed; exact_count masking (or sdmc) is unbiased with finite variance", UserWarning,
                      stacklevel=3)


def preset_overrides(tr: TrainConfig) -> dict:
    """The preset parts the ``train`` section sets (TRL names mapped to :class:`GroupObjective` fields)."""
    out = {k: getattr(tr, k) for k in ("epsilon", "epsilon_high", "beta", "loss_type") if getattr(tr, k) is not None}
    if tr.importance_sampling_level is not None:
        out["ratio_level"] = tr.importance_sampling_level
    if tr.scale_rewards is not None:
        out["advantage"] = tr.scale_rewards  # (TRL's names are the advantage estimators' names)
    if tr.advantage is not None:
        out["advantage"] = tr.advantage
    if tr.dynamic_sampling_max_rounds is not None:
        out["dynamic_sampling_max_rounds"] = tr.dynamic_sampling_max_rounds
    return out


def build_preset(cfg: Config):
    """``get_algorithm(train.algorithm, **overrides)``; errors become ``ConfigError`` naming the field."""
    import warnings

    from dlmrl.objectives.presets import get_algorithm

    fields = {"ratio_level": "importance_sampling_level"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (a sequence ratio with a token-summed loss warns)
        try:
            return get_algorithm(cfg.train.algorithm, **preset_overrides(cfg.train))
        except ValueError as err:
            msg = str(err)
            if "unknown algorithm" in msg:
                key = "algorithm"
            else:
                first = msg.split()[0]
                key = fields.get(first, first if first in {f.name for f in dataclasses.fields(TrainConfig)}
                                 else ("advantage" if "advantage" in msg else "algorithm"))
            raise ConfigError(f"config key 'train.{key}': {msg}") from None


def _check_lora(m: ModelConfig) -> None:
    """The LoRA fields' ranges (checked whether or not ``use_peft`` is on)."""
    from dlmrl.models.lora import parse_target_modules

    _check(m.lora_r >= 1, "model.lora_r", f"must be >= 1, got {m.lora_r}")
    _check(m.lora_alpha > 0, "model.lora_alpha", f"must be > 0, got {m.lora_alpha}")
    _check(0 <= m.lora_dropout < 1, "model.lora_dropout", f"must be in [0, 1), got {m.lora_dropout}")
    try:
        parse_target_modules(m.lora_target_modules)
    except ValueError as e:
        _check(False, "model.lora_target_modules", str(e))


def _check_algorithm(cfg: Config) -> None:
    """The preset exists, its overrides are valid, it runs on ``model.kind`` and the trainer supports it."""
    from dlmrl.objectives.advantages import SCALE_REWARDS

    tr, kind = cfg.train, cfg.model.kind
    _check(tr.scale_rewards is None or tr.advantage is None, "train.scale_rewards",
           "set scale_rewards or advantage, not both")
    _check(tr.scale_rewards is None or tr.scale_rewards in SCALE_REWARDS, "train.scale_rewards",
           f"must be none, group or batch, got {tr.scale_rewards!r}")
    _check(tr.epsilon is None or 0 < tr.epsilon < 1, "train.epsilon", "must be in (0, 1)")
    _check(tr.epsilon_high is None or tr.epsilon_high > 0, "train.epsilon_high", "must be > 0")
    _check(tr.beta is None or tr.beta >= 0, "train.beta", "must be >= 0")
    preset = build_preset(cfg)
    eps, eps_high = preset.objective.epsilon, preset.objective.epsilon_high
    _check(eps_high is None or eps_high >= eps, "train.epsilon_high",
           f"the upper clip {eps_high} is below the lower one (epsilon {eps}); clip-higher needs epsilon_high >= "
           "epsilon")
    _check(kind in preset.policies, "train.algorithm",
           f"{tr.algorithm!r} runs on {' and '.join(preset.policies)} policies only, but model.kind is {kind!r}")
    _check(preset.adaptive_temperature_tau is None or kind == "ar", "train.algorithm",
           f"{tr.algorithm!r} samples with HAPO's adaptive temperature, which needs model.kind 'ar'")
    _check(isinstance(tr.max_completions, int) and tr.max_completions >= 0, "train.max_completions",
           "must be an integer >= 0 (0 = no rollout budget)")
    _check_rollout_parts(cfg, preset)


def _check_rollout_parts(cfg: Config, preset) -> None:
    """Dynamic sampling, anchors and episodes: combinations the trainer runs, the environment, the advantage."""
    from dlmrl.envs import ENVS, default_env

    tr, algo = cfg.train, cfg.train.algorithm
    if preset.multi_turn:
        _check(cfg.model.kind == "ar", "train.algorithm", f"{algo!r} plays multi-turn episodes: model.kind 'ar' only")
        _check(not preset.dynamic_sampling and preset.anchor_threshold is None, "train.algorithm",
               f"{algo!r}: multi-turn episodes cannot be combined with dynamic sampling or anchors")
        env = tr.env or default_env(cfg.task.name)
        _check(env is not None, "train.env", f"task {cfg.task.name!r} has no default environment; set train.env "
                                             f"(known: {', '.join(ENVS.names())})")
        _check(env in ENVS, "train.env", f"unknown environment {env!r}; known: {', '.join(ENVS.names())}")
        tasks = getattr(ENVS.get(env), "tasks", ())
        _check(cfg.task.name in tasks, "train.env", f"environment {env!r} serves tasks {tasks}, not {cfg.task.name!r}")
        _check(isinstance(tr.max_turns, int) and tr.max_turns >= 1, "train.max_turns", "must be an integer >= 1")
    else:
        _check(tr.env is None, "train.env", f"only multi-turn presets (flow_grpo) play episodes; {algo!r} is not one")
    # (every advantage estimator reads the rows' group ids, so anchors' groups of G + 1 and episodes' turns are
    # grouped right whatever the advantage; on episodes any but flow_grpo pools the turns of a question)


def _check_data_files(t: TaskConfig) -> int | float:
    """Check the task's fields and load its local data files up front (bad records fail here, naming the config
    key, the file, the line and the field), through the task class's ``check_config``.

    Returns the number of held-out examples, or ``math.inf`` when they come from the hub (not downloaded
    here; the run loads and checks them).

    Raises:
        ConfigError: naming the key (``task.test_file``, ``task.prompt_template``, ...).
    """
    from dlmrl.data import TASKS

    _check(isinstance(t.num_numbers, int) and t.num_numbers >= 0, "task.num_numbers", "must be >= 0 (0 = all)")
    _check(t.verify_timeout > 0, "task.verify_timeout", "must be > 0 seconds")
    _check(t.verify_workers >= 1, "task.verify_workers", "must be >= 1")
    _check(t.num_proc is None or t.num_proc >= 1, "task.num_proc", "must be >= 1 (or null)")
    for key in ("dataset", "subset", "split", "test_dataset", "test_split", "prompt_template"):
        value = getattr(t, key)
        _check(value is None or value.strip() != "", f"task.{key}", "must not be empty (use null for the default)")
    check = getattr(TASKS.get(t.name), "check_config", None)
    if check is None:  # (a user task without one: nothing to check up front)
        return math.inf
    try:
        size = check(t)
    except (ValueError, TypeError) as e:
        key, sep, msg = str(e).partition(": ")
        if sep and key.startswith("task.") and " " not in key:
            raise ConfigError(f"config key {key!r}: {msg}") from None
        raise ConfigError(str(e)) from None
    return math.inf if size is None else size


def _check_reward_funcs(cfg: Config) -> None:
    """``train.reward_funcs`` / ``reward_weights``: set exactly for tasks that read them (the dataset task), every
    entry a registry name or an import string that imports (the user's module is imported here, before any model
    is loaded), one weight per function.

    Raises:
        ConfigError: naming the key, and for an import string the module and the attribute.
    """
    from dlmrl.data import TASKS
    from dlmrl.rewards.functions import RewardFunctions

    tr, t = cfg.train, cfg.task
    if not getattr(TASKS.get(t.name), "takes_reward_funcs", False):
        _check(not tr.reward_funcs, "train.reward_funcs",
               f"task {t.name!r} scores completions with its own reward; reward functions score your own prompts "
               "(task.name dataset)")
        _check(not tr.reward_weights, "train.reward_weights", "there are no train.reward_funcs to weigh")
        return
    _check(bool(tr.reward_funcs), "train.reward_funcs",
           f"task {t.name!r} has no reward of its own: name at least one reward function, a registry name (dlmrl list "
           "rewards) or an import string module:function")
    try:
        RewardFunctions(tr.reward_funcs, tr.reward_weights, what="")
    except (ValueError, TypeError, ImportError) as e:
        key = "train.reward_weights" if str(e).startswith("reward_weights") else "train.reward_funcs"
        raise ConfigError(f"config key {key!r}: {e}") from None


def validate_pretrain(cfg: PretrainConfig) -> None:
    """Check a pretrain config. Raises ``ConfigError`` naming the key."""
    _check(cfg.kind in ("diffusion", "ar"), "kind", f"unknown model kind {cfg.kind!r}; use diffusion or ar")
    for key in ("steps", "batch_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "eval_puzzles"):
        _check(getattr(cfg, key) >= 1, key, "must be >= 1")
    _check(cfg.hidden_size % cfg.num_heads == 0, "num_heads", "must divide hidden_size")
    _check(cfg.learning_rate > 0, "learning_rate", "must be > 0")
    _check(1 <= cfg.min_blanks <= cfg.max_blanks <= 12, "min_blanks", "need 1 <= min_blanks <= max_blanks <= 12")
