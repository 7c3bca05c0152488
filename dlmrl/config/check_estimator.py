"""The config check of the ``estimator`` section beyond its registry entry: keys a kind without an estimator refuses,
keys the chosen estimator ignores, the scoring chunks, and the rollout correction's estimator."""

from __future__ import annotations

import dataclasses
import math

from dlmrl.config.resolve import _default_recipe, flat_settings
from dlmrl.config.schema import Config, EstimatorConfig
from dlmrl.errors import ConfigError
from dlmrl.kinds import check_key as _check
from dlmrl.kinds import find_kind, kind_of


def is_number(value) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_rollout_is_cap(cfg: Config, estimator) -> None:
    """``train.rollout_is_cap``: ``>= 1``, and only where the old-policy scores are the sampler's own distribution."""
    cap = cfg.train.rollout_is_cap
    if cap is None:
        return
    _check(is_number(cap) and cap >= 1, "train.rollout_is_cap",
           f"must be >= 1 (a cap below 1 would scale down tokens the rollout drew exactly as the policy would) or "
           f"null, got {cap!r}")
    kind = kind_of(cfg.model.kind)
    if not kind.scores_with_estimators:  # (the kind says whether its rollouts' log-probs are its scorer's)
        problem = kind.rollout_is_cap_problem(cfg)
        _check(problem is None, "train.rollout_is_cap", problem or "")
        return
    from dlmrl.estimators import Trajectory

    settings = estimator.describe().settings
    exact = isinstance(estimator, Trajectory) and estimator.merge == 1 and estimator.order == "sampled"
    _check(exact, "train.rollout_is_cap",
           f"needs estimator.name trajectory with estimator.merge 1 and estimator.order sampled, the exact "
           f"likelihood of the sampler's own steps (got {estimator.name!r}, merge {settings.get('merge')}, order "
           f"{settings.get('order')!r}): other estimators' per-token scores are not log-probs of the distribution "
           "the rollout drew from")


#: ``estimator`` keys that tune how any kind scores (chunks of rows or canvases, of positions), AR included
SCORING_KEYS = ("micro_batch", "logits_chunk")


def check_logits_chunk(e: EstimatorConfig) -> None:
    _check(isinstance(e.logits_chunk, int) and not isinstance(e.logits_chunk, bool) and e.logits_chunk >= 0,
           "estimator.logits_chunk", f"must be an integer >= 0 (scored positions per output-head call; 0 = full "
           f"logits), got {e.logits_chunk!r}")


def check_self_conditioning(cfg: Config, kind) -> None:
    """``estimator.self_conditioning``: ``detached`` or ``through``; ``through`` only where the kind's default
    likelihood replays self-conditioned steps (:attr:`~dlmrl.kinds.base.PolicyKind.self_conditioned`) and that
    likelihood runs, with ``estimator.micro_batch`` 0 or at least ``sampling.steps`` (its gradient chains a
    canvas's steps, so they cannot be cut into separate passes).

    Raises:
        ConfigError: naming the key.
    """
    e = cfg.estimator
    _check(e.self_conditioning in ("detached", "through"), "estimator.self_conditioning",
           f"must be 'detached' or 'through', got {e.self_conditioning!r}")
    if e.self_conditioning == "detached":
        return
    default = kind.estimator_names[0] if kind.estimator_names else None
    _check(kind.self_conditioned and (e.name or default) == default, "estimator.self_conditioning",
           f"'through' differentiates the self-conditioning inputs of model.kind uniform's trajectory likelihood; "
           f"model.kind {kind.name!r} with estimator {e.name or default!r} has none (use 'detached')")
    steps = cfg.sampling.steps
    if not (isinstance(e.micro_batch, int) and not isinstance(e.micro_batch, bool) and e.micro_batch >= 0):
        return  # (refuse_estimator_keys names a micro_batch that is not a count)
    _check(not e.micro_batch or e.micro_batch >= steps, "estimator.micro_batch",
           f"{e.micro_batch} step canvases per pass cut a canvas's {steps} steps, whose gradient estimator."
           f"self_conditioning 'through' chains from step to step; use 0 or >= {steps}, or self_conditioning "
           "'detached'")


