"""A plan simulated (simulate_plan): its graph built and run, and a plan of many micro-batches as two short runs of
its schedule, extrapolated.

A graph has nodes per stage, micro-batch and phase, so a plan with 64
micro-batches compiles to thousands of nodes, and both the simulator and the
GNN pay for every one. But the micro-batches of a schedule are identical: past
the warm-up, each extra micro-batch adds the same steady-state period to the
iteration, and the same activations (GPipe) or none (1F1B, accumulation) to
the peak. So the simulator's outputs are affine in the micro-batch count, and
two short runs, of pp + 1 and 2 * pp + 1 micro-batches (3 * pp and 4 * pp when
interleaved: multiples of pp, as that schedule requires), give the whole line. tests/gnn/test_simulate_plan.py
checks that the extrapolation matches simulating every micro-batch.

The GNN sees the shorter graph: a full pipeline fill and drain, which holds
the schedule's structure; the plan's true micro-batch count and the
extrapolated simulator outputs reach it as graph-level features. Fewer nodes
is what makes batched inference fast: the forward pass costs per node.
"""

from __future__ import annotations

from dataclasses import fields, replace

from collect.schema import Cluster, Plan, Workload
from gnn import cancel
from gnn.costs.hardware import HardwareModel
from gnn.graph.build import ExecGraph, build_graph
from gnn.graph.passes import shared_compiler
from gnn.sim.simulate import SimResult, simulate

SCALARS = [f.name for f in fields(SimResult) if f.type == "float"]


def sampled_counts(plan: Plan) -> tuple[int, int] | None:
    """The two micro-batch counts to simulate, or None when the plan is short enough to simulate whole."""
    # Each count must take every rank past its warm-up. pp micro-batches do for accumulation, GPipe and 1F1B;
    # interleaving warms up with up to (v + 1) * pp chunk passes, so it starts one round of pp later. And one
    # micro-batch more: the first backward is unlike the rest, it allocates the gradients. Interleaving needs
    # multiples of pp, so there the extra is a round of pp.
    first = 3 * plan.pp if plan.interleaved else plan.pp + 1
    short, longer = first, first + plan.pp
    return (short, longer) if plan.num_microbatches > longer else None


def simulate_plan(
    w: Workload, plan: Plan, cluster: Cluster, hw: HardwareModel, compilers: dict | None = None
) -> tuple[ExecGraph, SimResult]:
    """The graph the model reads, and the simulator's outputs for the full plan. ``compilers``: a cache of pass
    compilers shared by a batch of plans (gnn.graph.passes.shared_compiler)."""
    counts = sampled_counts(plan)
    compiler = shared_compiler(
        compilers, w, plan, cluster, hw
    )  # the two runs differ only in how often their passes repeat
    if counts is None:
        graph = build_graph(w, plan, cluster, hw, compiler)
        cancel.check("simulating a plan")
        return graph, simulate(graph)
    (k1, k2), n = counts, plan.num_microbatches
    graphs = [build_graph(w, plan.model_copy(update={"num_microbatches": k}), cluster, hw, compiler) for k in counts]
    cancel.check("simulating a plan")
    short = simulate(graphs[0])
    cancel.check("simulating a plan")
    longer = simulate(graphs[1])
    t = (n - k1) / (k2 - k1)

    def line(a, b):  # floats, or arrays of them
        return a + t * (b - a)

    # each event's peak on its own line (the kept outputs' merge can overtake the optimizer's peak past the samples)
    per_event = line(short.peak_mem_per_event, longer.peak_mem_per_event)
    per_rank = per_event.max(axis=1).tolist()
    # times summed over the schedule do not shrink with more micro-batches; the sampled runs can still disagree
    # where their busiest rank differs (a last stage of one layer), and a falling line would go below zero
    values = {name: line(getattr(short, name), max(getattr(short, name), getattr(longer, name))) for name in SCALARS}
    peaks = {"peak_mem_bytes": max(per_rank), "peak_mem_per_rank": per_rank, "peak_mem_per_event": per_event}
    return graphs[0], replace(longer, **{**values, **peaks})
