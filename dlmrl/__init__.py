"""dlmrl: reinforcement learning for diffusion language models."""

__version__ = "0.1.0"
