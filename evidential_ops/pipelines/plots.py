"""PNG figures of the CLI runs (matplotlib, headless "Agg" backend).

- `training_curve`: the loss (and UML's split accuracy) per epoch, and for TCL / TcVSE its parts
  and the annealed KL weight λ;
- `uncertainty_histograms`: overlaid normalised histograms of uncertainty groups (clean vs
  corrupted queries: TCL Fig. 5; clean vs noisy pairs: UML Fig. 5; in- vs out-of-distribution:
  FUME Fig. 4);
- `deletion_curves`: mAP@all against the deletion rate (FUME Fig. 3);
- `risk_coverage`: the risk (share of wrong top-1 results) of the most certain queries against
  their share, for every uncertainty score, its free baselines, the oracle and the InfoNCE
  baseline (SPEC §6).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

__all__ = ["deletion_curves", "risk_coverage", "training_curve", "uncertainty_histograms"]

BASELINE_SCORES = ("neg_top1_similarity", "neg_margin")


def _pyplot():
    # Import lazily and force Agg: the CLI runs on headless machines and in CI, where an
    # interactive backend would fail or pop windows; importing matplotlib costs ~0.5 s.
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path) -> Path:
    path = Path(os.fspath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    fig.clf()
    _pyplot().close(fig)
    return path


def uncertainty_histograms(panels: Mapping[str, Mapping[str, np.ndarray]], path, *, title: str,
                           xlabel: str = "uncertainty") -> Path:
    """One panel per entry of `panels` ({panel title: {group label: 1-D values}}), each with the
    groups' density histograms over shared bins and their medians as dashed lines."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, (panel, groups) in zip(axes[0], panels.items()):
        values = [np.asarray(v, dtype=np.float64).ravel() for v in groups.values() if np.size(v)]
        lo = min(float(v.min()) for v in values) if values else 0.0
        hi = max(float(v.max()) for v in values) if values else 1.0
        bins = np.linspace(lo, hi if hi > lo else lo + 1e-6, 41)
        for k, (label, v) in enumerate(groups.items()):
            v = np.asarray(v, dtype=np.float64).ravel()
            if v.size == 0:
                continue
            color = f"C{k}"
            ax.hist(v, bins=bins, density=True, alpha=0.45, color=color, label=f"{label} (n={v.size})")
            ax.axvline(float(np.median(v)), color=color, linestyle="--", linewidth=1.2)
        ax.set_title(panel)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("density")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return _save(fig, path)


def deletion_curves(curves: Mapping[str, Mapping[str, np.ndarray]], path, *, title: str) -> Path:
    """mAP@all against the achieved deletion rate, one line per curve ({label: {"deletion_rate",
    "map"}})."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    for label, c in curves.items():
        ax.plot(np.asarray(c["deletion_rate"]), np.asarray(c["map"]), marker="o", label=label)
    ax.set_xlabel("deletion rate")
    ax.set_ylabel("mAP@all")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def _series(history, key: str) -> list[float]:
    return [float(h.get(key, float("nan"))) for h in history]


def training_curve(history, path, *, title: str, extra: str | None = None) -> Path:
    """The training loss per epoch (1-based, as the progress lines count), and the series `extra`
    (e.g. "split_accuracy") on a second axis.

    When the records carry TCL's parts (loss_risk, loss_kl, kl_weight: `TCL.training_step`), the
    risk, λ·KL and the consistency loss are drawn beside the total and λ on the second axis: λ is
    annealed upward (TCL eq. 10), so the total can rise while training goes well, and the plot
    shows which part rises.
    """
    plt = _pyplot()
    parts = all(key in h for h in history for key in ("loss_risk", "loss_kl", "kl_weight"))
    fig, ax = plt.subplots(figsize=(5.2, 4.6 if parts else 3.8))
    epochs = [h["epoch"] + 1 for h in history]
    ax.plot(epochs, [h["loss"] for h in history], marker="o", color="C0", label="loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss")
    if parts:
        weights = _series(history, "kl_weight")
        ax.plot(epochs, _series(history, "loss_risk"), marker=".", color="C2", label="risk")
        ax.plot(epochs, [w * kl for w, kl in zip(weights, _series(history, "loss_kl"))], marker=".", color="C3",
                label="λ·KL")
        if any(np.isfinite(_series(history, "loss_c"))):
            ax.plot(epochs, _series(history, "loss_c"), marker=".", color="C4", label="consistency")
        ax2 = ax.twinx()
        ax2.plot(epochs, weights, linestyle="--", color="0.4", label="λ (KL weight, annealed up)")
        ax2.set_ylabel("λ")
        ax2.set_ylim(bottom=0.0)
        ax.set_xticks(epochs)
        # One legend under the axes: inside, it would cover the curves, which span the panel.
        handles, labels = (a + b for a, b in zip(ax.get_legend_handles_labels(), ax2.get_legend_handles_labels()))
        ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8)
    else:
        if extra is not None and all(extra in h for h in history):
            ax2 = ax.twinx()
            ax2.plot(epochs, [h[extra] for h in history], marker="s", color="C1", label=extra)
            ax2.set_ylabel(extra)
            ax2.legend(loc="upper right")
        ax.legend(loc="upper left")
    ax.set_title(title)
    return _save(fig, path)


def risk_coverage(data: Mapping, path, *, title: str) -> Path:
    """One panel per query direction of risk–coverage curves (SPEC §6).

    data: {"method": {direction: {score: {"coverage", "risk"}, "oracle": {...}}}, "primary": the
    method's main score, optionally "infonce": the same curves of the InfoNCE baseline, whose
    own confidence ("neg_top_probability") is drawn in grey}. Baseline scores are dashed, the
    oracle (every right answer first) dotted.
    """
    plt = _pyplot()
    directions = list(data["method"])
    fig, axes = plt.subplots(1, len(directions), figsize=(5.6 * len(directions), 4.2), squeeze=False)
    for ax, direction in zip(axes[0], directions):
        curves = data["method"][direction]
        colour = 0
        for name, c in curves.items():
            if name == "oracle":
                continue
            style = dict(linestyle="--", linewidth=1.2) if name in BASELINE_SCORES else dict(linestyle="-")
            if name == data.get("primary"):
                style["linewidth"] = 2.2
            ax.plot(np.asarray(c["coverage"]), np.asarray(c["risk"]), color=f"C{colour}", label=name, **style)
            colour += 1
        oracle = curves["oracle"]
        ax.plot(np.asarray(oracle["coverage"]), np.asarray(oracle["risk"]), color="black", linestyle=":",
                label="oracle")
        other = data.get("infonce", {}).get(direction, {}).get("neg_top_probability")
        if other is not None:
            ax.plot(np.asarray(other["coverage"]), np.asarray(other["risk"]), color="0.5", linestyle="-.",
                    label="InfoNCE baseline (softmax confidence)")
        ax.set_xlabel("coverage (share of queries answered, most certain first)")
        ax.set_ylabel("risk (share of wrong top-1)")
        ax.set_title(direction)
        ax.set_xlim(0.0, 1.0)
        ax.set_ylim(bottom=0.0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, path)
