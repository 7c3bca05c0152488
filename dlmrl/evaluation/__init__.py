"""Held-out evaluation (``dlmrl eval``, and the evaluations a training run makes): decoding, protocols, records.

- :mod:`dlmrl.evaluation.heldout`: decode the held-out split and score it with the task's metrics
  (``evaluate``, ``evaluate_ar``, ``evaluate_ranking``, ``evaluate_task_episodes``);
- :mod:`dlmrl.evaluation.configured`: ``evaluate_with_config``, with a config's settings and the policy kind's
  decoding;
- :mod:`dlmrl.evaluation.protocol`: how held-out completions are scored (``eval.protocol``);
- :mod:`dlmrl.evaluation.presets`: the papers' sampling protocols as presets (``eval.preset``);
- :mod:`dlmrl.evaluation.record`: the record written beside every held-out result.

Nothing is imported here: import the module you need (none of them imports :mod:`dlmrl.config`; the policy kinds
import ``heldout`` and ``presets``, and ``configured`` imports the kinds).
"""
