"""Where tools-in-the-rollout RL helps or hurts: greedy EM (tools inside the rollout) of the SFT base and of a model
trained by ``benchmarks/tools_multihop.py``'s ``grpo_loop_answer`` variant, on three question sets:

- ``seen``: training questions the run sampled (its ``train_batch`` of every step; at most 200);
- ``unseen_train``: training questions it never sampled (the train world, at most 200);
- ``test``: the 200 held-out questions (the test world: entities no training question names).

A gain on ``seen`` only is memorisation; on ``unseen_train`` but not ``test``, learning the train world's names.
Prints one JSON line (``benchmarks/results/tools_multihop_probes.json`` keeps one)::

    OMP_NUM_THREADS=1 python benchmarks/tools_multihop_worlds.py --steps 20 --seed 0 [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tools_multihop import ROOT, loop_eval, run_variant

from dlmrl.data.multihop_task import MultiHopTask
from dlmrl.models.ar import load_ar_policy


def greedy_em(policy, task, questions) -> float:
    """Mean EM of one greedy trajectory per question, the tools inside the rollout (``tools_multihop.loop_eval``)."""
    return loop_eval(policy, task, questions)["em"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts-per-step", type=int, default=8, help="the config's train.prompts_per_step")
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    args = ap.parse_args()
    base = str(ROOT / "dlmrl/assets/tiny_multihop_ar")
    policy = load_ar_policy(base)
    task = MultiHopTask(policy.tokenizer, None)
    sampled = {id(q): q for s in range(args.steps) for q in task.train_batch(args.prompts_per_step, args.seed, s)}
    sets = {"seen": list(sampled.values())[:200],
            "unseen_train": [q for q in task.train_examples if id(q) not in sampled][:200],
            "test": task.test_examples}
    out = {"base": {k: greedy_em(policy, task, qs) for k, qs in sets.items()}}
    with tempfile.TemporaryDirectory() as tmp:
        run_variant("grpo_loop_answer", args.seed, args.steps, base, Path(tmp) / "run", tuple(args.overrides))
        trained = load_ar_policy(str(Path(tmp) / "run" / "final_model"))
        out["trained"] = {k: greedy_em(trained, task, qs) for k, qs in sets.items()}
    out.update(overrides=args.overrides, steps=args.steps, seed=args.seed, sizes={k: len(v) for k, v in sets.items()})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
