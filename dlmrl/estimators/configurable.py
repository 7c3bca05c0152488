"""How an estimator class is built from the config's ``estimator`` section and how it describes itself.

Every estimator is a frozen dataclass whose fields are its settings; :meth:`ConfigurableEstimator.from_config`
builds it as ``cls(**options)`` from

1. the flat ``estimator.*`` keys it reads (:meth:`~ConfigurableEstimator.reads`; by default the keys named like
   one of its fields, so ``estimator.masking`` sets ``SDMC.masking``), mapped by
   :meth:`~ConfigurableEstimator.flat_options` where a class's field differs (double MC's ``num_samples`` is
   ``num_nodes · samples_per_node``, SPG's ``beta`` is ``eubo_beta``, the trajectory's ``temperature`` comes from
   the sampler);
2. over them, ``estimator.options``: any of the class's own fields by its own name.

A setting the class rejects raises :class:`~dlmrl.errors.ConfigError` naming the config key that set it, found
from the field the check names (:class:`~dlmrl.estimators.validation.OptionError`), not from the message.
:meth:`~ConfigurableEstimator.describe` gives the name, the settings and the NFE (value and formula) that
``dlmrl train --dry-run`` and the variance lab print.

This module knows the config only as a mapping of flat settings and an object with the sampler's settings
(:class:`SamplerSettings`), so that :mod:`dlmrl.config` can import the estimators and not the other way round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from dlmrl.errors import ConfigError
from dlmrl.estimators.validation import OptionError


class SamplerSettings(Protocol):
    """The rollout sampler's settings an estimator may read (the config's ``sampling`` section has them)."""

    temperature: float  # (0 = greedy)
    block_length: int

    @property
    def max_steps(self) -> int:
        """The most denoising steps a rollout takes."""
        ...


@dataclass(frozen=True)
class EstimatorDescription:
    """What an estimator is, for ``--dry-run`` and the lab.

    Attributes:
        name: the registry name.
        settings: the dataclass fields and their values (the keys ``estimator.options`` takes).
        nfe: forward passes per sequence; for a canvas-dependent NFE the bound at the length asked for
            (``None`` when no length was given).
        nfe_formula: how the NFE follows from the settings, e.g. ``"N·K (num_nodes · samples_per_node)"``.
        nfe_is_bound: ``nfe`` is the most a sequence takes (it depends on the canvas or the rollout).
        trainable: whether training may use it (``exact`` is for analysis).
        notes: what the estimator scores, in words, where the settings do not say it.
    """

    name: str
    settings: dict[str, Any]
    nfe: int | None
    nfe_formula: str
    nfe_is_bound: bool = False
    trainable: bool = True
    notes: dict[str, str] = field(default_factory=dict)


class ConfigurableEstimator:
    """The construction and self-description every estimator class shares (a base of
    :class:`~dlmrl.estimators.scoring.PlanEstimator`; subclasses are frozen dataclasses).

    Class attributes a subclass may set:

    - ``name``: its registry name;
    - ``trainable``: ``False`` for an estimator the trainer refuses (``estimator.name`` names it);
    - ``nfe_formula``: the NFE in terms of its settings;
    - ``FLAT_KEYS``: the flat ``estimator.*`` keys it reads, where they are not the same-named fields (then it also
      overrides :meth:`flat_options`);
    - ``KEY_OF``: field -> the config key that sets it, where that is not ``estimator.<field>`` (the error names it).
    """

    name: ClassVar[str] = ""
    trainable: ClassVar[bool] = True
    nfe_formula: ClassVar[str] = ""
    FLAT_KEYS: ClassVar[frozenset[str] | None] = None
    KEY_OF: ClassVar[Mapping[str, str]] = {}

    # ------------------------------------------------------------------ construction

    @classmethod
    def setting_names(cls) -> tuple[str, ...]:
        """The dataclass fields a caller sets (``init`` fields), in order."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.init) if dataclasses.is_dataclass(cls) else ()

    @classmethod
    def reads(cls, flat_keys: Iterable[str]) -> frozenset[str]:
        """The keys of ``flat_keys`` (the section's flat ``estimator.*`` keys) this class reads: ``FLAT_KEYS``, else
        those named like one of its fields. The others are ignored (validation warns when one is set)."""
        keys = frozenset(flat_keys)
        return keys & (cls.FLAT_KEYS if cls.FLAT_KEYS is not None else frozenset(cls.setting_names()))

    @classmethod
    def flat_options(cls, flat: Mapping[str, Any], sampling: SamplerSettings | None) -> dict[str, Any]:
        """The keyword arguments the flat settings give: each read key onto the same-named field.

        Args:
            flat: flat key -> value (the ``estimator`` section but its ``name``, ``options`` and ``micro_batch``);
                a key it lacks leaves the field at the class default.
            sampling: the sampler's settings (``None``: the class defaults), for estimators that read them.
        """
        return {k: flat[k] for k in cls.reads(flat)}

    @classmethod
    def config_key(cls, name: str, flat: Mapping[str, Any], options: Mapping[str, Any]) -> str:
        """The config key that set field ``name``: ``estimator.options.<name>`` when the options gave it, else
        ``KEY_OF[name]`` or ``estimator.<name>`` for a flat key the class reads, else ``estimator.options.<name>``
        (the field was left at its default: that is where to set it)."""
        if name in options:
            return f"estimator.options.{name}"
        if name in cls.KEY_OF:
            return cls.KEY_OF[name]
        return f"estimator.{name}" if name in cls.reads(flat) else f"estimator.options.{name}"

    @classmethod
    def from_config(cls, flat: Mapping[str, Any], sampling: SamplerSettings | None = None,
                    options: Mapping[str, Any] | None = None):
        """``cls(**{**flat_options(flat, sampling), **options})``.

        Args:
            flat: the flat settings (:meth:`flat_options`).
            sampling: the sampler's settings.
            options: the class's own fields by name (``estimator.options``, already checked against the dataclass
                by :func:`dlmrl.config.overrides.part_options`); they win over the flat keys.
        Raises:
            ConfigError: a setting the class rejects, naming the config key that set it (:meth:`config_key`) and
                the estimator; a check that names no field (a plain ``ValueError``) is reported on
                ``estimator.options`` (when given) or ``estimator.name``.
        """
        options = dict(options or {})
        try:
            return cls(**{**cls.flat_options(flat, sampling), **options})
        except (ValueError, TypeError) as err:
            if isinstance(err, OptionError):
                key = cls.config_key(err.field, flat, options)
            else:
                key = "estimator.options" if options else "estimator.name"
            raise ConfigError(f"config key {key!r}: {err} (estimator {cls.name!r})") from None

    # ------------------------------------------------------------------ description

    def settings(self) -> dict[str, Any]:
        """The estimator's settings: its ``init`` fields and their values."""
        return {k: getattr(self, k) for k in self.setting_names()}

    def notes(self) -> dict[str, str]:
        """What the estimator scores, in words, where its settings do not say it (none by default)."""
        return {}

    def describe(self, length: int | None = None) -> EstimatorDescription:
        """The name, settings and NFE; ``length``: the canvas length, for an NFE that depends on it."""
        nfe = self.nfe
        bound = nfe is None
        if nfe is None and length is not None:
            nfe = self.nfe_for(length)
        return EstimatorDescription(self.name, self.settings(), nfe, self.nfe_formula, bound, self.trainable,
                                    self.notes())
