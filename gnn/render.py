"""Draw a plan's execution graph as a simulated timeline (one row per rank and stream).

python -m gnn.render --out docs/img/timeline.png     (a small 2-stage 1F1B plan with TP and DP)
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from collect.schema import RunSpec  # noqa: E402
from gnn import cancel  # noqa: E402
from gnn.costs.hardware import hardware_model  # noqa: E402
from gnn.graph.build import ExecGraph, build_graph  # noqa: E402
from gnn.graph.table import KINDS, PHASES, STREAMS  # noqa: E402
from gnn.sim.simulate import NUM_STREAMS, SimResult, simulate  # noqa: E402

COLORS = dict(zip(KINDS, plt.get_cmap("tab20").colors))


# micro-batch numbers are written on the bars only while there are few enough to read (each costs ~1 ms to draw)
MAX_LABELS = 500
MAX_RANKS = 16  # pipeline ranks drawn: past that a picture is too tall to read (and to draw in seconds)
# backward and recompute bars are hatched while there are at most this many bars, else drawn lighter: hatching 50,000
# bars took 5 of a timeline's 7 s
MAX_HATCHED = 4000


def draw_timeline(g: ExecGraph, title: str, path, sim: SimResult | None = None) -> None:
    """``path``: a file name or a binary file object (PNG). Bars of one row, kind and phase are drawn as one
    collection, read from the graph's columns, so a graph of hundreds of thousands of nodes draws in seconds; of a
    deeper pipeline, the first MAX_RANKS ranks. A stop (gnn.cancel) is honoured between collections."""
    sim = sim or simulate(g)
    ranks = min(g.num_ranks, MAX_RANKS)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 1.2 * ranks))
    try:  # a stopped drawing leaves no figure behind in pyplot's registry
        _draw(ax, g, sim, ranks)
        shown = f", ranks 0-{ranks - 1} of {g.num_ranks} drawn" if ranks < g.num_ranks else ""
        size = f"{g.num_nodes} nodes, {g.edge_index.shape[1]} edges{shown}"
        ax.set_title(f"{title}: {size}, simulated {sim.iter_time_s * 1e3:.1f} ms")
        cancel.check("drawing a timeline")
        fig.tight_layout()
        fig.savefig(path, dpi=120, format="png")
    finally:
        plt.close(fig)


def _draw(ax, g: ExecGraph, sim: SimResult, ranks: int) -> None:
    rank, kind, phase = (g.column(c).astype(int) for c in ("rank", "kind", "phase"))
    stream = np.array([STREAMS.get(k, 0) for k in KINDS])[kind]
    drawn = np.flatnonzero((rank < ranks) & (sim.end > sim.start))
    row = NUM_STREAMS * rank + stream
    hatched = np.isin(phase, [PHASES.index("backward"), PHASES.index("recompute")])
    bars: dict[tuple, list] = defaultdict(list)
    for i, start, width in zip(drawn.tolist(), sim.start[drawn] * 1e3, (sim.end - sim.start)[drawn] * 1e3):
        bars[(row[i], kind[i], hatched[i])].append((start, width))
    hatching = len(drawn) <= MAX_HATCHED
    for (y, k, backward), spans in bars.items():
        cancel.check("drawing a timeline")
        ax.broken_barh(
            spans, (y - 0.4, 0.8), facecolors=COLORS[KINDS[k]], hatch="//" if backward and hatching else None,
            edgecolor="black", linewidth=0.3, alpha=0.55 if backward and not hatching else 1.0,
        )  # fmt: skip
    if len(drawn) <= MAX_LABELS:
        microbatch = g.column("microbatch").astype(int)
        labelled = [KINDS.index("attn"), KINDS.index("mlp")]
        for i in drawn[(microbatch[drawn] >= 0) & (stream[drawn] == 0) & np.isin(kind[drawn], labelled)]:
            middle = (sim.start[i] + sim.end[i]) / 2 * 1e3
            ax.text(middle, row[i], str(microbatch[i]), ha="center", va="center", fontsize=7)
    streams = ("compute", "collectives", "send/recv")
    ax.set_yticks(range(NUM_STREAMS * ranks), [f"rank {r} {s}" for r in range(ranks) for s in streams])
    ax.invert_yaxis()
    backward = "hatched" if hatching else "lighter"
    ax.set_xlabel(f"simulated time (ms); {backward} = backward / recompute; numbers = micro-batch")
    used = [KINDS[k] for k in sorted(set(kind[drawn].tolist()))]
    ax.legend(
        [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in used], used, loc="upper left",
        bbox_to_anchor=(1.01, 1.0), fontsize=8,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/img/timeline.png")
    parser.add_argument("--hardware", default="a100-80gb")
    args = parser.parse_args()
    spec = RunSpec.model_validate(
        {
            "workload": dict(
                layers=8,
                hidden=2048,
                heads=16,
                seq_len=1024,
                vocab=51200,
                micro_batch_size=2,
                global_batch_size=16,
                dtype="bfloat16",
            ),
            "plan": dict(pp=2, dp=2, tp=2, pp_schedule="1f1b", num_microbatches=4, sharding="fsdp_grad_op"),
            "cluster": dict(devices_per_node=8, device="cuda", backend="nccl", memory_bytes=80 * 2**30),
        }
    )
    g = build_graph(spec.workload, spec.plan, spec.cluster, hardware_model(args.hardware))
    draw_timeline(g, "pp2 x dp2 x tp2 FSDP, 1F1B, 4 micro-batches, A100 preset", args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
