"""What predicting a plan costs, from its fields alone, before any of it is done.

Featurisation builds each plan's execution graph (gnn.graph.build) and simulates it; a plan with many
micro-batches is simulated as two short graphs (gnn.sim.truncate.sampled_counts) and the GNN reads the shorter.
A graph holds 2 passes per stage and micro-batch plus one optimizer step per pipeline rank, a handful of nodes
per pass, so its passes are a closed form of (pp, virtual stages, micro-batches) and everything downstream
(layout, simulation, memory replay, the ensemble's forward pass) costs in proportion to them.

The constants are this machine's (2 cores), set from experiments/bench/request_cost.py over plans from one
stage to 256 and batches of 1 to 10,000 plans, identical or all different (experiments/results/request_cost.json):
above what any measured request paid, quiet (at most 0.63 of the estimated time and 0.81 of the memory), leaving
room for a machine busy with one other job (which made the same requests up to 2.5 times slower). An estimate is
an upper bound, not a mean.
"""

from __future__ import annotations

from dataclasses import dataclass

from collect.schema import Plan
from gnn.sim.truncate import sampled_counts

# per unit (experiments/results/request_cost.json)
SECONDS_FIXED = 0.2  # a request's first plan on a hardware record or pipeline shape the server has not seen
SECONDS_PER_PLAN = 2.0e-4  # validation, a pass compiler, the response row
SECONDS_PER_SIM_PASS = 1.5e-5  # layout, graph, simulation and memory replay, per pass of every graph built
SECONDS_PER_GNN_PASS = 1.5e-5  # features, packing and the ensemble's forward pass, per pass the GNN reads
BYTES_PER_SIM_PASS = 2_000  # a graph being simulated (its table, edges and the simulator's arrays), per pass
BYTES_PER_GNN_PASS = 4_000  # a featurised chunk and its forward pass's activations, per pass the GNN reads
BYTES_FIXED = 96 * 2**20  # what any request adds above the idle server (threads, the response, allocator slack)

# what one request may cost: the service's budget, refused before any work when the estimate is over
REQUEST_SECONDS = 10.0
REQUEST_BYTES = 2**30
# a chunk's share: its graphs and forward pass, while a worker builds the next and one waits in the queue
CHUNK_BYTES = 192 * 2**20


def graph_passes(plan: Plan) -> tuple[int, ...]:
    """The passes of each graph featurisation builds for ``plan``: one graph, or the two short ones of a plan with
    many micro-batches (the GNN reads the first)."""
    counts = sampled_counts(plan) or (plan.num_microbatches,)
    return tuple(2 * plan.num_stages * m + plan.pp for m in counts)


@dataclass(frozen=True)
class Cost:
    """The estimate of featurising and predicting some plans."""

    plans: int = 0
    sim_passes: int = 0  # every graph built
    gnn_passes: int = 0  # the graphs the GNN reads
    largest_graph: int = 0  # passes of the largest single graph: what one simulation holds at once

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(
            self.plans + other.plans,
            self.sim_passes + other.sim_passes,
            self.gnn_passes + other.gnn_passes,
            max(self.largest_graph, other.largest_graph),
        )

    @property
    def seconds(self) -> float:
        return (
            SECONDS_FIXED * (self.plans > 0)
            + SECONDS_PER_PLAN * self.plans
            + SECONDS_PER_SIM_PASS * self.sim_passes
            + SECONDS_PER_GNN_PASS * self.gnn_passes
        )

    @property
    def chunk_bytes(self) -> float:
        """Memory of these plans featurised and predicted as one chunk."""
        return BYTES_PER_SIM_PASS * self.largest_graph + BYTES_PER_GNN_PASS * self.gnn_passes

    @property
    def peak_bytes(self) -> float:
        """Memory above the idle server while these plans are answered in chunks of at most CHUNK_BYTES: a chunk
        in the forward pass, one being featurised and one queued, or all of them if they are fewer."""
        return BYTES_FIXED + min(self.chunk_bytes, 3 * max(CHUNK_BYTES, self.single_chunk_bytes))

    @property
    def single_chunk_bytes(self) -> float:
        """The least a chunk can hold: the largest plan alone."""
        return BYTES_PER_SIM_PASS * self.largest_graph + BYTES_PER_GNN_PASS * self.largest_graph


def plan_cost(plan: Plan) -> Cost:
    passes = graph_passes(plan)
    return Cost(1, sum(passes), passes[0], max(passes))


def request_cost(plans) -> Cost:
    total = Cost()
    for plan in plans:
        total = total + plan_cost(plan)
    return total


def over_budget(cost: Cost, seconds: float = REQUEST_SECONDS, max_bytes: float = REQUEST_BYTES) -> str | None:
    """Why a request of this cost is refused, with its estimate and the budget; None within both."""
    if cost.seconds > seconds:
        return (
            f"the request's estimated work is {cost.seconds:.1f} s ({cost.plans} plans, {cost.sim_passes:,} "
            f"simulated passes), over the budget of {seconds:.0f} s per request: send fewer plans, or fewer "
            "pipeline stages x micro-batches per plan"
        )
    if cost.peak_bytes > max_bytes:
        return (
            f"the request's estimated memory is {cost.peak_bytes / 2**20:,.0f} MiB (its largest plan's graph holds "
            f"{cost.largest_graph:,} passes), over the budget of {max_bytes / 2**20:,.0f} MiB per request: fewer "
            "pipeline stages x micro-batches per plan"
        )
    return None
