"""``model.kind: diffusion``: a full-attention masked-diffusion LM (LLaDA, Dream, BERT-style masked LMs, the tiny
default).

It samples with the semi-autoregressive masked-diffusion sampler (LLaDA's ``generate``: ``sampling.gen_length`` cut
into blocks of ``sampling.block_length``, ``sampling.steps`` denoising steps; Fast-dLLM's threshold decoding and
block caches), records each token's reveal step and log-prob, and is scored by a likelihood estimator (the
``estimator`` section: double MC, SDMC, coupled, one-step, the sampled trajectory, ...). The checkpoint is one of
the diffusion families (:data:`dlmrl.models.families.FAMILIES`), detected from its ``config.json``.
"""

from __future__ import annotations

from dlmrl.kinds.base import KINDS, PolicyKind, check_key, refuse_claimed_checkpoint
from dlmrl.kinds.families import (
    check_cache_family,
    check_family_matches,
    check_remote_code,
    local_families,
)

__all__ = ["MaskedDiffusionKind", "early_stop_plan"]


def _warn_blockwise_family(family: str | None, name_or_path: str) -> None:
    """Warn that ``model.kind: diffusion`` runs a block-diffusion family's checkpoint with full attention
    (:attr:`dlmrl.models.families.Family.trained_blockwise`): a silent mismatch otherwise, as NVIDIA's RL code warns
    of a Nemotron checkpoint run in the wrong paradigm."""
    from dlmrl.kinds.base import warn_key
    from dlmrl.models.families import FAMILIES

    if family in FAMILIES and FAMILIES.get(family).trained_blockwise:
        warn_key(f"config key 'model.kind': {name_or_path!r} is a {family} checkpoint, a block-diffusion model trained "
                 "with block-causal attention (bidirectional inside a block, causal across blocks); model.kind "
                 "'diffusion' runs it with full bidirectional attention over the whole canvas, a layout it never saw, "
                 "so its samples and likelihoods are not the model's. Set model.kind: block (its own attention and an "
                 "exact key/value cache)")


