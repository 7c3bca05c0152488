"""Keys dlmrl writes into a saved model's ``config.json`` (read back by the loaders and the config check)."""

from __future__ import annotations

#: the ``config.json`` key in which dlmrl records the policy kind a checkpoint was trained as (``model.kind``): every
#: saved ``final_model/``, ``Trainer.save`` folder and pretrained model carries it, so a folder moved out of its run
#: still loads as the kind it was trained as (:func:`dlmrl.models.loading.checkpoint_kind`)
KIND_KEY = "dlmrl_kind"
