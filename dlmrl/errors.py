"""The errors a bad config key or value raises, in a module of their own.

:mod:`dlmrl.config` validates a config against the components' registries (families, estimators,
presets, LoRA's target-module syntax), so it imports the components; a component that reports a bad
config key itself (``dlmrl.models.lora.prepare_for_training``) imports the error from here instead of
from :mod:`dlmrl.config`, and the dependency points one way. ``dlmrl.config.ConfigError`` is this class.
"""


class ConfigError(ValueError):
    """A config key or value is invalid; the message names the key (and file/line when known)."""


class OptionError(ValueError):
    """A component's setting out of range (an estimator's, an objective part's, a preset's); ``field`` names the
    setting it concerns (a dataclass field, or a dotted path such as ``part_options.clip_rule.scale``), so that
    the config can name the key that set it without reading the message."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
