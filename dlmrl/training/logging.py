"""Run files: ``metrics.jsonl`` (one JSON object per step) and the reward-curve PNG."""

from __future__ import annotations

import json
from pathlib import Path

from dlmrl.training.finite import json_ready


class MetricsWriter:
    """Appends one JSON line per logged step; on resume, drops lines past the resumed step."""

    def __init__(self, path: str | Path, resume_step: int | None = None):
        self.path = Path(path)
        if resume_step is not None and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        elif resume_step is None:
            self.path.write_text("")

    def write(self, record: dict) -> None:
        """Append ``record`` as one line; a non-finite number is written as ``null`` (valid JSON)."""
        with self.path.open("a") as f:
            f.write(json.dumps(json_ready(record), allow_nan=False) + "\n")


def read_metrics(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def eval_metric_name(rows: list[dict], summary: dict | None = None) -> str:
    """The held-out metric a run reports: the summary's ``primary_metric``, else the first ``eval_<name>`` key of
    the metrics rows, else ``cell_accuracy`` (runs written before tasks named their metric)."""
    for key in ("eval_before", "eval_after"):
        if summary and summary.get(key) and summary[key].get("primary_metric"):
            return summary[key]["primary_metric"]
    for row in rows:
        for key in row:
            if key.startswith("eval_") and row[key] is not None:
                return key[len("eval_"):]
    return "cell_accuracy"


def plot_curves(metrics_path: str | Path, png_path: str | Path, summary: dict | None = None) -> None:
    """Plot rollout reward (with a moving average) and held-out accuracy, and the gradient norm, against step.

    Draws on a bare ``matplotlib.figure.Figure`` (no pyplot): the process's backend is left as it is, so a notebook
    that trains keeps its inline plots.
    """
    from matplotlib.figure import Figure

    rows = read_metrics(metrics_path)
    if not rows:
        return
    steps = [r["step"] for r in rows]
    reward = [r["reward_mean"] for r in rows]
    window = max(1, len(reward) // 20)
    smooth = [sum(reward[max(0, i - window + 1): i + 1]) / len(reward[max(0, i - window + 1): i + 1])
              for i in range(len(reward))]
    fig = Figure(figsize=(10, 3.5))
    axes = fig.subplots(1, 2)
    axes[0].plot(steps, reward, alpha=0.35, label="rollout reward (mean)")
    axes[0].plot(steps, smooth, label=f"moving average ({window})")
    metric = eval_metric_name(rows, summary)
    label = metric.replace("_", " ")
    evals = [(r["step"], r[f"eval_{metric}"]) for r in rows if r.get(f"eval_{metric}") is not None]
    if evals:
        axes[0].plot(*zip(*evals), "o-", color="k", ms=3, label=f"held-out {label}")
    if summary:
        for key, style in (("eval_before", "--"), ("eval_after", "-")):
            if summary.get(key) and summary[key].get(metric) is not None:
                axes[0].axhline(summary[key][metric], ls=style, color="k", lw=0.8,
                                label=f"held-out {label} {key[5:]}")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("reward / accuracy")
    axes[0].legend(fontsize=7)
    # (with μ = 1 the clipped loss is identically 0 at r = 1, so the gradient norm is what moves)
    axes[1].plot(steps, [r.get("grad_norm") or 0.0 for r in rows])
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("gradient norm (before clipping)")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
