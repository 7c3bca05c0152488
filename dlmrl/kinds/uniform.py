"""``model.kind: uniform``: a uniform-noise, self-conditioned diffusion LM (Google's DiffusionGemma,
``DiffusionGemmaForBlockDiffusion``, loaded natively: :mod:`dlmrl.models.uniform_policy`).

It writes canvases of ``L`` tokens left to right (``config.canvas_length``; ``ceil((sampling.gen_length + 1) / L)``
canvases at most, the completion then EOS as the AR kind budgets it), each denoised from uniform noise with the
entropy-bounded sampler (arXiv 2505.24857) as transformers' ``generate`` does
(:func:`dlmrl.models.uniform_sampler.sample_diffusion_gemma`, token-identical): ``sampling.steps`` is the most
denoising steps per canvas, and ``sampling.entropy_bound``, ``t_max``, ``t_min``, ``stability_threshold``,
``confidence_threshold`` override the checkpoint's generation config when set. A completion ends at its first EOS.

It is scored by the **trajectory likelihood** (:mod:`dlmrl.training.uniform_trajectory`, dlmrl interpretation):
the log-probs of the draws each step accepted, replayed under the current weights (``estimator.name`` null or
``trajectory``; ``estimator.micro_batch`` = step canvases per forward with grad), or by a uniform-noise ELBO estimator
(``estimator.name`` ``uniform_double_mc``, ``uniform_sdmc``, ``uniform_flat_ce``: UDLM's continuous-time bound,
:mod:`dlmrl.training.uniform_elbo_scorer`; their settings from the ``estimator`` section as for the masked
estimators, ``estimator.micro_batch`` = noise draws per denoiser call). These names are this kind's only.
The presets that run on exact token log-probs (``policies`` containing
``ar``: GRPO, Dr. GRPO, GSPO, DAPO, RLOO, SRPO, ...) run on it, with the trajectory likelihood in place of the AR
token log-probs; presets that read per-token entropies (EGSW, ESPO, GTPO, GRPO-S, HAPO), add off-policy anchors
(DaGRPO), play multi-turn episodes or run tools inside the rollout are refused, naming ``train.algorithm`` /
``train.env``.

``model.use_peft``: LoRA on the text layers' attention projections and dense MLP for ``all-linear`` (NeMo AutoModel's
DiffusionGemma LoRA recipe, ``examples/dllm_sft/diffusion_gemma_lora.yaml``: router, experts and head frozen;
:meth:`UniformNoiseKind.lora_targets`), each adapter shared by the encoder and the decoder
(:func:`dlmrl.models.diffusion_gemma.share_encoder_adapters`); ``model.gradient_checkpointing`` (transformers' own,
the decoder layers), ``model.dtype: bfloat16`` (float32 master weights when training every parameter) and
``train.rollout_is_cap`` (with the trajectory likelihood) apply. Sharding does not yet.
"""

from __future__ import annotations

import math
from pathlib import Path

from dlmrl.errors import ConfigError
from dlmrl.kinds.base import KINDS, PolicyKind, check_key

__all__ = ["UniformNoiseKind", "evaluate_uniform"]


def _set(value) -> bool:
    return value is not None


