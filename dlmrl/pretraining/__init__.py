"""SFT of the shipped tiny models (``dlmrl pretrain``): the bases that RL starts from.

- :mod:`dlmrl.pretraining.loop`: the shared SFT loop and run folder, and masked-diffusion SFT on Sudoku
  (``pretrain``);
- :mod:`dlmrl.pretraining.ar`: next-token SFT of the autoregressive baseline;
- :mod:`dlmrl.pretraining.block`: block-diffusion SFT of the block model;
- :mod:`dlmrl.pretraining.uniform`: uniform-noise SFT of the tiny DiffusionGemma (NeMo AutoModel's recipe);
- :mod:`dlmrl.pretraining.multihop`: SFT on the scripted agent's tool-use traces (``task=multihop``);
- :mod:`dlmrl.pretraining.recommend`: SFT on next-item recommendation (``task=recommend``).

Nothing is imported here: import the module you need.
"""
