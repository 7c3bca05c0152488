"""Reading the variance lab's records: exact-or-sampled values, infinite variances, the summary table, plots.

Records are the dicts :func:`dlmrl.estimators.analysis.run_lab` returns (or their JSON form from
``estimators.json``, where ``inf`` and ``nan`` are ``None``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _num(x) -> float:
    return float("nan") if x is None else float(x)


INFINITE_WITH_VARIANCE = ("variance", "variance_mask", "mse", "grad_variance", "diff_variance",
                          "diff_variance_independent")


def has_infinite_variance(rec: dict) -> bool:
    """Whether a record's estimator has infinite variance at every length: a ``1/t`` weight on a
    Bernoulli(t) mask with ``t`` reaching 0 (Bernoulli double MC; Bernoulli coupled with ``t_min = 0``
    or ``t_max = 1``). A flag stored in the record wins (e.g. set from an exact table)."""
    if rec.get("infinite_variance"):
        return True
    if rec.get("masking") != "bernoulli":
        return False
    if rec.get("estimator") == "double_mc":
        return True
    t_range = rec.get("t_range")
    return rec.get("estimator") == "coupled" and t_range is not None and (t_range[0] == 0 or t_range[1] == 1)


def value(rec: dict, key: str) -> float:
    """The exact figure ``key`` where it exists (may be ``inf``), else the sampled one (``sampled_<key>``).

    Works on records from :func:`run_lab` and on their JSON form, where ``inf`` and ``nan`` are
    ``None``: a record with ``infinite_variance`` true reads ``inf`` for the variance-like keys.
    """
    if has_infinite_variance(rec) and key in INFINITE_WITH_VARIANCE:
        return math.inf
    x = _num(rec.get(key))
    return x if not math.isnan(x) else _num(rec.get(f"sampled_{key}"))


def _cell(rec: dict | None, key: str) -> str:
    """``value`` as table text: ``~`` marks a sampled figure, ``inf`` an infinite exact one."""
    if rec is None:
        return "—"
    x = math.inf if has_infinite_variance(rec) and key in INFINITE_WITH_VARIANCE else _num(rec.get(key))
    if math.isinf(x):
        return "inf"
    if not math.isnan(x):
        return f"{x:.3g}"
    y = _num(rec.get(f"sampled_{key}"))
    return "—" if math.isnan(y) else f"~{y:.3g}"


def to_json_records(records: Sequence[dict]) -> list[dict]:
    """Records with ``inf``/``nan`` replaced by ``None`` (strict JSON)."""
    def clean(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v
    return [{k: clean(v) for k, v in r.items()} for r in records]


COMPARED = ("double_mc[bernoulli]", "double_mc[exact_count]", "double_mc[exact_count,strat]",
            "sdmc[exact_count]", "coupled_sdmc[exact_count]")


def record_label(rec: dict) -> str:
    """:func:`label` for a record (``dlmrl estimators`` output), e.g. ``coupled[bernoulli,t~U(0.2,0.8)]``."""
    parts = [rec["masking"]] if rec.get("masking") else []
    if rec.get("stratified"):
        parts.append("strat")
    if rec.get("t_range") is not None:
        parts.append("t~U({:g},{:g})".format(*rec["t_range"]))
    if rec.get("p_mask_prompt") is not None:
        parts.append(f"p={rec['p_mask_prompt']:g}")
    if rec.get("merge") is not None:
        parts.append(f"m={rec['merge']}")
    return f"{rec['estimator']}[{','.join(parts)}]" if parts else rec["estimator"]


def summary_table(records: Sequence[dict], budgets: Sequence[int] | None = None) -> str:
    """A Markdown table: MSE and gradient variance at the given NFE, with ratios to exact-count double MC.

    Columns per length ``L`` and NFE (default: 3 and 4 where present, else every budget): MSE of
    each compared estimator, SDMC / double-MC and coupled SDMC / double-MC ratios of MSE and of
    gradient variance, and the share of double MC's variance due to the time ``t``. Exact figures
    are plain (``inf`` where the variance is infinite); sampled ones, used where no exact figure
    exists (long canvases, against the reference), are marked ``~``.
    """
    by = {(r["length"], r["nfe"], record_label(r)): r for r in records}
    present = sorted({r["nfe"] for r in records})
    if budgets is None:
        budgets = [b for b in (3, 4) if b in present] or present
    lengths = sorted({r["length"] for r in records})
    head = ("| L | NFE | " + " | ".join(f"MSE {c}" for c in COMPARED)
            + " | MSE sdmc/dmc | MSE c-sdmc/dmc | grad var sdmc/dmc | grad var c-sdmc/dmc | dmc var from t |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for length in lengths:
        for nfe in budgets:
            dmc = by.get((length, nfe, "double_mc[exact_count]"))
            if dmc is None:
                continue
            cells = [_cell(by.get((length, nfe, c)), "mse") for c in COMPARED]
            ratios = []
            for key in ("mse", "grad_variance"):
                for c in ("sdmc[exact_count]", "coupled_sdmc[exact_count]"):
                    r = by.get((length, nfe, c))
                    den = value(dmc, key)
                    ratio = float("nan") if r is None or not den else value(r, key) / den
                    ratios.append("—" if math.isnan(ratio) else f"{ratio:.2f}")
            vt, vm = value(dmc, "variance_t"), value(dmc, "variance_mask")
            share = vt / (vt + vm) if vt + vm > 0 else float("nan")
            share_s = f"{share:.0%}" if math.isfinite(share) else "—"
            lines.append(f"| {length} | {nfe} | " + " | ".join(cells + ratios) + f" | {share_s} |")
    return "\n".join(lines)


def trajectory_table(records: Sequence[dict]) -> str:
    """A Markdown table of the trajectory records: per length and merge factor, the forward passes, the mean
    trajectory log-likelihood, the mean target (the exact ELBO, or the reference beyond the tables) and the
    gap per row (mean, min, max); empty when there are none."""
    rows = sorted((r for r in records if r.get("estimator") == "trajectory"), key=lambda r: (r["length"], r["merge"]))
    if not rows:
        return ""
    lines = ["| L | merge | NFE | log π(y given its order) | target | gap: mean (min … max) |", "|---|---|---|---|---|---|"]
    for r in rows:
        values, gaps = r["values"], r["gaps"]
        target = sum(v - g for v, g in zip(values, gaps)) / len(values)
        mark = "" if str(r.get("target", "")).startswith("exact") else "~"
        lines.append(f"| {r['length']} | {r['merge']} | {r['nfe']:g} | {sum(values) / len(values):.3g} | "
                     f"{mark}{target:.3g} | {sum(gaps) / len(gaps):+.3g} ({min(gaps):+.3g} … {max(gaps):+.3g}) |")
    return "\n".join(lines)


def plot_results(records: Sequence[dict], out_dir) -> list[str]:
    """``mse_vs_nfe.png``, ``grad_variance_vs_nfe.png`` and ``variance_split.png`` in ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    from pathlib import Path

    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lengths = sorted({r["length"] for r in records})
    labels = sorted({record_label(r) for r in records})
    paths = []
    for key, name, ylabel in (("mse", "mse_vs_nfe.png", "MSE vs ELBO (nats²)"),
                              ("grad_variance", "grad_variance_vs_nfe.png", "gradient variance")):
        fig, axes = plt.subplots(1, len(lengths), figsize=(4.2 * len(lengths), 4.6), squeeze=False)
        colors = dict(zip(labels, plt.cm.tab20.colors))
        for ax, length in zip(axes[0], lengths):
            for lab in labels:
                rows = [r for r in records if r["length"] == length and record_label(r) == lab]
                # an infinite exact variance is drawn from its (finite, unstable) sampled figure, dashed
                infinite = any(has_infinite_variance(r) for r in rows)
                pts = sorted((r["nfe"], _num(r.get(f"sampled_{key}")) if infinite else value(r, key)) for r in rows)
                pts = [(x, y) for x, y in pts if math.isfinite(y) and y > 0]
                if pts:
                    ax.plot(*zip(*pts), marker="o", color=colors[lab], linestyle="--" if infinite else "-",
                            label=f"{lab} (sampled; exact ∞)" if infinite else lab)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            nfes = sorted({r["nfe"] for r in records if r["length"] == length})
            ax.set_xticks(nfes, [str(n) for n in nfes])
            ax.set_title(f"L = {length}")
            ax.set_xlabel("NFE")
            ax.set_ylabel(ylabel)
        handles = {h.get_label(): h for ax in axes[0] for h in ax.get_lines()}
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=4, fontsize=7, frameon=False)
        fig.tight_layout(rect=(0, 0.16, 1, 1))
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        paths.append(str(out / name))
    fig, ax = plt.subplots(figsize=(5, 3.6))
    nfes = sorted({r["nfe"] for r in records})
    split_nfe = 3 if 3 in nfes else nfes[0]
    for lab in ("double_mc[exact_count]", "double_mc[exact_count,strat]"):
        pts = [(r["length"], value(r, "variance_t"), value(r, "variance_t") + value(r, "variance_mask"))
               for r in records if record_label(r) == lab and r["nfe"] == split_nfe]
        pts = [(n, vt / v) for n, vt, v in pts if v > 0 and math.isfinite(vt / v)]  # v = 0: deterministic
        if pts:
            ax.plot(*zip(*sorted(pts)), marker="o", label=lab)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("L (maskable tokens)")
    ax.set_ylabel(f"share of variance due to t (NFE {split_nfe})")
    if ax.get_lines():
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "variance_split.png", dpi=110)
    plt.close(fig)
    paths.append(str(out / "variance_split.png"))
    return paths
