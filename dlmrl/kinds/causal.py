"""``model.kind: ar``: a causal LM (any ``AutoModelForCausalLM``; the tiny AR defaults) through the AR adapter.

It writes left to right with transformers' ``generate`` (a completion ends at EOS: ``sampling.gen_length`` + 1
tokens, DAPO's overlong cache past them), is scored by its exact token log-probs (one forward, NFE 1; no
``estimator`` section), and runs the GRPO family's AR presets (GRPO, Dr. GRPO, DAPO, GSPO, HAPO, Flow-GRPO, ...).
"""

from __future__ import annotations

import math

from dlmrl.kinds.base import KINDS, PolicyKind, check_key, refuse_claimed_checkpoint

__all__ = ["CausalKind"]


class CausalKind(PolicyKind):
    """A causal LM (AutoModelForCausalLM) through the AR adapter: left-to-right generate, exact token log-probs."""

    name = "ar"
    algorithm_policy = "ar"
    autoregressive = True
    denoises = False
    scores_with_estimators = False
    uses_families = False
    default_algorithm = "grpo"
    turn_stops_at = "the end of the line of its first Action: or Final Answer:"

    # ----- loading -----------------------------------------------------------------------------------------
    def model_path(self, name_or_path: str) -> str:
        from dlmrl.models.ar import resolve_ar_model_path

        return resolve_ar_model_path(name_or_path)

    def load(self, model_cfg):
        from dlmrl.models.ar import load_ar_policy

        m = model_cfg
        # (its adapters, and those of a kind of your own that reuses this one: itself and its checkpoint_kinds)
        return load_ar_policy(m.name_or_path, m.trust_remote_code, m.dtype,
                              adapter_kinds=tuple(dict.fromkeys(("ar", self.name, *self.checkpoint_kinds))))

    def owns(self, policy) -> bool:
        from dlmrl.models.ar import AutoregressivePolicy

        return isinstance(policy, AutoregressivePolicy)

    def wrap(self, model, tokenizer, cfg):
        from dlmrl.models.ar import ar_policy_from_model

        return ar_policy_from_model(model, tokenizer)

    # ----- the config check ----------------------------------------------------------------------------------
    def check_model(self, cfg) -> None:
        # (the autoregressive checks, answer_mode and the sampling keys, are the base class's: a kind of your own
        # with autoregressive = True gets them too)
        super().check_model(cfg)
        refuse_claimed_checkpoint(cfg)  # (a checkpoint another kind claims, e.g. a DiffusionGemma)
        refuse_diffusion_checkpoint(cfg)

    # ----- budgets and sizes -----------------------------------------------------------------------------------
    def generation_budget(self, gen_length: int, preset) -> int:
        """``gen_length`` + EOS; with DAPO's soft overlong punishment ``⌈(gen_length + 1) / (1 − fraction)⌉``
        (**dlmrl interpretation**: the cache sits past the answer, so a complete answer is never punished and only
        tokens beyond it are)."""
        if preset is None or preset.overlong_cache_fraction is None:
            return gen_length + 1
        return math.ceil((gen_length + 1) / (1 - preset.overlong_cache_fraction))

    def budget_parts(self, preset) -> str:
        return " and EOS" if preset.overlong_cache_fraction is None else ", EOS and DAPO's overlong cache"

    def scoring_nfe(self, estimator, gen_length: int) -> int:
        return 1  # (exact token log-probs: one forward per completion)

    def memory_shapes(self, cfg, prompt: int, per_update: int, nfe: int) -> dict:
        length = cfg.sampling.gen_length
        # (the AR scorer keeps the logits of the L + 1 last positions and converts the L it scores)
        return {"canvases": per_update, "positions": prompt + length + 1, "head_positions": length + 1,
                "scored_positions": length, "float_copy_all": False, "cached": True, "rollout_block": 1,
                "rollout_forward_positions": 1, "dense_mask": False, "prefill_positions": 0}

    # ----- training ----------------------------------------------------------------------------------------
    def build_scorer(self, policy, ref, cfg, estimator, objective, processes: int):
        from dlmrl.training.scorers import ARScorer

        # (one process: an entropy preset with μ = 1 takes its entropies from the update's own forward)
        return ARScorer(policy, ref, old_scores=objective.needs_old_scores, share_forward=processes == 1,
                        micro_batch=cfg.estimator.micro_batch or None, logits_chunk=cfg.estimator.logits_chunk or None)

    def sample(self, policy, task, cfg, examples: list, generator, max_length: int, temperature_fn=None,
               prompts: tuple[int, int] | None = None):
        from dlmrl.training.rollout import rollout_ar

        return rollout_ar(policy, task, cfg, examples, generator, max_new_tokens=max_length,
                          temperature_fn=temperature_fn, prompts=prompts)

    def sample_tool_loop(self, policy, make_env, examples: list, generator, max_length: int, cfg, task,
                         temperature_fn=None):
        from dlmrl.training.tool_loop import rollout_tool_loop

        return rollout_tool_loop(policy, make_env, examples, cfg.train.num_generations, generator, max_length,
                                 cfg.sampling.temperature, temperature_fn)

    def evaluate(self, policy, task, settings) -> dict:
        from dlmrl.evaluation.heldout import evaluate_ar

        s = settings
        return evaluate_ar(policy, task, num_puzzles=s.num_puzzles, batch_size=s.batch_size,
                           temperature=s.temperature, seed=s.seed, protocol=s.protocol)

    # ----- --dry-run -----------------------------------------------------------------------------------------
    def plan_token_logprobs(self, cfg, family: str) -> str:
        return (f"from the model's output head (get_output_embeddings), completion positions only, "
                f"{cfg.estimator.logits_chunk} per head call, recomputed in the backward (a model that changes the "
                "head's output is refused)")

    def plan_estimator(self, cfg, spec) -> dict:
        return {"name": "exact token log-probs (AR)", "nfe": 1}

    def plan_sampler(self, cfg, preset, written) -> dict:
        budget = self.generation_budget(cfg.sampling.gen_length, preset)  # (DAPO: its overlong cache past the answer)
        return {"kind": "left to right (generate)", "max_new_tokens": budget, "temperature": cfg.sampling.temperature,
                "nfe_per_completion": f"at most {budget}"}

    def plan_budget(self, preset) -> str:
        return ("sampling.gen_length + 1, the AR completion width" if preset.overlong_cache_fraction is None else
                "sampling.gen_length + 1 and DAPO's overlong cache past it; its length punishment counts the policy's "
                "tokens")