class MaskedDiffusionKind(PolicyKind):
    """Full-attention masked diffusion (LLaDA, Dream, masked LMs): the masked-diffusion sampler, the likelihood
    estimators."""

    name = "diffusion"
    algorithm_policy = "diffusion"
    turn_stops_at = ("the end of the segment where that line ends (sampling.block_length; segment rounds)")

    # ----- loading -----------------------------------------------------------------------------------------
    def load(self, model_cfg):
        from dlmrl.models.loading import load_policy

        m = model_cfg
        return load_policy(m.name_or_path, m.family, m.trust_remote_code, m.dtype,
                           adapter_kinds=self.adapter_kinds())

    def adapter_kinds(self) -> tuple[str, ...]:
        """The kinds whose saved LoRA adapters this kind loads: both masked-diffusion kinds, itself and
        :attr:`checkpoint_kinds` (a kind of your own that reuses this one loads back its own adapters)."""
        return tuple(dict.fromkeys(("diffusion", "block", self.name, *self.checkpoint_kinds)))

    def owns(self, policy) -> bool:
        # (any policy that is neither causal nor block-causal runs the masked-diffusion sampler, unless its `kind`
        # attribute names another registered kind: e.g. a uniform-noise policy)
        from dlmrl.models.ar import AutoregressivePolicy
        from dlmrl.models.block_policy import BlockDiffusionPolicy

        named = getattr(policy, "kind", None)
        if isinstance(named, str) and named in KINDS and named not in self.adapter_kinds():
            return False
        return not isinstance(policy, (AutoregressivePolicy, BlockDiffusionPolicy))

    def wrap(self, model, tokenizer, cfg):
        from dlmrl.models.loading import diffusion_policy_from_model

        return diffusion_policy_from_model(model, tokenizer, cfg.model.family)

    def check_loaded(self, cfg, policy) -> None:
        if cfg.sampling.cache != "none":  # (a detected family is known only now)
            check_cache_family(policy.family, cfg.sampling.cache, cfg.model.name_or_path, loaded=policy.model)
        if cfg.model.family == "auto" and local_families(cfg.model.name_or_path) is None:  # (not known at config time)
            _warn_blockwise_family(policy.family, cfg.model.name_or_path)

    # ----- the config check ----------------------------------------------------------------------------------
    def check_model(self, cfg) -> None:
        m = cfg.model
        refuse_claimed_checkpoint(cfg)  # (a checkpoint another kind claims, e.g. a DiffusionGemma)
        if m.family != "auto":
            check_family_matches(m.name_or_path, m.family)
        found = [m.family] if m.family != "auto" else local_families(m.name_or_path) or []
        if len(found) == 1:
            _warn_blockwise_family(found[0], m.name_or_path)
        super().check_model(cfg)

    def denoising_blocks(self, cfg) -> tuple[int, str]:
        s = cfg.sampling
        check_key(s.gen_length % s.block_length == 0, "sampling.block_length",
                  f"gen_length {s.gen_length} is not divisible by block_length {s.block_length}")
        return s.gen_length // s.block_length, f"sampling.gen_length {s.gen_length} / sampling.block_length {s.block_length}"

    def check_sampling(self, cfg) -> None:
        super().check_sampling(cfg)  # (the uniform-noise sampler's keys, refused when set)
        s = cfg.sampling
        if s.cache != "none":
            self.check_cache(cfg)
        check_remote_code(cfg.model)  # (after the sampler's checks: a family's missing cache is the more specific error)

    def check_cache(self, cfg) -> None:
        """``sampling.cache`` on: no guidance, and a family that has a cache when it is named or a local checkpoint's
        ``config.json`` shows it (``model.family: auto`` on a hub id is checked when the model loads)."""
        s = cfg.sampling
        check_key(s.cfg_scale == 0, "sampling.cache", "is not implemented with classifier-free guidance "
                                                      "(sampling.cfg_scale > 0); set one of them off")
        family = cfg.model.family
        if family in (None, "auto"):  # (a local checkpoint's family is known from its config.json without loading it)
            found = local_families(cfg.model.name_or_path)
            family = found[0] if found and len(found) == 1 else None
        if family is not None:
            check_cache_family(family, s.cache)

    def check_estimator(self, cfg, name: str, estimator, section, flat: dict | None = None) -> None:
        from dlmrl.estimators import SPGEstimator, Trajectory

        check_key(not (isinstance(estimator, Trajectory) and cfg.sampling.cfg_scale > 0), "sampling.cfg_scale",
                  "the trajectory estimator scores the sampler's own token distribution, but with classifier-free "
                  "guidance the sampler draws from guided logits the scorer does not compute; set cfg_scale 0 or use "
                  "an ELBO estimator")
        if isinstance(estimator, SPGEstimator) and flat is not None:
            # (SPG's block masks tile the canvas the sampler fills: their length must divide sampling.gen_length)
            key = SPGEstimator.config_key("block_length", flat, section.options)
            block, length = estimator.block_length, cfg.sampling.gen_length
            check_key(length % block == 0, key,
                      f"the spg block masks' length {block} must divide sampling.gen_length {length}")

    def check_tools_in_rollout(self, cfg, estimator_name: str) -> None:
        # (segment rounds: any ELBO estimator; the trajectory would be inexact)
        check_key(estimator_name != "trajectory", "train.env",
                  f"tools inside a full-diffusion rollout ({cfg.train.algorithm!r} scores with the trajectory "
                  "estimator): under bidirectional attention the turns decoded before an observation attended masks "
                  "where it now stands, so the trajectory likelihood would not be the sampler's; use model.kind block, "
                  "or an ELBO estimator (estimator.name sdmc, double_mc, ...), which scores the finished sequence")

    # ----- sizes ---------------------------------------------------------------------------------------------
    def memory_shapes(self, cfg, prompt: int, per_update: int, nfe: int) -> dict:
        s = cfg.sampling
        cached = s.cache != "none"
        # (the diffusion forward converts the model's whole output to float32)
        return {"canvases": per_update * nfe, "positions": prompt + s.gen_length, "head_positions": None,
                "scored_positions": s.gen_length, "float_copy_all": True, "cached": cached,
                "rollout_block": s.block_length,
                "rollout_forward_positions": prompt + s.gen_length if not cached else s.block_length,
                "dense_mask": False, "prefill_positions": 0,
                # (the block cache's peak: its kept keys/values, a cached pass's concatenation of them with the
                # block's, and with threshold decoding the selection of the rows still decoding: BlockCache.logits)
                "kv_copies": (3 if s.threshold is not None or s.threshold_factor is not None else 2) if cached else 1}

    # ----- training ----------------------------------------------------------------------------------------
    def build_scorer(self, policy, ref, cfg, estimator, objective, processes: int):
        from dlmrl.training.scorers import DiffusionScorer

        return DiffusionScorer(policy, ref, estimator, cfg.estimator.micro_batch or None,
                               old_scores=objective.needs_old_scores, block_size=cfg.model.block_size,
                               logits_chunk=cfg.estimator.logits_chunk or None)

    def sample(self, policy, task, cfg, examples: list, generator, max_length: int, temperature_fn=None,
               prompts: tuple[int, int] | None = None):
        from dlmrl.training.rollout import rollout_diffusion

        return rollout_diffusion(policy, task, cfg, examples, generator, prompts=prompts)

    def sample_tool_loop(self, policy, make_env, examples: list, generator, max_length: int, cfg, task,
                         temperature_fn=None):
        from dlmrl.training.tool_loop import rollout_tool_loop_blocks

        return rollout_tool_loop_blocks(policy, make_env, examples, cfg.train.num_generations, generator,
                                        cfg.sampling, task.gen_length)

    def evaluate(self, policy, task, settings) -> dict:
        from dlmrl.evaluation.heldout import evaluate

        s = settings
        return evaluate(policy, task, num_puzzles=s.num_puzzles, steps=s.steps, block_length=s.block_length,
                        temperature=s.temperature, batch_size=s.batch_size, seed=s.seed, protocol=s.protocol)

    # ----- --dry-run -----------------------------------------------------------------------------------------
    def plan_model(self, cfg, path) -> dict:
        from dlmrl.models.families import FAMILIES

        m, out = cfg.model, {}
        family, config = m.family, {}
        if path.is_dir() and not (path / "adapter_config.json").is_file() and (path / "config.json").is_file():
            from dlmrl.models.families import detect_family
            from dlmrl.models.loading import needs_remote_code, read_checkpoint_config

            config = read_checkpoint_config(str(path))  # (a json file: no model code runs)
            out["model_type"] = config.get("model_type")
            if family == "auto":
                try:
                    family = f"{detect_family(config)} (detected)"
                except ValueError as e:
                    family = f"auto: {e}"
            out["remote_code"] = needs_remote_code(config)
        fam = family.split()[0]  # (the mask id a family fixes when neither tokenizer nor config names one)
        out.update(self.plan_attention(cfg, fam))
        out["family"] = family
        default = FAMILIES.get(fam).fallback_mask_token_id(None, config) if fam in FAMILIES else None
        if config.get("mask_token_id") is not None:  # (a local config.json, read above)
            out["mask_token_id"] = f"{config['mask_token_id']} (config.json) unless the tokenizer names another"
        elif default is not None:
            out["mask_token_id"] = f"{default} unless the tokenizer or config.json names another"
        return out

    def plan_attention(self, cfg, family: str) -> dict:
        """The ``model`` section's attention entries (full attention: none)."""
        return {}

    def plan_token_logprobs(self, cfg, family: str) -> str:
        from dlmrl.models.canvas_scores import describe_head_split
        from dlmrl.models.families import FAMILIES

        line = describe_head_split(family if family in FAMILIES else None)
        if family in FAMILIES and FAMILIES.get(family).output_head is None:
            return line
        return f"{line}, scored positions only, {cfg.estimator.logits_chunk} per head call, recomputed in the backward"

    def plan_estimator(self, cfg, spec) -> dict:
        """The estimator's own description (:meth:`~dlmrl.estimators.configurable.ConfigurableEstimator.describe`:
        its settings by field name, its NFE and the formula), what chose it, and whether the NFE is a bound."""
        d = spec.estimator.describe(self.scored_length(cfg))  # (a canvas-dependent NFE: its bound at that length)
        out: dict = {"name": spec.estimator_name, "nfe": d.nfe, "nfe_formula": d.nfe_formula,
                     "chosen_by": spec.chosen_by, **d.settings}
        if d.nfe_is_bound or (d.name == "trajectory" and cfg.sampling.adaptive):
            # (data-dependent: the trajectory's steps or tokens; the figure is the bound)
            out["nfe_is"] = "at most, per completion (it depends on the rollout; the run logs nfe_scoring per step)"
        return {**out, **d.notes}

    def plan_sampler(self, cfg, preset, written) -> dict:
        s, ev = cfg.sampling, cfg.eval
        length = s.gen_length  # (validate holds Sudoku's grid modes to 16)
        blocks = length // s.block_length
        cfg_factor = 2 if s.cfg_scale > 0 else 1
        out = {"gen_length": length, "block_length": s.block_length, "blocks": blocks, "steps": s.steps,
               "steps_per_block": s.steps // blocks, "tokens_per_step": round(length / s.steps, 3),
               "temperature": s.temperature, "remasking": s.remasking, "cfg_scale": s.cfg_scale,
               "threshold": s.threshold, "threshold_factor": s.threshold_factor, "cache": s.cache,
               "nfe_per_completion": s.steps * cfg_factor}
        if written is not None:  # (infill: a step reveals its share of the blank cells, not of the whole canvas)
            lo, hi, mean = written
            out["tokens_per_step"] = round(mean / s.steps, 3)
            out["tokens_note"] = (f"infill: only the blank cells are written ({lo}-{hi} of the {length} canvas cells, "
                                  f"mean {mean:g}), revealed over the denoising steps")
        if s.cache != "none":
            out["cache_note"] = (f"{s.cache} cache (Fast-dLLM): a block's first pass runs over the whole sequence, its "
                                 "later passes reuse the keys/values " + ("before the block" if s.cache == "prefix"
                                                                         else "outside the block") +
                                 " (an approximation; with the trajectory estimator at merge 1 the run logs "
                                 "rollout_logp_gap_mean/max)")
        if s.adaptive:  # (threshold decoding: the steps depend on the model's confidence)
            rule = (f"reveal every masked position with confidence >= {s.threshold:g}" if s.threshold is not None
                    else f"reveal the longest run of the most confident masked positions with confidence >= "
                         f"1 - {s.threshold_factor:g} / (n + 1)")
            out.update({"decoding": f"threshold (Fast-dLLM): {rule}, at least one per step; each block runs until "
                                    "decoded (steps unused)",
                        "steps_per_block": f"1 to {s.block_length} (data-dependent)",
                        "tokens_per_step": "at least 1 (data-dependent)",
                        "nfe_per_completion": f"at most {length * cfg_factor} (data-dependent; the run logs "
                                              "nfe_sampling, the mean per completion)"})
        out.update(early_stop_plan(cfg, out["nfe_per_completion"], self.stops_at_eos_by_default))
        out["eval"] = {"steps": ev.steps, "temperature": ev.temperature, "batch_size": ev.batch_size,
                       "examples": ev.num_puzzles or "the whole held-out split"}
        if s.adaptive or s.cache != "none":
            out["eval"]["decoding"] = ("the plain schedule (eval.steps), no cache; the threshold and the cache apply "
                                       "to rollouts")
        return out

    def plan_scoring(self, cfg, nfe: int, processes: int) -> dict:
        # (an optimizer step scores one mini-batch of the batch with grad: train.steps_per_generation, cut into whole
        # groups; each process scores its share of the mini-batch's groups: the figures are one process's, its
        # largest share)
        tr, e = cfg.train, cfg.estimator
        groups = -(-tr.prompts_per_step // tr.steps_per_generation)
        canvases = -(-groups // processes) * tr.num_generations * nfe
        out = self.plan_scoring_pass()
        out["scoring_canvases_per_update"] = canvases  # (at most, for data-dependent NFE)
        out["canvases_per_forward"] = min(e.micro_batch, canvases) if e.micro_batch else canvases
        out["scoring"] = ("two-pass chunks of estimator.micro_batch (memory of one chunk)"
                          if e.micro_batch and e.micro_batch < canvases else "one call with grad")
        return out

    def plan_scoring_pass(self) -> dict:
        """The ``sizes`` section's note on what one scoring canvas is (full attention: the canvas itself, no note)."""
        return {}


def early_stop_plan(cfg, nfe, default_on: bool) -> dict:
    """``sampling.stop_at_eos`` as the rollout resolves it (:func:`dlmrl.training.rollout.stops_at_eos`: null = the
    kind's default ``default_on``, when the tokenizer has an EOS), and the NFE figure it makes a bound."""
    setting = cfg.sampling.stop_at_eos
    on = setting if setting is not None else default_on
    if cfg.train.env is not None:  # (tools inside the rollout: the loop ends each turn itself)
        return {"stop_at_eos": "does not apply: the tool loop ends each turn itself"}
    if not on:
        return {"stop_at_eos": "off: every block is decoded"}
    bound = nfe if isinstance(nfe, str) else f"at most {nfe}"
    return {"stop_at_eos": ("a row ends at the block holding its first EOS (its later blocks: EOS, no loss); a "
                            "sampling call stops once all its rows have" + (" (the kind's default; needs an EOS in "
                            "the tokenizer)" if setting is None else "")),
            "nfe_per_completion": bound.split(" (")[0] + " (fewer when rows end early; the run logs nfe_sampling)"}


KINDS.register("diffusion")(MaskedDiffusionKind())
