"""The group optimizer: advantage estimators, ratio levels, clip rules, aggregation, KL, weights,
composed by :class:`GroupObjective`, and the algorithm presets (:data:`ALGORITHMS`). Clip rules, loss types
and weightings are registered parts (:data:`CLIP_RULES`, :data:`LOSS_TYPES`, :data:`WEIGHTINGS`)."""

from dlmrl.objectives.advantage_registry import ADVANTAGES, AdvantageInputs, compute_advantages
from dlmrl.objectives.advantages import (
    SCALE_REWARDS,
    flow_grpo_advantages,
    group_advantages,
    hapo_token_group_advantages,
    rloo_advantages,
)
from dlmrl.objectives.aggregation import LOSS_TYPES, Aggregation, aggregate
from dlmrl.objectives.clip_rules import CLIP_RULES, ClipRule
from dlmrl.objectives.clipping import ClipResult, clipped_surrogate
from dlmrl.objectives.gdpo import gdpo_loss
from dlmrl.objectives.kl import KL_KINDS, KL_LEVELS, kl_estimate, kl_term
from dlmrl.objectives.objective import GroupObjective, ObjectiveOutput, ObjectiveParts
from dlmrl.objectives.pairwise import dagrpo_advantages, groups_needing_anchor, ngram_jaccard
from dlmrl.objectives.passk import passk_bonus, srpo_passk_advantages
from dlmrl.objectives.presets import ALGORITHMS, AlgorithmPreset, get_algorithm
from dlmrl.objectives.ratios import RATIO_LEVELS, log_ratio
from dlmrl.objectives.segments import delimiter_token_ids, sentence_segments
from dlmrl.objectives.shaping import dynamic_sampling_keep, soft_overlong_punishment, srpo_graded_reward
from dlmrl.objectives.token_rewards import grpo_s_advantages, gtpo_advantages
from dlmrl.objectives.weighting import WEIGHTINGS, Weighting

__all__ = [
    "ADVANTAGES",
    "ALGORITHMS",
    "CLIP_RULES",
    "KL_KINDS",
    "KL_LEVELS",
    "LOSS_TYPES",
    "RATIO_LEVELS",
    "SCALE_REWARDS",
    "WEIGHTINGS",
    "AdvantageInputs",
    "Aggregation",
    "AlgorithmPreset",
    "ClipResult",
    "ClipRule",
    "GroupObjective",
    "ObjectiveOutput",
    "ObjectiveParts",
    "Weighting",
    "aggregate",
    "clipped_surrogate",
    "compute_advantages",
    "dagrpo_advantages",
    "delimiter_token_ids",
    "dynamic_sampling_keep",
    "flow_grpo_advantages",
    "gdpo_loss",
    "get_algorithm",
    "group_advantages",
    "groups_needing_anchor",
    "grpo_s_advantages",
    "gtpo_advantages",
    "hapo_token_group_advantages",
    "kl_estimate",
    "kl_term",
    "log_ratio",
    "ngram_jaccard",
    "passk_bonus",
    "rloo_advantages",
    "sentence_segments",
    "soft_overlong_punishment",
    "srpo_graded_reward",
    "srpo_passk_advantages",
]
