"""The generation config of the Dream stand-in: ``validate`` with ``transformers`` 4's signature, as Dream's
``DreamGenerationConfig.validate(self, is_init=False)`` in its ``generation_utils.py``."""

from transformers import GenerationConfig


class DreamGenerationConfig(GenerationConfig):
    def __init__(self, **kwargs):
        self.steps = kwargs.pop("steps", 512)
        super().__init__(**kwargs)

    def validate(self, is_init=False):
        pass
