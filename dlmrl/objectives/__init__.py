"""Group optimizer parts: advantages, KL estimators, and the GDPO loss."""

from dlmrl.objectives.advantages import SCALE_REWARDS, group_advantages, rloo_advantages
from dlmrl.objectives.gdpo import gdpo_loss
from dlmrl.objectives.kl import KL_KINDS, kl_estimate

__all__ = [
    "KL_KINDS",
    "SCALE_REWARDS",
    "gdpo_loss",
    "group_advantages",
    "kl_estimate",
    "rloo_advantages",
]
