"""Likelihood estimators for masked-diffusion policies: mask plans, quadrature, scoring, ELBOs.

``ESTIMATORS`` maps a name to an estimator class, a frozen dataclass subclassing :class:`PlanEstimator` whose
fields are its settings: the config builds it with ``cls.from_config(...)`` (the flat ``estimator.*`` keys it reads,
then ``estimator.options`` by field name) and it describes itself with ``describe()``
(:mod:`dlmrl.estimators.configurable`). A class registered from outside the package
(``ESTIMATORS.register("mine")(Mine)`` in a module ``dlmrl train --import`` loads) is chosen by
``estimator.name: mine``. Every class has
``make_plan(completion_mask (B, L), generator_or_seed, prompt_mask (B, P)) -> MaskPlan``,
``nfe`` and ``estimate(policy, prompt_ids, prompt_mask, completion, completion_mask, generator)
-> Estimate``; the trainer calls ``rollout_plan`` (which may also read the sampler's trajectory record
or the advantages); the mask-only ones also have ``moments(SizeStats) -> Moments`` (exact mean and
variance from a row's :class:`MaskTable`).
"""

from dlmrl.estimators.configurable import ConfigurableEstimator, EstimatorDescription
from dlmrl.estimators.coupled import Coupled, StratifiedCoupled
from dlmrl.estimators.coupled_sdmc import CoupledSDMC
from dlmrl.estimators.double_mc import DoubleMC
from dlmrl.estimators.exact import Exact, enumeration_masks, exact_elbo
from dlmrl.estimators.mask_plan import MaskPlan, UpperBound
from dlmrl.estimators.mask_table import MaskTable, mask_table
from dlmrl.estimators.masking import MASKING_MODES, sample_masks
from dlmrl.estimators.moments import Moments, SizeStats
from dlmrl.estimators.one_step import OneStep
from dlmrl.estimators.quadrature import gauss_legendre_unit
from dlmrl.estimators.scoring import (
    Estimate,
    PlanEstimator,
    as_generator,
    sample_scores,
    score,
    score_and_backward,
)
from dlmrl.estimators.sdmc import SDMC
from dlmrl.estimators.spg import SPGEstimator
from dlmrl.estimators.trajectory import Trajectory, left_to_right_order, trajectory_plan
from dlmrl.estimators.validation import OptionError
from dlmrl.registry import Registry

ESTIMATORS: Registry[type] = Registry("estimator")
ESTIMATORS.register("sdmc")(SDMC)
ESTIMATORS.register("double_mc")(DoubleMC)
ESTIMATORS.register("one_step")(OneStep)
ESTIMATORS.register("coupled")(Coupled)
ESTIMATORS.register("coupled_sdmc")(CoupledSDMC)
ESTIMATORS.register("exact")(Exact)
ESTIMATORS.register("trajectory")(Trajectory)
ESTIMATORS.register("spg")(SPGEstimator)
ESTIMATORS.register("stratified_coupled")(StratifiedCoupled)

__all__ = [
    "ESTIMATORS",
    "MASKING_MODES",
    "SDMC",
    "ConfigurableEstimator",
    "Coupled",
    "CoupledSDMC",
    "DoubleMC",
    "Estimate",
    "EstimatorDescription",
    "Exact",
    "MaskPlan",
    "MaskTable",
    "Moments",
    "OneStep",
    "OptionError",
    "PlanEstimator",
    "SPGEstimator",
    "SizeStats",
    "StratifiedCoupled",
    "Trajectory",
    "UpperBound",
    "as_generator",
    "enumeration_masks",
    "exact_elbo",
    "gauss_legendre_unit",
    "left_to_right_order",
    "mask_table",
    "sample_masks",
    "sample_scores",
    "score",
    "score_and_backward",
    "trajectory_plan",
]
