"""PNG of calibrated abstention: the share of queries answered against the guaranteed error level α
(`pipelines.abstention.coverage_curves`), one line per score, one panel per direction."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .plots import BASELINE_SCORES, _pyplot, _save

__all__ = ["coverage_vs_alpha"]


def coverage_vs_alpha(data: Mapping, path, *, title: str, delta: float):
    """data: {"method": {direction: {score: {"alpha", "coverage"}}}, "primary": the method's main
    score, optionally "infonce": the same for the InfoNCE baseline (its softmax confidence drawn
    in grey)}. Free baselines of the ranking are dashed; the method's primary score is thick."""
    plt = _pyplot()
    directions = list(data["method"])
    fig, axes = plt.subplots(1, len(directions), figsize=(5.6 * len(directions), 4.2), squeeze=False)
    for ax, direction in zip(axes[0], directions):
        for colour, (name, c) in enumerate(data["method"][direction].items()):
            style = dict(linestyle="--", linewidth=1.2) if name in BASELINE_SCORES else dict(linestyle="-")
            if name == data.get("primary"):
                style["linewidth"] = 2.2
            ax.plot(np.asarray(c["alpha"]), np.asarray(c["coverage"]), marker="o", markersize=3,
                    color=f"C{colour}", label=name, **style)
        other = data.get("infonce", {}).get(direction, {}).get("neg_top_probability")
        if other is not None:
            ax.plot(np.asarray(other["alpha"]), np.asarray(other["coverage"]), color="0.5", linestyle="-.",
                    marker="o", markersize=3, label="InfoNCE baseline (softmax confidence)")
        ax.set_xlabel("guaranteed error level α among answered queries")
        ax.set_ylabel(f"share of held-out queries answered (δ = {delta})")
        ax.set_title(direction)
        ax.set_xlim(left=0.0)
        ax.set_ylim(0.0, 1.0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, path)
