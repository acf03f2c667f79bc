"""Draw a plan's execution graph as a simulated timeline (one row per rank and stream).

python -m gnn.render --out docs/img/timeline.png     (a small 2-stage 1F1B plan with TP and DP)
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from collect.schema import RunSpec  # noqa: E402
from gnn.costs.hardware import hardware_model  # noqa: E402
from gnn.graph.build import ExecGraph, build_graph  # noqa: E402
from gnn.graph.table import KINDS  # noqa: E402
from gnn.sim.simulate import NUM_STREAMS, simulate  # noqa: E402

COLORS = dict(zip(KINDS, plt.get_cmap("tab20").colors))


def draw_timeline(g: ExecGraph, title: str, path: str) -> None:
    sim = simulate(g)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 1.2 * g.num_ranks))
    for i, node in enumerate(g.nodes):
        row = NUM_STREAMS * node.rank + node.stream
        width = sim.end[i] - sim.start[i]
        if width <= 0:
            continue
        ax.barh(
            row,
            width * 1e3,
            left=sim.start[i] * 1e3,
            color=COLORS[node.kind],
            hatch="//" if node.phase in ("backward", "recompute") else None,
            edgecolor="black",
            linewidth=0.3,
        )
        if node.microbatch >= 0 and node.stream == 0 and node.kind in ("attn", "mlp"):
            ax.text((sim.start[i] + width / 2) * 1e3, row, str(node.microbatch), ha="center", va="center", fontsize=7)
    streams = ("compute", "collectives", "send/recv")
    ax.set_yticks(range(NUM_STREAMS * g.num_ranks), [f"rank {r} {s}" for r in range(g.num_ranks) for s in streams])
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (ms); hatched = backward / recompute; numbers = micro-batch")
    used = sorted({n.kind for n in g.nodes}, key=KINDS.index)
    ax.legend(
        [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in used],
        used,
        ncol=len(used),
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35),
        fontsize=8,
    )
    ax.set_title(f"{title}: {len(g.nodes)} nodes, {len(g.edges)} edges, simulated {sim.iter_time_s * 1e3:.1f} ms")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
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
