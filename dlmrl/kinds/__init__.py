"""Policy kinds (``model.kind``) as objects: one module per kind, registered by name.

- :mod:`dlmrl.kinds.base`: the :class:`PolicyKind` interface and the :data:`KINDS` registry;
- :mod:`dlmrl.kinds.masked`: ``diffusion``, full-attention masked diffusion (LLaDA, Dream, masked LMs);
- :mod:`dlmrl.kinds.block`: ``block``, block diffusion (SDAR/TraDo, LLaDA2);
- :mod:`dlmrl.kinds.causal`: ``ar``, a causal LM through the AR adapter;
- :mod:`dlmrl.kinds.uniform`: ``uniform``, a uniform-noise diffusion LM (DiffusionGemma), the trajectory likelihood;
- :mod:`dlmrl.kinds.families`: the diffusion kinds' checks of a checkpoint's family.

A kind from outside (a plugin module, ``--import``, the ``dlmrl.plugins`` entry point) subclasses
:class:`PolicyKind` and registers an instance: ``KINDS.register("my_kind")(MyKind())`` (README, "Extending dlmrl").
"""

from dlmrl.kinds.base import (
    KINDS,
    PolicyKind,
    check_key,
    find_kind,
    is_policy,
    kind_names,
    kind_of,
    policy_kind,
    warn_key,
)
from dlmrl.kinds.block import BlockDiffusionKind
from dlmrl.kinds.causal import CausalKind
from dlmrl.kinds.masked import MaskedDiffusionKind
from dlmrl.kinds.uniform import UniformNoiseKind
from dlmrl.models.checkpoint_keys import KIND_KEY

__all__ = ["KINDS", "KIND_KEY", "BlockDiffusionKind", "CausalKind", "MaskedDiffusionKind", "PolicyKind",
           "UniformNoiseKind", "check_key", "find_kind", "is_policy", "kind_names", "kind_of", "policy_kind", "warn_key"]
