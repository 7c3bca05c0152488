"""dlmrl: reinforcement learning for diffusion language models.

``from dlmrl import Trainer`` is the Python API (:class:`dlmrl.api.Trainer`, TRL's ``GRPOTrainer`` shape); it is
imported on first use, so ``import dlmrl`` (and the ``dlmrl`` command) stays light.
"""

__version__ = "0.1.0"
__all__ = ["Callback", "Trainer", "__version__"]


def __getattr__(name: str):
    if name == "Trainer":
        from dlmrl.api import Trainer

        return Trainer
    if name == "Callback":
        from dlmrl.training.callbacks import Callback

        return Callback
    raise AttributeError(f"module 'dlmrl' has no attribute {name!r}")