class UniformNoiseKind(PolicyKind):
    """A uniform-noise diffusion LM (DiffusionGemma): canvases denoised from uniform noise by the entropy-bounded
    sampler, scored by the sampled trajectory's likelihood."""

    name = "uniform"
    algorithm_policy = "ar"  # (the presets' exact-log-prob variants: the trajectory likelihood is an exact log-prob)
    autoregressive = False
    denoises = True
    scores_with_estimators = False
    uses_families = False
    stops_at_eos_by_default = True
    default_algorithm = "grpo"
    turn_stops_at = ""
    scores_by = "the sampled trajectory's likelihood"
    sampling_keys = ("entropy_bound", "t_max", "t_min", "stability_threshold", "confidence_threshold",
                     "draw_last_step")
    checkpoint_description = "DiffusionGemma checkpoint (uniform-noise diffusion, model_type diffusion_gemma)"
    estimator_names = ("trajectory", "uniform_double_mc", "uniform_sdmc", "uniform_flat_ce")
    self_conditioned = True
    lora_scope = ("only inside the text layers of the encoder and the decoder, for this model.kind: never the head, "
                  "the embedding, the vision tower, the self-conditioning MLP or a layer by its index")

    # ----- loading -----------------------------------------------------------------------------------------
    def load(self, model_cfg):
        from dlmrl.models.uniform_policy import load_uniform_policy

        # (its adapters, and those of a kind of your own that reuses this one: itself and its checkpoint_kinds)
        return load_uniform_policy(self.model_path(model_cfg.name_or_path), model_cfg.dtype,
                                   adapter_kinds=tuple(dict.fromkeys(("uniform", self.name, *self.checkpoint_kinds))))

    def lora_targets(self, spec: str):
        """A regular expression over the text layers of the encoder and the decoder: ``all-linear`` = the attention
        projections and the dense MLP (NeMo AutoModel's DiffusionGemma LoRA recipe; router, experts, vision tower,
        self-conditioning MLP and head frozen: :data:`dlmrl.models.diffusion_gemma.DEFAULT_LORA_TARGETS`), a comma
        list = those names as suffixes inside the text layers."""
        from dlmrl.models.diffusion_gemma import lora_target_pattern
        from dlmrl.models.lora import parse_target_modules

        return lora_target_pattern(parse_target_modules(spec))

    def adapter_attached(self, model) -> None:
        from dlmrl.models.diffusion_gemma import share_encoder_adapters

        share_encoder_adapters(model)  # (one adapter per text layer, run by the encoder and the decoder)

    def owns(self, policy) -> bool:
        from dlmrl.models.uniform_policy import UniformNoisePolicy

        return isinstance(policy, UniformNoisePolicy)

    def claims_config(self, config: dict) -> bool:
        from dlmrl.models.diffusion_gemma import is_diffusion_gemma

        return is_diffusion_gemma(config)

    def claims_model(self, model) -> bool:
        from dlmrl.models.diffusion_gemma import is_diffusion_gemma

        config = getattr(model, "config", None)  # (a DiffusionGemma runs as the uniform-noise kind only)
        return config is not None and is_diffusion_gemma(config)

    def wrap(self, model, tokenizer, cfg):
        from dlmrl.models.uniform_policy import uniform_policy_from_model

        try:
            return uniform_policy_from_model(model, tokenizer)
        except TypeError as e:
            raise ConfigError(f"config key 'model.kind': uniform needs a DiffusionGemma model: {e}") from None

    # ----- the config check ----------------------------------------------------------------------------------
    def check_model(self, cfg) -> None:
        """``model.block_size`` unset, ``model.family`` auto, no remote code (transformers ships the class), no
        sharding yet (LoRA and gradient checkpointing run: :meth:`lora_targets`); a local checkpoint whose ``config.json`` is not a DiffusionGemma one;
        Sudoku in ``answer_mode`` full or text (the whole grid written, as the AR kind); ``estimator.logits_chunk``
        0 (the trajectory takes the full canvas logits)."""
        super().check_model(cfg)
        m, t = cfg.model, cfg.task
        check_key(m.family == "auto", "model.family",
                  f"model.kind 'uniform' runs DiffusionGemma checkpoints (family diffusion_gemma, detected); set it "
                  f"auto (got {m.family!r})")
        check_key(not m.trust_remote_code, "model.trust_remote_code",
                  "model.kind 'uniform' loads DiffusionGemma with transformers' own class; no checkpoint code runs "
                  "(set it false)")
        check_key(cfg.train.sharding == "none", "train.sharding",
                  "model.kind 'uniform' runs unsharded for now (set it none)")
        check_key(cfg.estimator.logits_chunk == 0, "estimator.logits_chunk",
                  "model.kind 'uniform' scores with the full canvas logits (each step's log-softmax); set it 0")
        sudoku_grid = t.name == "sudoku" and t.answer_mode != "text"
        check_key(not sudoku_grid or t.answer_mode == "full", "task.answer_mode",
                  "model.kind 'uniform' writes the whole grid in canvases left to right: use answer_mode full (or "
                  "text)")
        path = Path(self.model_path(m.name_or_path))
        if (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
            from dlmrl.models.diffusion_gemma import is_diffusion_gemma
            from dlmrl.models.loading import read_checkpoint_config

            try:
                config = read_checkpoint_config(str(path))
            except (OSError, ValueError):
                return  # (the load reports an unreadable config)
            check_key(is_diffusion_gemma(config), "model.kind",
                      f"'uniform' runs DiffusionGemma checkpoints (config.json model_type diffusion_gemma); "
                      f"{m.name_or_path!r} has model_type {config.get('model_type')!r}")

    def rollout_is_cap_problem(self, cfg) -> str | None:
        """``None`` for the trajectory likelihood (the rollout records the log-prob of each accepted draw under the
        distribution it was drawn from, and the trajectory scorer is that same likelihood under the current
        weights: truncated importance sampling applies); the ELBO estimators' per-token scores are bounds, not those
        log-probs."""
        if self.own_estimator(cfg) is None:
            return None
        return (f"needs the uniform kind's trajectory likelihood (estimator.name null or trajectory), got "
                f"{cfg.estimator.name!r}: the ELBO estimators' per-token scores are not log-probs of the distribution "
                "the rollout drew from (set it null)")

    def check_sampling(self, cfg) -> None:
        """The masked samplers' keys refused (threshold decoding, ``cache``, guidance, ``block_length``,
        ``remasking``, ``stop_at_eos: false``, ``rollout_batch_size``, ``temperature``: the schedule is
        ``t_max`` → ``t_min``), the uniform sampler's keys' ranges, ``sampling.steps`` / ``eval.steps`` >= 1,
        ``eval.temperature`` 0 and ``eval.preset`` none."""
        s, ev = cfg.sampling, cfg.eval
        default = type(s)()
        if s.adaptive:
            check_key(False, "sampling.threshold" if s.threshold is not None else "sampling.threshold_factor",
                      "is a masked-diffusion sampler setting; model.kind 'uniform' accepts draws by the entropy bound "
                      "(sampling.entropy_bound); set it null")
        for key, ok, why in (
                ("cache", s.cache == "none", ("is the masked sampler's block cache; the uniform sampler keeps an exact "
                                              "key/value cache of the prompt and finished canvases (set it none)")),
                ("cfg_scale", s.cfg_scale == 0, "classifier-free guidance is not implemented for model.kind 'uniform'"),
                ("block_length", s.block_length == default.block_length,
                 ("does not apply: model.kind 'uniform' decodes in the model's canvases (config.canvas_length); "
                  "remove it")),
                ("remasking", s.remasking == default.remasking,
                 "does not apply: the uniform sampler renoises the positions the entropy bound rejects; remove it"),
                ("stop_at_eos", s.stop_at_eos is not False,
                 "model.kind 'uniform' always ends a completion at the canvas holding its first EOS (set it null)"),
                ("rollout_batch_size", s.rollout_batch_size == 0,
                 "model.kind 'uniform' samples the batch in one call (its random draws are batch-wide); set it 0"),
                ("temperature", s.temperature == default.temperature,
                 ("does not apply: the uniform sampler's temperature falls from sampling.t_max to sampling.t_min "
                  "over a canvas's steps; remove it and set those"))):
            check_key(ok, f"sampling.{key}", why)
        check_key(isinstance(s.steps, int) and not isinstance(s.steps, bool) and s.steps >= 1, "sampling.steps",
                  f"is the most denoising steps per canvas for model.kind 'uniform': an integer >= 1, got {s.steps!r}")
        check_key(isinstance(ev.steps, int) and not isinstance(ev.steps, bool) and ev.steps >= 1, "eval.steps",
                  f"is the most denoising steps per canvas for model.kind 'uniform': an integer >= 1, got {ev.steps!r}")
        for key in ("entropy_bound", "t_max", "t_min", "confidence_threshold"):
            v = getattr(s, key)
            check_key(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                    and v > 0), f"sampling.{key}", f"must be a number > 0 (or null: the checkpoint's), "
                                                                   f"got {v!r}")
        t_max, t_min = s.t_max, s.t_min
        if t_max is None or t_min is None:  # (the checkpoint's own, when its folder is here to read)
            saved = self.generation_settings(cfg)
            t_max = saved.get("t_max") if t_max is None else t_max
            t_min = saved.get("t_min") if t_min is None else t_min
        if isinstance(t_max, (int, float)) and isinstance(t_min, (int, float)):
            # (transformers' DiffusionGemmaGenerationConfig.validate refuses t_max <= t_min at the first rollout)
            check_key(t_max > t_min, "sampling.t_max" if s.t_max is not None else "sampling.t_min",
                      f"the temperature falls from t_max to t_min over a canvas's steps, and transformers' "
                      f"DiffusionGemmaGenerationConfig refuses equal ends, so t_max must be > t_min (for a nearly "
                      f"constant temperature set t_min slightly below t_max); got t_max {t_max} and t_min {t_min}" + ("" if s.t_max is not None and s.t_min is not None
                                                                else " (the other from the checkpoint's "
                                                                     "generation_config.json)"))
        v = s.stability_threshold
        check_key(v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0),
                  "sampling.stability_threshold", f"must be an integer >= 0 (or null: the checkpoint's), got {v!r}")
        check_key(isinstance(s.draw_last_step, bool), "sampling.draw_last_step",
                  f"must be true or false, got {s.draw_last_step!r}")
        check_key(ev.temperature == 0, "eval.temperature",
                  "model.kind 'uniform' evaluates with the sampler's own schedule (t_max -> t_min) and the argmax "
                  "canvas; set it 0")
        check_key(ev.preset == "none", "eval.preset",
                  "the eval presets are masked-diffusion protocols; model.kind 'uniform' evaluates with eval.steps "
                  "(set it none)")

    def runs_preset(self, preset) -> bool:
        """The presets on exact log-probs (``policies`` containing ``ar``) and TraceRL's (a ``trajectory`` preset
        scoring the sampler's own steps, ``order: sampled``), whose likelihood this kind's trajectory likelihood is:
        the same idea on the uniform sampler's steps (dlmrl interpretation). Not JustGRPO's left-to-right order,
        which no uniform sampler takes."""
        return "ar" in preset.policies or (preset.estimator == "trajectory"
                                           and preset.estimator_options.get("order") == "sampled")

    def preset_problem(self, preset) -> str | None:
        if "entropy" in preset.required_inputs:
            return (f"{preset.name!r} reads per-token entropies, which the uniform kind's trajectory likelihood does "
                    "not give; use grpo, dr_grpo, gspo, dapo, rloo, srpo or tracerl")
        if preset.anchor_threshold is not None:
            return f"{preset.name!r} adds off-policy anchor rows, which no uniform sampler trajectory scores"
        return None

    def check_algorithm(self, cfg, preset) -> None:
        check_key(cfg.train.env is None, "train.env",
                  "tools inside the rollout are not supported for model.kind 'uniform' (remove train.env)")
        check_key(not (cfg.train.sync_ref_model and cfg.model.use_peft), "train.sync_ref_model",
                  "not supported with LoRA for model.kind 'uniform' yet (its reference adapter would have to be shared "
                  "by the encoder and decoder as the policy's is); full fine-tuning syncs the reference copy")

    def eval_preset_problem(self, preset, gen_length: int) -> str | None:
        return "the eval presets are masked-diffusion protocols (model.kind 'uniform' evaluates with eval.steps)"

    # ----- budgets and sizes -----------------------------------------------------------------------------------
    def generation_budget(self, gen_length: int, preset) -> int:
        """``gen_length`` + EOS, as the AR kind (with DAPO's overlong cache past it); the sampler writes whole
        canvases, ``ceil(budget / L)`` of them."""
        if preset is None or preset.overlong_cache_fraction is None:
            return gen_length + 1
        return math.ceil((gen_length + 1) / (1 - preset.overlong_cache_fraction))

    def budget_parts(self, preset) -> str:
        return " and EOS" if preset.overlong_cache_fraction is None else ", EOS and DAPO's overlong cache"

    def scoring_nfe(self, estimator, gen_length: int):
        return None

    def checkpoint_file(self, cfg, name: str) -> dict:
        """A JSON file of the configured checkpoint (``config.json``, ``generation_config.json``), read from a local
        folder or a shipped name (an adapter folder's base's), or ``{}`` where there is none to read (a hub name:
        checked when the run loads it)."""
        import json

        from dlmrl.models.lora import read_adapter

        path = Path(self.model_path(cfg.model.name_or_path))
        try:
            adapter = read_adapter(str(path))
            if adapter is not None:
                path = Path(self.model_path(adapter.base_model_name_or_path))
            file = path / name
            return json.loads(file.read_text()) if file.is_file() else {}
        except (OSError, ValueError):
            return {}

    def generation_settings(self, cfg) -> dict:
        """The checkpoint's ``generation_config.json`` (:meth:`checkpoint_file`)."""
        return self.checkpoint_file(cfg, "generation_config.json")

    def canvas_length(self, cfg) -> int:
        """``L`` for the memory plan: the checkpoint's ``config.json`` ``canvas_length`` (:meth:`checkpoint_file`),
        else ``model.architecture``'s, else 256 (``DiffusionGemmaConfig``'s default, the 26B-A4B's)."""
        value = self.checkpoint_file(cfg, "config.json").get("canvas_length")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        value = (cfg.model.architecture or {}).get("canvas_length")
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 256

    def memory_shapes(self, cfg, prompt: int, per_update: int, nfe: int) -> dict:
        """The trajectory likelihood's grad passes, counted per denoising-step canvas (``estimator.micro_batch`` =
        step canvases per forward, as the scorer chunks): each of a completion's ``C = ceil((gen_length + 1) / L)``
        canvases runs its ``S = sampling.steps`` steps in batched decoder passes of ``k`` steps (``k = S``, or
        ``micro_batch`` when below ``S``), each back-propagated before the next, while the encoder's graph over
        ``P + C·L`` positions is kept for the row chunk (without ``micro_batch``: one pass per canvas and one
        backward, all ``C·S`` step canvases' graphs at once). So one plan "canvas" is one step of one canvas:
        ``L`` decoder positions, all scored (``L × V`` logits, the dominant term at a 262k vocabulary), plus its
        share of the row's encoder positions (``P + C·L`` over the step canvases that share them in a forward),
        which a forward's step canvases sum back to whole encoders. The detached self-conditioning inputs a pass
        reads, another ``L × V`` values per step canvas in the weights' dtype, and the sampler's per row, are the
        plan's ``soft_inputs`` terms; not a term: the no-grad sequential pass's one step of logits. The ELBO estimators: ``nfe`` noisy copies of each completion through the
        decoder (``C·L`` positions) after the encoder (``P + C·L``). Gradient checkpointing covers the decoder layers
        only (transformers' ``DiffusionGemmaEncoderTextLayer`` is not a ``GradientCheckpointingLayer``), so the
        encoder's positions keep every layer's activations (``uncheckpointed_positions``); the trajectory's passes
        also hold each step canvas's copy of the row's encoder cache (``kv_copy_positions``). A rollout step runs
        ``L`` positions against the key/value cache of the prompt and the finished canvases."""
        L = self.canvas_length(cfg)
        canvases = math.ceil((cfg.sampling.gen_length + 1) / L)
        common = {"float_copy_all": True, "cached": True, "rollout_block": L, "rollout_forward_positions": L,
                  "dense_mask": False, "prefill_positions": 0, "rollout_soft_inputs": True,
                  "rollout_sampler": "entropy_bound"}  # (the encoder's pass over the prompt computes no logits)
        if self.own_estimator(cfg) is not None:
            return {**common, "canvases": per_update * max(int(nfe or 1), 1),
                    "positions": prompt + 2 * canvases * L, "head_positions": canvases * L,
                    "scored_positions": canvases * L, "uncheckpointed_positions": prompt + canvases * L}
        steps, micro = int(cfg.sampling.steps), cfg.estimator.micro_batch
        # (step canvases sharing one row's encoder graph in a forward: all C·S without micro_batch, whose one
        # backward keeps every canvas's graph; S for row chunks; micro_batch for passes of fewer steps)
        sharing = min(micro, steps) if micro else canvases * steps
        encoder = -(-(prompt + canvases * L) // sharing)
        # (micro_batch >= S: the scorer runs whole rows, micro_batch // S of them, all S steps of a canvas at once)
        per_forward = (micro // steps) * steps if micro and micro >= steps else None
        # (transformers checkpoints only the decoder layers: the encoder's share keeps every layer's activations;
        # each step canvas of a pass reads its own copy of the row's encoder cache, repeated_cache)
        return {**common, "canvases": per_update * canvases * steps, "positions": L + encoder, "head_positions": L,
                "scored_positions": L, "soft_inputs": True, "canvases_per_forward": per_forward,
                "uncheckpointed_positions": encoder, "kv_copy_positions": prompt + canvases * L}

    # ----- training ----------------------------------------------------------------------------------------
    def build_scorer(self, policy, ref, cfg, estimator, objective, processes: int):
        from dlmrl.training.uniform_trajectory import UniformTrajectoryScorer

        elbo = self.own_estimator(cfg)
        if elbo is not None:
            from dlmrl.training.uniform_elbo_scorer import UniformELBOScorer

            return UniformELBOScorer(policy, ref, elbo, old_scores=objective.needs_old_scores,
                                     micro_batch=cfg.estimator.micro_batch or None)
        return UniformTrajectoryScorer(policy, ref, old_scores=objective.needs_old_scores,
                                       micro_batch=cfg.estimator.micro_batch or None,
                                       through=cfg.estimator.self_conditioning == "through")

    def estimator_class(self, name: str):
        from dlmrl.estimators.uniform_elbo import UniformDoubleMC, UniformFlatCE, UniformSDMC

        return {"uniform_double_mc": UniformDoubleMC, "uniform_sdmc": UniformSDMC,
                "uniform_flat_ce": UniformFlatCE}.get(name)

    def own_estimator(self, cfg):
        """The ELBO estimator ``estimator.name`` names, built from the section's flat keys (``num_nodes``,
        ``samples_per_node``, ``stratified``) and ``estimator.options`` (its own fields: ``time_exponent``, ``eps``,
        ``support``, ...); ``None`` for the trajectory likelihood (null or ``trajectory``)."""
        import dataclasses

        e = cfg.estimator
        cls = self.estimator_class(e.name or "trajectory")
        if cls is None:
            return None
        flat = {f.name: getattr(e, f.name) for f in dataclasses.fields(e)
                if f.name not in ("name", "options", "micro_batch", "logits_chunk")}
        return cls.from_config(flat, None, dict(e.options))

    def measures_rollout_gap(self, scorer) -> bool:
        return bool(getattr(scorer, "measures_rollout_gap", False))

    def sample(self, policy, task, cfg, examples: list, generator, max_length: int, temperature_fn=None,
               prompts: tuple[int, int] | None = None):
        from dlmrl.training.uniform_trajectory import rollout_uniform

        return rollout_uniform(policy, task, cfg, examples, generator, max_length, prompts=prompts)

    def sample_tool_loop(self, policy, make_env, examples: list, generator, max_length: int, cfg, task,
                         temperature_fn=None):
        raise ConfigError("config key 'train.env': tools inside the rollout are not supported for model.kind "
                          "'uniform'")

    def evaluate(self, policy, task, settings) -> dict:
        s = settings
        return evaluate_uniform(policy, task, num_puzzles=s.num_puzzles, batch_size=s.batch_size, steps=s.steps,
                                seed=s.seed, protocol=s.protocol)

    def record_sampling(self, sampling: dict, cfg, policy) -> dict:
        from dlmrl.training.uniform_trajectory import sampler_settings

        return {**sampling, "block_length": None, "canvas_length": getattr(policy, "canvas_length", None),
                "sampler": "entropy-bounded uniform (DiffusionGemma generate)",
                **{k: v for k, v in sampler_settings(cfg.sampling).items() if k != "max_denoising_steps"}}

    # ----- --dry-run -----------------------------------------------------------------------------------------
    def plan_model(self, cfg, path) -> dict:
        out = {"family": "diffusion_gemma", "loading": "transformers' DiffusionGemmaForBlockDiffusion (no remote code)"}
        if path.is_dir() and (path / "config.json").is_file():
            from dlmrl.models.loading import read_checkpoint_config

            config = read_checkpoint_config(str(path))
            out["model_type"] = config.get("model_type")
            out["canvas_length"] = config.get("canvas_length")
        if cfg.model.use_peft:
            from dlmrl.models.diffusion_gemma import DEFAULT_LORA_TARGETS

            spec = cfg.model.lora_target_modules
            names = ", ".join(DEFAULT_LORA_TARGETS) if spec.strip() == "all-linear" else spec
            out["lora_modules"] = (f"{names} of the text layers (all-linear: NeMo AutoModel's DiffusionGemma LoRA "
                                   "recipe; router, experts, vision tower, self-conditioning MLP and head frozen), one "
                                   "adapter shared by the encoder and the decoder")
        return out

    def plan_token_logprobs(self, cfg, family: str) -> str:
        return "log-softmax of each step's full canvas logits (estimator.logits_chunk does not apply)"

    def plan_estimator(self, cfg, spec) -> dict:
        elbo = self.own_estimator(cfg)
        if elbo is not None:
            d = elbo.describe()
            return {"name": f"{d.name}: UDLM's continuous-time uniform-noise bound (arXiv 2412.10193)",
                    "nfe": d.nfe, "nfe_formula": d.nfe_formula, **d.settings, **d.notes,
                    "denoiser": "each canvas's noisy tokens against the clean prompt and earlier canvases (the "
                                "encoder's cache), zero self-conditioning, no time input; one noise plan per "
                                "update, shared by old, reference and current scores",
                    "rollout_logp_gap": "not defined (a bound of UDLM's reverse process, not the sampler's "
                                        "distribution): not logged"}
        micro, steps = cfg.estimator.micro_batch, int(cfg.sampling.steps)
        if cfg.estimator.self_conditioning == "through":
            rows = "all the rows" if not micro else f"{micro // steps} row(s) at a time (estimator.micro_batch {micro})"
            return {"name": "trajectory likelihood (uniform): the accepted draws' log-probs of every step",
                    "passes": f"per canvas: the encoder pass, then one sequential pass with grad per step over {rows}, "
                              "each step reading the previous step's logits with their graph (old and reference "
                              "scores: the same passes without grad)",
                    "nfe": steps,
                    "nfe_formula": "at most sampling.steps canvas passes per canvas (the run logs nfe_scoring)",
                    "gradient": "exact (estimator.self_conditioning through): through each step's logits and, by its "
                                "self-conditioning input, through the previous steps' logits"}
        if not micro:
            grad = "then one batched pass with grad over all the rows' steps of the canvas"
        elif micro >= steps:
            grad = (f"then batched passes with grad over all the canvas's steps of {micro // steps} row(s) at a time "
                    f"(estimator.micro_batch {micro} step canvases), each back-propagated before the next")
        else:
            grad = (f"then, one row at a time, batched passes with grad over {micro} of the canvas's steps "
                    f"(estimator.micro_batch), each back-propagated before the next; the encoder's graph once per "
                    "row")
        return {"name": "trajectory likelihood (uniform): the accepted draws' log-probs of every step",
                "passes": "per canvas: the encoder pass, a no-grad pass per step for the self-conditioning inputs, "
                          f"{grad} (old and reference scores: the no-grad passes only)",
                "nfe": 2 * steps,
                "nfe_formula": "at most 2 x sampling.steps canvas passes per canvas (a no-grad pass per step, then "
                               "the batched passes over the steps; the run logs nfe_scoring)",
                "gradient": "through each step's logits at the recorded input canvas; the self-conditioning input "
                            "(the previous step's logits) is recomputed under the current weights and detached "
                            "(estimator.self_conditioning detached; through gives the exact gradient)"}

    def plan_sampler(self, cfg, preset, written) -> dict:
        s = cfg.sampling
        budget = self.generation_budget(s.gen_length, preset)
        keep = lambda v: "the checkpoint's generation_config" if v is None else v
        return {"kind": "entropy-bounded uniform denoising (DiffusionGemma generate, arXiv 2505.24857)",
                "max_new_tokens": budget, "canvases": "ceil(max_new_tokens / config.canvas_length), each ended at "
                                                      "the canvas holding the row's first EOS",
                "max_denoising_steps": s.steps, "entropy_bound": keep(s.entropy_bound), "t_max": keep(s.t_max),
                "t_min": keep(s.t_min), "stability_threshold": keep(s.stability_threshold),
                "confidence_threshold": keep(s.confidence_threshold),
                "final_canvas": "the last step's draw (scored)" if s.draw_last_step else
                                "the last step's argmax (no likelihood term)",
                "nfe_per_completion": f"at most {s.steps} per canvas (fewer with early stopping; the run logs "
                                      "nfe_sampling)",
                "eval": {"max_denoising_steps": cfg.eval.steps, "final_canvas": "argmax",
                         "batch_size": cfg.eval.batch_size,
                         "examples": cfg.eval.num_puzzles or "the whole held-out split"}}

    def plan_budget(self, preset) -> str:
        return "sampling.gen_length + 1 (the completion and EOS)"


def evaluate_uniform(policy, task, num_puzzles: int = 256, batch_size: int = 256, steps: int = 8, seed: int = 0,
                     protocol: str = "strict", **settings) -> dict:
    """Decode ``num_puzzles`` held-out examples with the uniform sampler as ``generate`` does (its draws seeded
    with ``seed + start`` per chunk, the argmax final canvas) in at most ``steps`` denoising steps per canvas and a
    budget of ``task.gen_length + 1`` tokens, and score them with the task's metrics (``nfe``: the most canvas
    passes of a row). ``settings``: the sampler's other settings (:func:`dlmrl.training.uniform_trajectory.sampler_settings`)."""
    from dlmrl.evaluation.heldout import _decode_held_out, _summary

    def decode(batch, start):
        out = policy.sample(batch.prompt_ids, batch.prompt_mask, task.gen_length + 1, seed=seed + start,
                            max_denoising_steps=int(steps), **settings)
        return task.decode(out.completions), int(out.decoder_forward_passes.max()) if len(out.completions) else 0

    examples, texts, nfes = _decode_held_out(policy, task, num_puzzles, batch_size, decode)
    return _summary(task, examples, texts, max(nfes, default=0), protocol, max_new_tokens=task.gen_length + 1)


KINDS.register("uniform")(UniformNoiseKind())
