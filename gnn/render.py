"""Draw a plan's execution graph as a simulated timeline (one row per rank and stream).

python -m gnn.render --out docs/img/timeline.png     (a small 2-stage 1F1B plan with TP and DP)
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from collect.schema import RunSpec  # noqa: E402
from gnn.costs.hardware import hardware_model  # noqa: E402
from gnn.graph.build import ExecGraph, build_graph  # noqa: E402
from gnn.graph.table import KINDS  # noqa: E402
from gnn.sim.simulate import NUM_STREAMS, SimResult, simulate  # noqa: E402

COLORS = dict(zip(KINDS, plt.get_cmap("tab20").colors))


MAX_LABELS = 1500  # micro-batch numbers are written on the bars only while there are few enough to read


def draw_timeline(g: ExecGraph, title: str, path, sim: SimResult | None = None) -> None:
    """``path``: a file name or a binary file object (PNG). Bars of one row, kind and phase are drawn as one
    collection, so a graph of thousands of nodes draws in about a second."""
    sim = sim or simulate(g)
    nodes = g.nodes
    fig, ax = plt.subplots(figsize=(12, 1.2 + 1.2 * g.num_ranks))
    bars: dict[tuple, list] = defaultdict(list)
    for i, node in enumerate(nodes):
        width = sim.end[i] - sim.start[i]
        if width > 0:
            key = (NUM_STREAMS * node.rank + node.stream, node.kind, node.phase in ("backward", "recompute"))
            bars[key].append((sim.start[i] * 1e3, width * 1e3))
    for (row, kind, hatched), spans in bars.items():
        ax.broken_barh(
            spans,
            (row - 0.4, 0.8),
            facecolors=COLORS[kind],
            hatch="//" if hatched else None,
            edgecolor="black",
            linewidth=0.3,
        )
    if len(nodes) <= MAX_LABELS:
        for i, node in enumerate(nodes):
            if node.microbatch >= 0 and node.stream == 0 and node.kind in ("attn", "mlp") and sim.end[i] > sim.start[i]:
                middle = (sim.start[i] + sim.end[i]) / 2 * 1e3
                ax.text(middle, NUM_STREAMS * node.rank, str(node.microbatch), ha="center", va="center", fontsize=7)
    streams = ("compute", "collectives", "send/recv")
    ax.set_yticks(range(NUM_STREAMS * g.num_ranks), [f"rank {r} {s}" for r in range(g.num_ranks) for s in streams])
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (ms); hatched = backward / recompute; numbers = micro-batch")
    used = sorted({n.kind for n in nodes}, key=KINDS.index)
    ax.legend(
        [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in used],
        used,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
    )
    ax.set_title(f"{title}: {len(nodes)} nodes, {len(g.edges)} edges, simulated {sim.iter_time_s * 1e3:.1f} ms")
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)


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
