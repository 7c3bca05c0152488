"""Algorithm presets: ``algorithm=<name>`` picks one; any part can be overridden by name.

A preset is a :class:`GroupObjective` plus the advantage estimator (name and options), the policy
kinds it runs on and the rollout-side switches the trainer and samplers honour (dynamic sampling,
overlong punishment, adaptive temperature, anchors, multi-turn episodes).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import torch

from dlmrl.errors import OptionError
from dlmrl.objectives.advantage_registry import (
    ADVANTAGE_INPUTS,
    AdvantageInputs,
    check_advantage_options,
    compute_advantages,
)
from dlmrl.objectives.objective import GroupObjective
from dlmrl.registry import Registry

POLICIES = ("ar", "diffusion", "block")  # (block: block-diffusion policies only, dlmrl.kinds.block)


@dataclass(frozen=True)
class AlgorithmPreset:
    """A named algorithm as a preset of parts.

    Attributes:
        name: the registry name.
        objective: the loss (:class:`GroupObjective`).
        advantage: a registered advantage estimator (:data:`dlmrl.objectives.advantage_registry.ADVANTAGES`).
        advantage_options: its options (e.g. ``{"k": 4}``).
        policies: the policy kinds it runs on: ``"ar"`` and/or ``"diffusion"`` (token-level parts run
            on a diffusion policy through the estimators' per-token ELBO contributions; block-diffusion policies
            included), or ``"block"`` (block-diffusion policies only).
        estimator: the diffusion likelihood estimator of the paper's recipe (``None``: any).
        estimator_options: the recipe estimator's settings, as ``estimator`` config fields (e.g.
            ``{"order": "left_to_right"}``); applied when ``estimator.name`` is null (the recipe is used).
        dynamic_sampling: drop groups whose rewards are all equal and sample new prompts until the batch
            has ``prompts_per_step`` informative groups (DAPO).
        dynamic_sampling_max_rounds: most *extra* rollout rounds of dynamic sampling per step (each
            round samples ``prompts_per_step`` new prompts; verl's ``max_num_gen_batches`` minus one);
            still short after them, the step trains on what it collected. 0 = drop only.
        overlong_cache_fraction: soft overlong punishment with ``L_cache = fraction · L_max``
            (``None`` = off; DAPO: 4096 / 20480 = 0.2).
        adaptive_temperature_tau: HAPO's ``τ`` for the AR sampler's adaptive temperature (``None`` = off).
        anchor_threshold: DaGRPO: add the reference solution to a group with no reward above this
            (``None`` = no anchors); the anchor's loss weight is ``objective.anchor_weight``.
        multi_turn: samples are turns of multi-turn episodes (Flow-GRPO; needs an environment).
        reference: the arXiv id.
    """

    name: str
    objective: GroupObjective
    advantage: str = "group"
    advantage_options: Mapping[str, object] = field(default_factory=dict)
    policies: tuple[str, ...] = ("ar", "diffusion")
    estimator: str | None = None
    estimator_options: Mapping[str, object] = field(default_factory=dict)
    dynamic_sampling: bool = False
    dynamic_sampling_max_rounds: int = 3
    overlong_cache_fraction: float | None = None
    adaptive_temperature_tau: float | None = None
    anchor_threshold: float | None = None
    multi_turn: bool = False
    reference: str = ""

    def __post_init__(self) -> None:
        try:
            check_advantage_options(self.advantage, dict(self.advantage_options))
        except ValueError as err:
            raise OptionError("advantage", str(err)) from None
        if not self.policies or any(p not in POLICIES for p in self.policies):
            raise OptionError("policies", f"policies must be a non-empty subset of {POLICIES}, got {self.policies!r}")
        frac = self.overlong_cache_fraction
        if frac is not None and not 0 < frac <= 1:
            raise OptionError("overlong_cache_fraction", f"overlong_cache_fraction must be in (0, 1], got {frac}")
        rounds = self.dynamic_sampling_max_rounds
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
            raise OptionError("dynamic_sampling_max_rounds", f"dynamic_sampling_max_rounds must be an integer >= 0, got {rounds!r}")
        tau = self.adaptive_temperature_tau
        if tau is not None and not 0 <= tau < 1:
            raise OptionError("adaptive_temperature_tau", f"adaptive_temperature_tau must be in [0, 1), got {tau}")

    @staticmethod
    def overridable() -> tuple[str, ...]:
        """Every name :meth:`with_overrides` accepts."""
        own = tuple(f.name for f in dataclasses.fields(AlgorithmPreset) if f.name not in ("name", "objective"))
        return GroupObjective.field_names() + own

    def with_overrides(self, **overrides) -> AlgorithmPreset:
        """A copy with some parts replaced, e.g. ``with_overrides(epsilon=0.3, loss_type="dapo")``.

        Names are :class:`GroupObjective` fields or preset fields. ``advantage_options`` merges into the
        current options (a new ``advantage`` without options starts from that estimator's defaults).

        Raises:
            ValueError: an unknown name (with a did-you-mean) or an invalid value.
        """
        known = self.overridable()
        objective_kw, preset_kw = {}, {}
        for key, value in overrides.items():
            if key not in known:
                close = difflib.get_close_matches(key, known, n=3)
                hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
                raise OptionError(key, f"algorithm {self.name!r} has no part {key!r}.{hint}")
            (objective_kw if key in GroupObjective.field_names() else preset_kw)[key] = value
        new_advantage = preset_kw.get("advantage", self.advantage)
        base = dict(self.advantage_options) if new_advantage == self.advantage else {}
        preset_kw["advantage_options"] = {**base, **dict(preset_kw.get("advantage_options", {}))}
        if "policies" in preset_kw:
            preset_kw["policies"] = tuple(preset_kw["policies"])
        if "estimator_options" in preset_kw:
            preset_kw["estimator_options"] = dict(preset_kw["estimator_options"])
        return replace(self, objective=replace(self.objective, **objective_kw), **preset_kw)

    @property
    def required_inputs(self) -> frozenset[str]:
        """Inputs the trainer must provide: objective inputs (``entropy``, ``segment_ids``, ``group_ids``,
        ``logp_ref``) and advantage inputs (``mask``, ``entropy``, ``trajectory_ids``)."""
        return self.objective.required_inputs | ADVANTAGE_INPUTS.get(self.advantage, frozenset())

    def advantages(self, inputs: AdvantageInputs) -> torch.Tensor:
        """The preset's advantages: ``(B,)`` or ``(B, L)`` float32."""
        return compute_advantages(self.advantage, inputs, **dict(self.advantage_options))


PresetFactory = Callable[[], AlgorithmPreset]
ALGORITHMS: Registry[PresetFactory] = Registry("algorithm")


def get_algorithm(name: str, **overrides) -> AlgorithmPreset:
    """The preset ``name`` with ``overrides`` applied (see :meth:`AlgorithmPreset.with_overrides`).

    Raises:
        ValueError: an unknown algorithm (with a did-you-mean) or an invalid override.
    """
    try:
        factory = ALGORITHMS.get(name)
    except KeyError as err:
        raise ValueError(err.args[0]) from None
    preset = factory()
    return preset.with_overrides(**overrides) if overrides else preset


# ---------------------------------------------------------------------------------------------
# The GRPO family, GDPO and diffu-GRPO


@ALGORITHMS.register("grpo")
def grpo() -> AlgorithmPreset:
    """GRPO (arXiv 2402.03300): token ratio, ε 0.2, group advantages, k3 KL β 0.04, ``grpo`` loss.

    Runs on AR and diffusion policies.
    """
    return AlgorithmPreset("grpo", GroupObjective(epsilon=0.2, beta=0.04, loss_type="grpo"), "group",
                           reference="2402.03300")


@ALGORITHMS.register("dr_grpo")
def dr_grpo() -> AlgorithmPreset:
    """Dr. GRPO (arXiv 2503.20783): advantages ``R − mean`` (no std), ``dr_grpo`` loss, no KL, ε 0.2.

    Runs on AR and diffusion policies. Set ``max_completion_length`` to the run's generation budget.
    """
    return AlgorithmPreset("dr_grpo", GroupObjective(epsilon=0.2, loss_type="dr_grpo"), "none",
                           reference="2503.20783")


@ALGORITHMS.register("dapo")
def dapo() -> AlgorithmPreset:
    """DAPO (arXiv 2503.14476): clip-higher ε 0.2/0.28, token-level ``dapo`` loss, no KL, group
    advantages, dynamic sampling (resampling new prompts, at most 3 extra rounds per step), soft overlong
    punishment.

    **(dlmrl interpretation)**: ``L_cache`` is expressed as a fraction of ``L_max`` (0.2, the paper's
    4096 of 20480) so the preset fits any generation budget; the bound of 3 extra rounds is ours (the
    paper gives none; verl's recipe bounds them by ``max_num_gen_batches``). Runs on AR and diffusion policies (on a
    fixed diffusion canvas the overlong length is the answer's length up to EOS).
    """
    return AlgorithmPreset("dapo", GroupObjective(epsilon=0.2, epsilon_high=0.28, loss_type="dapo"), "group",
                           dynamic_sampling=True, overlong_cache_fraction=0.2, reference="2503.14476")


@ALGORITHMS.register("gspo")
def gspo() -> AlgorithmPreset:
    """GSPO (arXiv 2507.18071): sequence ratio ``exp(mean_t log r_t)``, ε 3e-4/4e-4, group advantages,
    no KL, ``grpo`` loss. Runs on AR and diffusion policies."""
    return AlgorithmPreset("gspo", GroupObjective("sequence", epsilon=3e-4, epsilon_high=4e-4), "group",
                           reference="2507.18071")


@ALGORITHMS.register("gspo_token")
def gspo_token() -> AlgorithmPreset:
    """GSPO-token (arXiv 2507.18071): the sequence ratio's value with per-token gradients (so token-level
    advantages can be used); otherwise as ``gspo``. Runs on AR and diffusion policies."""
    return AlgorithmPreset("gspo_token", GroupObjective("sequence_token", epsilon=3e-4, epsilon_high=4e-4),
                           "group", reference="2507.18071")


@ALGORITHMS.register("rloo")
def rloo() -> AlgorithmPreset:
    """RLOO (arXiv 2402.14740): leave-one-out advantages ``R_i − mean_{j≠i} R_j``.

    **(dlmrl interpretation)** of the other parts (the paper is plain REINFORCE): token ratio, ε 0.2,
    ``grpo`` loss, no KL; with one update per batch the ratio is 1 and the clip never acts. Runs on AR
    and diffusion policies.
    """
    return AlgorithmPreset("rloo", GroupObjective(epsilon=0.2), "rloo", reference="2402.14740")


@ALGORITHMS.register("gdpo")
def gdpo() -> AlgorithmPreset:
    """GDPO (arXiv 2510.08554): sequence ratio of ELBOs ``exp((ELBO_new − ELBO_old) / L)``, ε 0.5,
    advantages ``R − mean``, ``grpo`` loss; β 0 by default, else k3 on length-normalised ELBOs
    (``kl_level="sequence"``, **dlmrl interpretation**). Diffusion only; SDMC ELBO contributions.

    Same loss, metrics and gradient as :func:`dlmrl.objectives.gdpo.gdpo_loss` on ``per_token.sum(-1)``.
    """
    return AlgorithmPreset("gdpo", GroupObjective("sequence", epsilon=0.5, kl_level="sequence"), "none",
                           policies=("diffusion",), estimator="sdmc", reference="2510.08554")


@ALGORITHMS.register("diffu_grpo")
def diffu_grpo() -> AlgorithmPreset:
    """diffu-GRPO (d1, arXiv 2504.12216): one-step token log-probs, token ratio, ε 0.5, advantages
    ``R − mean``, k3 KL β 0.04, ``grpo`` loss. Diffusion only (``one_step`` estimator)."""
    return AlgorithmPreset("diffu_grpo", GroupObjective(epsilon=0.5, beta=0.04), "none",
                           policies=("diffusion",), estimator="one_step", reference="2504.12216")


# ---------------------------------------------------------------------------------------------
# Diffusion objectives that score the trajectory, or no ratio at all (TraceRL, JustGRPO, wd1, SPG, ESPO)


@ALGORITHMS.register("tracerl")
def tracerl() -> AlgorithmPreset:
    """TraceRL (arXiv 2509.06949): the ``trajectory`` estimator (the rollout's own reveal order, one canvas per
    step), token ratio clipped to ``[0.8, 1.2]``, group z-scored advantages, k3 KL β 0.01 toward the rollout
    policy, ``grpo`` loss. Diffusion only.

    From the authors' code (Gen-Verse/dLLM-RL ``train/rl_llada.py``, ``reward/rl_reward.py``): the ratio, clip
    and KL (k3 against ``logp_old``, not a frozen reference) as there. **(dlmrl interpretation)**: the code
    averages the loss per (completion, step-group) row, weighting a token by one over the tokens revealed with
    it; here the ``grpo`` loss averages per completion. Its std is the population std (here Bessel's, as
    ``group``); its filter dropping groups with accuracy outside [0.2, 0.8] and its optional value model are
    left out. With μ = 1 and one optimizer step per rollout batch (``train.steps_per_generation`` 1) every ratio is
    1 and the KL toward the rollout policy is 0; the authors' code takes several optimizer steps per batch
    (``configs/sdar_tracerl_math.yaml`` maps them).
    """
    objective = GroupObjective(epsilon=0.2, beta=0.01, kl_reference="old")
    return AlgorithmPreset("tracerl", objective, "group", policies=("diffusion",), estimator="trajectory",
                           estimator_options={"order": "sampled", "merge": 1}, reference="2509.06949")


@ALGORITHMS.register("just_grpo")
def just_grpo() -> AlgorithmPreset:
    """JustGRPO (arXiv 2601.15165): GRPO on the exact likelihood of a left-to-right order (the ``trajectory``
    estimator with ``order: left_to_right``, one canvas per token), token ratio, ε 0.2, group z-scored
    advantages, no KL, ``grpo`` loss. Diffusion only.

    The authors' code (LeapLabTHU/JustGRPO ``grpo.py``) also *samples* left to right (LLaDA's sampler with
    block length 1): set ``sampling.remasking: left_to_right`` (``configs/just_grpo_sudoku_tiny.yaml`` does)
    and the sampled order is the scored one. **(dlmrl interpretation)**: its loss divides each token's term by
    the generation length and the group's count of non-zero advantages; here ``grpo`` (mean over a
    completion's tokens, then over completions).
    """
    return AlgorithmPreset("just_grpo", GroupObjective(epsilon=0.2), "group", policies=("diffusion",),
                           estimator="trajectory", estimator_options={"order": "left_to_right", "merge": 1},
                           reference="2601.15165")


@ALGORITHMS.register("block_just_grpo")
def block_just_grpo() -> AlgorithmPreset:
    """BlockJustGRPO (NVIDIA NeMo RL, pull request 3167: JustGRPO, arXiv 2601.15165, on a block-diffusion model):
    JustGRPO's objective on the left-to-right order inside each block, scored in ``⌈B / k⌉`` composite passes
    instead of one per token: level ``l`` reveals the first ``l·k`` tokens of every block and scores the next
    ``k`` (``k`` = ``estimator.merge``, default 1; with ``estimator.name`` null, as in a config file, the preset
    sets ``order: left_to_right`` and ``merge`` is the section's; naming ``estimator.name`` yourself, set
    ``estimator.order: left_to_right`` too). Block diffusion only.

    At ``k = 1`` these are JustGRPO's exact left-to-right log-probs (each token given the tokens before it in its
    block and the clean blocks before); ``k > 1`` scores a level's ``k`` tokens given only the first ``l·k``, an
    approximation (NeMo RL's own note), in fewer passes. It is dlmrl's block ``trajectory`` estimator with
    ``order: left_to_right`` and ``merge: k`` (NeMo RL ``nemo_rl/algorithms/block_just_grpo_logprobs.py``:
    ``build_block_reveal_base``, ``make_reveal_level_view``, with blocks counted from the response start, as
    dlmrl's); ``tests/estimators/test_block_just_grpo.py`` checks it against a per-token and a per-level loop.
    """
    return AlgorithmPreset("block_just_grpo", GroupObjective(epsilon=0.2), "group", policies=("block",),
                           estimator="trajectory", estimator_options={"order": "left_to_right"},
                           reference="2601.15165")  # (no merge here: estimator.merge, the user's k, stands)


@ALGORITHMS.register("wd1")
def wd1() -> AlgorithmPreset:
    """wd1 (arXiv 2507.08838): ratio-free weighted likelihood ``−Σ_i softmax(A)_i ℓ_i + Σ_i softmax(−A)_i ℓ_i``
    per group (``A = R − mean``, no std), ``ℓ`` the completion's summed log-likelihood (d1's ``one_step``
    estimator), no old-policy or reference pass, no KL. Diffusion only.

    As the ``wd1`` advantage (``n_g · (w⁺ − w⁻)``, :func:`dlmrl.objectives.advantages.wd1_advantages`) with
    ``ratio_level: none`` and the ``sequence_sum`` loss (code: xiaohangt/wd1 ``rev_grpo_trainer.py``).
    """
    objective = GroupObjective(ratio_level="none", loss_type="sequence_sum")
    return AlgorithmPreset("wd1", objective, "wd1", policies=("diffusion",), estimator="one_step",
                           reference="2507.08838")


@ALGORITHMS.register("spg")
def spg() -> AlgorithmPreset:
    """SPG (arXiv 2510.09541): no ratio, no clip; ``−Σ_i A_i · bound_i / Σ_i |y_i|`` with the ELBO for
    ``A ≥ 0`` and the upper bound (or its mixture with the ELBO) for ``A < 0``, both on block-wise masks
    (the ``spg`` estimator, 2 masks per row), advantages ``R − mean``, no KL. Diffusion only.

    From the authors' code (facebookresearch/SPG ``spg/spg_trainer.py``): the loss is the per-row bound
    times the row's length, summed and divided by the batch's tokens (here: ``ratio_level: none`` with the
    ``dapo`` loss over the estimator's per-token terms, which sum to that). SPG's defaults: β 1.5 (Sudoku 1.0),
    mixture weight 0.5 (``estimator.eubo_beta``, ``estimator.mix_weight``).
    """
    objective = GroupObjective(ratio_level="none", loss_type="dapo")
    return AlgorithmPreset("spg", objective, "none", policies=("diffusion",), estimator="spg",
                           estimator_options={"samples_per_node": 2}, reference="2510.09541")


@ALGORITHMS.register("espo_dllm")
def espo_dllm() -> AlgorithmPreset:
    """ESPO for diffusion LMs (arXiv 2512.03759; not the entropy ESPO of arXiv 2512.00499): sequence ratio
    ``exp((ELBO − ELBO_old) / L)`` clipped to ``[0.8, 1.2]``, leave-one-out advantages (no std), k2 KL on the
    sequence ELBOs divided by the length (β 0.01, a frozen reference), ``grpo`` loss; the ELBO from the
    ``stratified_coupled`` estimator (counts stratified across rows, each mask with its complement, 2 pairs).
    Diffusion only.

    From the authors' code (ML-GSAI/ESPO ``espo/espo_trainer.py``, ``recipes/train.yaml``; its task scripts
    set β 1e-3 for GSM8K/MATH, 3e-3 and ε 0 for Countdown, 1e-2 for Sudoku). **(dlmrl interpretation)**: ``L``
    is each row's completion length (the code: the padded generation length).
    """
    objective = GroupObjective("sequence", epsilon=0.2, beta=0.01, kl_kind="k2", kl_level="sequence_sum_by_length")
    return AlgorithmPreset("espo_dllm", objective, "rloo", policies=("diffusion",), estimator="stratified_coupled",
                           estimator_options={"samples_per_node": 2}, reference="2512.03759")


# ---------------------------------------------------------------------------------------------
# The seed papers' algorithms


@ALGORITHMS.register("sspo")
def sspo() -> AlgorithmPreset:
    """SSPO (arXiv 2511.04256): sentence-level ratio (GSPO-token form), clip ``ε·(0.5 + h)`` with ``h``
    the sentence's entropy rank, ε 0.02, group advantages, ``grpo`` loss.

    **(dlmrl interpretation)** throughout (segments, rank, ε). Needs ``segment_ids``
    (:func:`dlmrl.objectives.segments.sentence_segments`) and ``entropy``. AR and diffusion.
    """
    return AlgorithmPreset("sspo", GroupObjective("sentence", epsilon=0.02, clip_rule="sspo"), "group",
                           reference="2511.04256")


@ALGORITHMS.register("espo")
def espo() -> AlgorithmPreset:
    """ESPO (arXiv 2512.00499 v2): entropy groups (top 20% / rest per response), group ratio = geometric
    mean of the token ratios (GSPO-token form), ``ε_g = 0.02 · mean_g H / log|V|``, loss = mean over
    responses of the mean over groups of the token mean (``segment_mean``), no KL, group advantages.

    Needs ``entropy`` and ``vocab_size`` (``with_overrides(vocab_size=...)``). AR and diffusion.
    """
    return AlgorithmPreset("espo", GroupObjective("entropy_group", clip_rule="espo", loss_type="segment_mean"),
                           "group", reference="2512.00499")


@ALGORITHMS.register("egsw")
def egsw() -> AlgorithmPreset:
    """EGSW (arXiv 2503.22456): GRPO with each sequence's loss weighted by
    ``G · softmax_group((A + 0.5·H̄) / 1)``.

    **(dlmrl interpretation)**: where the weight enters, α = 0.5, temperature 1, and GRPO's other parts
    (ε 0.2, β 0.04). ``weighting="egsw_step"`` gives the step-wise variant. Needs ``entropy`` and
    ``group_ids``. AR and diffusion.
    """
    return AlgorithmPreset("egsw", GroupObjective(epsilon=0.2, beta=0.04, weighting="egsw"), "group",
                           reference="2503.22456")


@ALGORITHMS.register("gtpo")
def gtpo() -> AlgorithmPreset:
    """GTPO (arXiv 2508.04349): entropy-shaped token advantages (α1 1, α2 0.1, split z-scores), token
    ratio, ε 0.2/0.28, ``dapo`` loss, no KL. Needs ``entropy`` for the advantages. AR and diffusion."""
    return AlgorithmPreset("gtpo", GroupObjective(epsilon=0.2, epsilon_high=0.28, loss_type="dapo"), "gtpo",
                           reference="2508.04349")


@ALGORITHMS.register("grpo_s")
def grpo_s() -> AlgorithmPreset:
    """GRPO-S (arXiv 2508.04349): GTPO's shaping with each response's mean entropy, one advantage per
    response, ``sequence`` ratio (**dlmrl interpretation** of the ratio type), ε 0.2/0.28, ``dapo``
    loss (so sequences are weighted by length; the objective warns). AR and diffusion."""
    return AlgorithmPreset("grpo_s", GroupObjective("sequence", epsilon=0.2, epsilon_high=0.28, loss_type="dapo"),
                           "grpo_s", reference="2508.04349")


@ALGORITHMS.register("hapo")
def hapo() -> AlgorithmPreset:
    """HAPO (arXiv 2509.16591): adaptive-temperature sampling (τ 0.05), token-level group average
    advantages, differential advantage redistribution (β 1), asymmetric adaptive clipping (α 1) on
    ε 0.2/0.2, dual clip 10, ``dapo`` loss, no KL.

    AR only: the adaptive temperature lives in the AR sampler (``adaptive_temperature_tau``; use
    :func:`dlmrl.objectives.entropy.hapo_temperature` with the previous step's
    :func:`~dlmrl.objectives.entropy.hapo_entropy_stats`). Needs ``entropy``.
    """
    objective = GroupObjective(epsilon=0.2, epsilon_high=0.2, clip_rule="hapo", dual_clip=10.0, loss_type="dapo",
                               hapo_advantage_beta=1.0)
    return AlgorithmPreset("hapo", objective, "hapo_token_group", policies=("ar",), adaptive_temperature_tau=0.05,
                           reference="2509.16591")


@ALGORITHMS.register("srpo")
def srpo() -> AlgorithmPreset:
    """SRPO (GREAM, arXiv 2510.20815): graded reward
    (:func:`dlmrl.objectives.shaping.srpo_graded_reward`) with the bonus-calibrated pass@k group
    advantage (pass@k, k = 4), token ratio, ε 0.2/0.2, dual clip 10, ``dapo`` loss, k3 KL β 0.001. AR and diffusion."""
    objective = GroupObjective(epsilon=0.2, epsilon_high=0.2, dual_clip=10.0, loss_type="dapo", beta=0.001)
    return AlgorithmPreset("srpo", objective, "srpo_passk", {"k": 4}, reference="2510.20815")


@ALGORITHMS.register("dagrpo")
def dagrpo() -> AlgorithmPreset:
    """DaGRPO (arXiv 2512.06337): pairwise advantage over distinct pairs (τ 0.1, λ 0.5) and off-policy
    anchors (ratio ``π/sg[π]``, loss weight 0.1) for groups with no reward above 0.

    **(dlmrl interpretation)** throughout (abstract only), including GRPO's other parts: token ratio,
    ε 0.2, ``grpo`` loss, no KL, and the anchor threshold 0. AR and diffusion: the trainer adds the example's
    reference solution (:func:`dlmrl.training.anchors.add_anchors`; Sudoku: the solution grid) to each group
    whose task rewards are all ``<= 0``, and passes the token 3-gram Jaccard similarities to the advantage.
    """
    return AlgorithmPreset("dagrpo", GroupObjective(epsilon=0.2, anchor_weight=0.1), "dagrpo",
                           {"tau": 0.1, "lam": 0.5}, anchor_threshold=0.0, reference="2512.06337")


@ALGORITHMS.register("flow_grpo")
def flow_grpo() -> AlgorithmPreset:
    """Flow-GRPO (AgentFlow, arXiv 2510.05592): every turn of a multi-turn episode is a sample carrying
    the trajectory's z-scored final reward (``turn_weighted`` pools turns, as the authors' code); token
    ratio, ε 0.2/0.3, k3 KL β 0.001, ``dapo`` loss. AR only: the trainer plays ``num_generations`` episodes
    per prompt in ``train.env`` (:mod:`dlmrl.envs`; Sudoku: ``sudoku_feedback``) of at most ``train.max_turns``
    turns (:func:`dlmrl.training.episodes.rollout_episodes`)."""
    objective = GroupObjective(epsilon=0.2, epsilon_high=0.3, beta=0.001, loss_type="dapo")
    return AlgorithmPreset("flow_grpo", objective, "flow_grpo", policies=("ar",), multi_turn=True,
                           reference="2510.05592")
