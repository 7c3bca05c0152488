"""One place that turns flat settings (the config's ``estimator`` section) into an estimator object."""

from __future__ import annotations

from dlmrl.estimators.scoring import PlanEstimator

TRAINABLE = ("sdmc", "double_mc", "coupled_sdmc", "coupled", "one_step", "trajectory", "spg", "stratified_coupled")

#: the ``estimator`` config fields each estimator reads (``micro_batch`` applies to all); the others are ignored
FIELDS_USED: dict[str, frozenset[str]] = {
    "sdmc": frozenset({"num_nodes", "samples_per_node", "masking"}),
    "coupled_sdmc": frozenset({"num_nodes", "samples_per_node", "masking"}),
    "double_mc": frozenset({"num_nodes", "samples_per_node", "masking", "stratified"}),
    "coupled": frozenset({"samples_per_node", "masking", "t_min", "t_max"}),
    "stratified_coupled": frozenset({"samples_per_node"}),
    "one_step": frozenset({"samples_per_node", "p_mask_prompt"}),
    "trajectory": frozenset({"merge", "order"}),
    "spg": frozenset({"samples_per_node", "p_mask_prompt", "eubo_beta", "mix_weight", "mask_block_length"}),
    "exact": frozenset(),
}


def make_estimator(
    name: str,
    num_nodes: int = 3,
    samples_per_node: int = 1,
    masking: str = "exact_count",
    stratified: bool = False,
    p_mask_prompt: float = 0.15,
    t_min: float = 0.2,
    t_max: float = 0.8,
    merge: int = 1,
    order: str = "sampled",
    eubo_beta: float = 1.5,
    mix_weight: float = 0.5,
    block_length: int = 32,
    temperature: float = 1.0,
    steps: int | None = None,
) -> PlanEstimator:
    """Build a registered estimator from the config's fields.

    Meaning of the fields per estimator (NFE in brackets):

    - ``sdmc``, ``coupled_sdmc``: N = ``num_nodes`` nodes, K = ``samples_per_node`` masks each [N·K];
    - ``double_mc``: ``num_nodes · samples_per_node`` random times, one mask each, ``stratified``
      optional [N·K];
    - ``coupled``: ``samples_per_node`` pairs of a mask and its complement, ``t ~ U(t_min, t_max)`` [2K];
    - ``stratified_coupled``: ``samples_per_node`` pairs with counts stratified across rows (ESPO) [2K];
    - ``one_step``: ``samples_per_node`` prompt masks with ``p_mask_prompt`` [K];
    - ``trajectory``: the rollout's own order (``order``), ``merge`` steps per segment, log-probs at
      ``temperature`` [⌈steps / merge⌉];
    - ``spg``: ``samples_per_node`` block-wise masks (``block_length``), prompt masks with ``p_mask_prompt``,
      upper bound of order ``eubo_beta`` mixed with weight ``mix_weight`` [K];
    - ``exact``: enumeration (``num_nodes`` etc. ignored) [2^L − 1].

    Raises:
        KeyError: unknown name (with a did-you-mean).
        ValueError: a field the estimator rejects (the message names it).
    """
    from dlmrl.estimators import ESTIMATORS

    cls = ESTIMATORS.get(name)
    if name == "sdmc" or name == "coupled_sdmc":
        return cls(num_nodes=num_nodes, samples_per_node=samples_per_node, masking=masking)
    if name == "double_mc":
        return cls(num_samples=num_nodes * samples_per_node, masking=masking, stratified=stratified)
    if name == "coupled":
        return cls(num_pairs=samples_per_node, masking=masking, t_min=t_min, t_max=t_max)
    if name == "stratified_coupled":
        return cls(num_pairs=samples_per_node)
    if name == "one_step":
        return cls(p_mask_prompt=p_mask_prompt, num_samples=samples_per_node)
    if name == "trajectory":
        return cls(merge=merge, order=order, temperature=temperature, steps=steps)
    if name == "spg":
        return cls(num_samples=samples_per_node, block_length=block_length, p_mask_prompt=p_mask_prompt,
                   beta=eubo_beta, mix=mix_weight)
    return cls()
