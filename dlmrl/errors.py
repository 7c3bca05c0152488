"""The error a bad config key or value raises, in a module of its own.

:mod:`dlmrl.config` validates a config against the components' registries (families, estimators,
presets, LoRA's target-module syntax), so it imports the components; a component that reports a bad
config key itself (``dlmrl.models.lora.prepare_for_training``) imports the error from here instead of
from :mod:`dlmrl.config`, and the dependency points one way. ``dlmrl.config.ConfigError`` is this class.
"""


class ConfigError(ValueError):
    """A config key or value is invalid; the message names the key (and file/line when known)."""