def check_own_estimator(cfg: Config, kind) -> None:
    """``estimator.name`` on a kind that resolves its own (:attr:`~dlmrl.kinds.base.PolicyKind.estimator_names`):
    one of its names (null: the first, its default likelihood). The default takes no estimator settings (as
    :func:`refuse_estimator_keys`, ``estimator.name`` itself allowed); another name's ``estimator.options`` are
    checked against its class and the estimator is built (a value it rejects names the key).

    Raises:
        ConfigError: naming the key.
    """
    from dlmrl.config.overrides import part_options

    e, names = cfg.estimator, kind.estimator_names
    _check(e.name is None or e.name in names, "estimator.name",
           f"model.kind {kind.name!r} scores with {' | '.join(names)} (null: {names[0]}), got {e.name!r}")
    name = e.name or names[0]
    if name == names[0]:
        refuse_estimator_keys(cfg, skip=("name", "self_conditioning"))
        return
    part_options(kind.estimator_class(name), e.options, "estimator.options")
    kind.own_estimator(cfg)


def refuse_estimator_keys(cfg: Config, skip: tuple[str, ...] = ()) -> None:
    """A kind that runs no likelihood estimator (an AR policy scores its completions by their exact token
    log-probs): no estimator runs, so an ``estimator.*``
    key other than :data:`SCORING_KEYS` (checked here: the AR scorer reads them) that the user set
    (:func:`~dlmrl.config.overrides.user_keys`: an override, their YAML file, the API's dict; at a default's value
    too), or that is set away from its default (or the default recipe's value), would be ignored silently; refused,
    naming it. The default recipe's own estimator section and a run's saved config are not the user's. ``skip``:
    fields the caller checks itself."""
    from dlmrl.config.overrides import user_keys

    e = cfg.estimator
    defaults = (EstimatorConfig(), _default_recipe().estimator)
    chosen = user_keys(cfg) or frozenset()
    _check(isinstance(e.micro_batch, int) and not isinstance(e.micro_batch, bool) and e.micro_batch >= 0,
           "estimator.micro_batch", f"must be an integer >= 0 (canvases, or rows for model.kind ar, per forward call; "
                                    f"0 = all), got {e.micro_batch!r}")
    check_logits_chunk(e)
    for f in dataclasses.fields(e):
        if f.name in SCORING_KEYS or f.name in skip:  # (AR scoring reads these; skip: what the caller checked)
            continue
        value = getattr(e, f.name)
        key = f"estimator.{f.name}"
        if any(k == key or k.startswith(key + ".") for k in chosen) or all(value != getattr(d, f.name)
                                                                           for d in defaults):
            kind = find_kind(cfg.model.kind)
            scores_by = getattr(kind, "scores_by", "exact token log-probs")
            raise ConfigError(f"config key 'estimator.{f.name}': model.kind {cfg.model.kind!r} scores {scores_by} (no "
                              f"likelihood estimator runs, so estimator settings do not apply); remove "
                              f"estimator.{f.name} (got {value!r}), or train a diffusion policy (model.kind diffusion)")


def warn_estimator_fields(cfg: Config, name: str, estimator, e: EstimatorConfig) -> None:
    """Warn about flat ``estimator`` fields set away from their defaults that the estimator's class does not read
    (:meth:`~dlmrl.estimators.configurable.ConfigurableEstimator.reads`; they would be ignored silently), and about
    training with an estimator of infinite variance. A value of the dataclass defaults or of the default recipe
    counts as unset, so ``dlmrl train estimator.name=sdmc`` does not blame the user for the recipe's own
    ``merge: 2``."""
    import warnings

    from dlmrl.estimators import Coupled, DoubleMC

    flat = flat_settings(e)
    reads = type(estimator).reads(flat)
    defaults = [flat_settings(d) for d in (EstimatorConfig(), _default_recipe().estimator)]
    ignored = [k for k, v in flat.items() if k not in reads and all(v != d[k] for d in defaults)]
    if ignored:
        warnings.warn(f"config keys {', '.join(f'estimator.{k}' for k in ignored)} do not apply to the {name!r} "
                      f"estimator (it reads {', '.join(sorted(reads)) or 'none of them'}; its own settings go in "
                      "estimator.options) and are ignored", UserWarning, stacklevel=3)
    bernoulli_dmc = isinstance(estimator, DoubleMC) and estimator.masking == "bernoulli"
    bernoulli_coupled = (isinstance(estimator, Coupled) and estimator.masking == "bernoulli"
                         and (estimator.t_min == 0 or estimator.t_max == 1))
    if bernoulli_dmc or bernoulli_coupled:
        warnings.warn(f"estimator {name!r} with bernoulli masking{'' if bernoulli_dmc else ' and t reaching 0 or 1'} "
                      "has infinite variance (a lone masked token weighs 1/t as t -> 0): its gradients are heavy-"
                      "tailed; exact_count masking (or sdmc) is unbiased with finite variance", UserWarning,
                      stacklevel=3)
