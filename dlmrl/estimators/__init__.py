"""Likelihood estimators for masked-diffusion policies: mask plans, quadrature, scoring, ELBOs.

``ESTIMATORS`` maps a name to an estimator class; every class has
``make_plan(completion_mask (B, L), generator) -> MaskPlan`` and
``estimate(policy, prompt_ids, prompt_mask, completion, completion_mask, generator) -> Estimate``.
"""

from dlmrl.estimators.double_mc import DoubleMC
from dlmrl.estimators.exact import Exact, enumeration_masks, exact_elbo
from dlmrl.estimators.mask_plan import MaskPlan
from dlmrl.estimators.masking import MASKING_MODES, sample_masks
from dlmrl.estimators.quadrature import gauss_legendre_unit
from dlmrl.estimators.scoring import Estimate, PlanEstimator, score
from dlmrl.estimators.sdmc import SDMC
from dlmrl.registry import Registry

ESTIMATORS: Registry[type] = Registry("estimator")
ESTIMATORS.register("sdmc")(SDMC)
ESTIMATORS.register("double_mc")(DoubleMC)
ESTIMATORS.register("exact")(Exact)

__all__ = [
    "ESTIMATORS",
    "MASKING_MODES",
    "SDMC",
    "DoubleMC",
    "Estimate",
    "Exact",
    "MaskPlan",
    "PlanEstimator",
    "enumeration_masks",
    "exact_elbo",
    "gauss_legendre_unit",
    "sample_masks",
    "score",
]