KINDS.register("ar")(CausalKind())


#: diffusion families whose published code has no causal mode dlmrl can run (the ``model.kind`` each runs as);
#: Nemotron-Labs-Diffusion runs both ways and is checked by its ``dlm_paradigm``
DIFFUSION_ONLY_FAMILIES = {"llada": "diffusion", "dream": "diffusion", "llada_moe": "diffusion", "sdar": "block",
                           "llada2": "block", "fast_dllm_v2": "block"}


def refuse_diffusion_checkpoint(cfg) -> None:
    """Refuse ``model.kind: ar`` on a checkpoint of a diffusion family (:data:`DIFFUSION_ONLY_FAMILIES`): its code
    builds bidirectional or block attention (Fast-dLLM v2's eval branch its own block mask whatever the caller asks),
    so a causal LM loaded from it would either crash in the code or train a model that is not causal; and a
    checkpoint that ships its own code (Nemotron-Labs-Diffusion, which does run causally) without
    ``model.trust_remote_code``. The family is read from a local ``config.json`` as JSON (no code runs), or for a hub
    id from ``model.architecture`` (the memory plan's description: its ``model_type``); neither: left to the load.

    Raises:
        ConfigError: naming ``model.kind`` and the kind to set, or ``model.trust_remote_code``.
    """
    from dlmrl.kinds.families import CODE_SHIPPING_FAMILIES, local_families
    from dlmrl.models.families import FAMILIES

    found = local_families(cfg.model.name_or_path)
    if found is None and cfg.model.architecture:
        found = [name for name in FAMILIES.names() if FAMILIES.get(name).detect(dict(cfg.model.architecture))]
    found = found or []
    shipped = [f for f in found if f in CODE_SHIPPING_FAMILIES]
    check_key(cfg.model.trust_remote_code or not shipped, "model.trust_remote_code",
              f"{cfg.model.name_or_path!r} is a {shipped[0] if shipped else ''!r} checkpoint, which ships its own "
              "model code, and loading it runs that code: set model.trust_remote_code=true if you trust its source")
    diffusion = [f for f in found if f in DIFFUSION_ONLY_FAMILIES]
    check_key(not diffusion, "model.kind",
              f"{cfg.model.name_or_path!r} is a {diffusion[0] if diffusion else ''!r} diffusion checkpoint; its "
              "published code has no causal mode, so model.kind ar cannot run it: set model.kind "
              f"{DIFFUSION_ONLY_FAMILIES.get(diffusion[0], '') if diffusion else ''}")

