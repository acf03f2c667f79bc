"""The Pareto front of a search (time vs peak memory), or its top plans."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from serve.search.report import plan_label  # noqa: E402


def plot_search(response, path: str | Path) -> Path:
    points = response.pareto or response.best
    fig, ax = plt.subplots(figsize=(7, 4.5))
    t = [r.prediction.iter_time_s * 1e3 for r in points]
    m = [r.prediction.peak_mem_bytes / 2**30 for r in points]
    lo = [r.prediction.iter_time_s * 1e3 - r.prediction.iter_time_interval_s[0] * 1e3 for r in points]
    hi = [r.prediction.iter_time_interval_s[1] * 1e3 - r.prediction.iter_time_s * 1e3 for r in points]
    ax.errorbar(t, m, xerr=[lo, hi], fmt="o-" if response.pareto else "o", capsize=3)
    for r, x, y in zip(points[:8], t, m):
        ax.annotate(
            plan_label(r.plan, r.micro_batch_size, r.float8),
            (x, y),
            fontsize=6,
            xytext=(4, 4),
            textcoords="offset points",
        )
    ax.set(
        xlabel="predicted iteration time (ms), 80% interval",
        ylabel="predicted peak memory per device (GiB)",
        title=("Pareto front" if response.pareto else "top plans") + f", {response.trials} trials",
    )
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
