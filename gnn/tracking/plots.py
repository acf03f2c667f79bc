"""Predicted-vs-measured scatter plots, the picture people look at before the table."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

TARGETS = (
    ("iter_time_s", "pred_time_s", "iteration time (s)"),
    ("peak_mem_bytes", "pred_mem_bytes", "peak memory (B)"),
)


def scatter(rows: pd.DataFrame, pred: pd.DataFrame, title: str, path: str | Path) -> Path:
    """Log-log predicted vs measured, one panel per target, with the +-10% band."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, (true_col, pred_col, label) in zip(axes, TARGETS):
        true, est = rows[true_col].to_numpy(dtype=float), pred[pred_col].to_numpy(dtype=float)
        ok = np.isfinite(true) & np.isfinite(est) & (true > 0)
        if not ok.any():
            ax.set_visible(False)
            continue
        oom = (rows["status"] == "oom").to_numpy()[ok]
        ax.scatter(true[ok][~oom], est[ok][~oom], s=6, alpha=0.5, label="ok")
        ax.scatter(true[ok][oom], est[ok][oom], s=6, alpha=0.5, c="tab:red", label="oom")
        lo, hi = min(true[ok].min(), est[ok].min()), max(true[ok].max(), est[ok].max())
        line = np.array([lo, hi])
        ax.plot(line, line, "k-", lw=0.8)
        ax.fill_between(line, line * 0.9, line * 1.1, color="grey", alpha=0.2, label="+-10%")
        ape = np.abs(est[ok] / true[ok] - 1)
        ax.set(
            xscale="log",
            yscale="log",
            xlabel=f"measured {label}",
            ylabel=f"predicted {label}",
            title=f"MAPE {ape.mean():.1%}, median {np.median(ape):.1%}, n={ok.sum()}",
        )
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
