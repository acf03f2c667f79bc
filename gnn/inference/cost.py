"""What predicting a plan costs, from its fields alone, before any of it is done.

Featurisation builds each plan's execution graph (gnn.graph.build) and simulates it; a plan with many
micro-batches is simulated as two short graphs (gnn.sim.plan.sampled_counts) and the GNN reads the shorter.
A graph holds 2 passes per stage and micro-batch plus one optimizer step per pipeline rank, so its passes are a
closed form of (pp, virtual stages, micro-batches). Building and simulating a graph costs per node, and a pass
holds 3 nodes, more with tensor, context or expert parallelism, FSDP and recompute (``nodes_per_pass``: an
upper bound, checked against the graphs built); the GNN reads one node per pass. Taking a plan apart (/explain,
gnn.explain) predicts it, simulates it again (and its short graph once more), and draws the first ranks of its
short graph as a timeline.

The constants are this machine's (2 cores), set from experiments/bench/request_cost.py over plans from one
stage to 256, batches of 1 to 10,000 plans, identical or all different, dense and mixture-of-experts with every
parallelism, predicted and taken apart (experiments/results/request_cost.json): above what any measured request
paid, quiet, leaving room for a machine busy with one other job (which made the same requests up to 2.5 times
slower). An estimate is an upper bound, not a mean.
"""

from __future__ import annotations

from dataclasses import dataclass

from collect.schema import Plan
from gnn.sim.plan import sampled_counts

# per unit (experiments/results/request_cost.json)
SECONDS_FIXED = 0.2  # a request's first plan on a hardware record or pipeline shape the server has not seen
SECONDS_PER_PLAN = 2.0e-4  # validation, a pass compiler, the response row
SECONDS_PER_SIM_NODE = 5.0e-6  # layout, graph, simulation and memory replay, per node of every graph built
# ... and a graph's work grows faster than its nodes (a pipeline of 256 stages x 512 micro-batches, 4x the nodes of
# 128 x 256, took 6-7x as long): per pair of nodes of each graph built, which matters only past ~10^5 nodes
SECONDS_PER_NODE_PAIR = 3.0e-12
SECONDS_PER_GNN_PASS = 1.5e-5  # features, packing and the ensemble's forward pass, per pass the GNN reads
SECONDS_PER_DRAWN = 4.0e-5  # a bar of a timeline (gnn.render), drawn and rasterised
SECONDS_DRAWING = 1.5  # a timeline's figure, axes, legend, labels and PNG, however few its bars
BYTES_PER_SIM_NODE = 640  # a graph being simulated (its table, edges and the simulator's arrays), per node
BYTES_PER_GNN_PASS = 4_000  # a featurised chunk and its forward pass's activations, per pass the GNN reads
BYTES_PER_DRAWN = 2_000  # a bar of a timeline being drawn
BYTES_FIXED = 96 * 2**20  # what any request adds above the idle server (threads, the response, allocator slack)
# nodes of a pass (gnn.graph.passes): blocks, a send or receive, the step's share; and what each parallelism adds
NODES_PER_PASS = 3.2
NODES_ADDED = {"tp": 2.0, "cp": 1.0, "ep": 2.0, "fsdp": 1.0, "recompute": 0.5}
DRAWN_RANKS = 16  # gnn.render.MAX_RANKS: the pipeline ranks a timeline draws

# what one request may cost: the service's budget, refused before any work when the estimate is over
REQUEST_SECONDS = 10.0
REQUEST_BYTES = 2**30
# a chunk's share: its graphs and forward pass, while a worker builds the next and one waits in the queue
CHUNK_BYTES = 192 * 2**20


def nodes_per_pass(plan: Plan) -> float:
    """An upper bound on a pass's nodes, the graph's optimizer steps among them (tests/serve/test_limits.py checks
    it against graphs built): a tensor-parallel pass adds its collectives, a context-parallel one its ring, an
    expert-parallel one its dispatch and combine, FSDP its gathers, recompute its forward again."""
    added = {
        "tp": plan.tp > 1,
        "cp": plan.cp > 1,
        "ep": plan.ep > 1,
        "fsdp": plan.fsdp_enabled,
        "recompute": plan.recompute != "none",
    }
    return NODES_PER_PASS + sum(NODES_ADDED[k] for k, on in added.items() if on)


def graph_passes(plan: Plan) -> tuple[int, ...]:
    """The passes of each graph featurisation builds for ``plan``: one graph, or the two short ones of a plan with
    many micro-batches (the GNN reads the first)."""
    counts = sampled_counts(plan) or (plan.num_microbatches,)
    return tuple(2 * plan.num_stages * m + plan.pp for m in counts)


@dataclass(frozen=True)
class Cost:
    """The estimate of featurising and predicting some plans (and of taking some apart)."""

    plans: int = 0
    sim_nodes: float = 0  # every graph built
    gnn_passes: int = 0  # the graphs the GNN reads
    largest_graph: float = 0  # nodes of the largest single graph: what one simulation holds at once
    largest_read: int = 0  # passes of the largest graph the GNN reads
    drawn: float = 0  # bars of the timelines drawn
    timelines: int = 0
    node_pairs: float = 0  # the sum over graphs built of their nodes squared

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(
            self.plans + other.plans,
            self.sim_nodes + other.sim_nodes,
            self.gnn_passes + other.gnn_passes,
            max(self.largest_graph, other.largest_graph),
            max(self.largest_read, other.largest_read),
            self.drawn + other.drawn,
            self.timelines + other.timelines,
            self.node_pairs + other.node_pairs,
        )

    @property
    def seconds(self) -> float:
        return (
            SECONDS_FIXED * (self.plans > 0)
            + SECONDS_PER_PLAN * self.plans
            + SECONDS_PER_SIM_NODE * self.sim_nodes
            + SECONDS_PER_NODE_PAIR * self.node_pairs
            + SECONDS_PER_GNN_PASS * self.gnn_passes
            + SECONDS_PER_DRAWN * self.drawn
            + SECONDS_DRAWING * self.timelines
        )

    @property
    def chunk_bytes(self) -> float:
        """Memory of these plans featurised and predicted as one chunk."""
        return BYTES_PER_SIM_NODE * self.largest_graph + BYTES_PER_GNN_PASS * self.gnn_passes

    @property
    def peak_bytes(self) -> float:
        """Memory above the idle server while these plans are answered in chunks of at most CHUNK_BYTES: a chunk
        in the forward pass, one being featurised and one queued, or all of them if they are fewer; and the
        largest timeline being drawn."""
        chunks = min(self.chunk_bytes, 3 * max(CHUNK_BYTES, self.single_chunk_bytes))
        return BYTES_FIXED + max(chunks, BYTES_PER_SIM_NODE * self.largest_graph + BYTES_PER_DRAWN * self.drawn)

    @property
    def single_chunk_bytes(self) -> float:
        """The least a chunk can hold: the largest plan alone."""
        return BYTES_PER_SIM_NODE * self.largest_graph + BYTES_PER_GNN_PASS * self.largest_read


def plan_cost(plan: Plan) -> Cost:
    passes, per_pass = graph_passes(plan), nodes_per_pass(plan)
    pairs = sum((p * per_pass) ** 2 for p in passes)
    return Cost(1, sum(passes) * per_pass, passes[0], max(passes) * per_pass, passes[0], node_pairs=pairs)


def explain_cost(plan: Plan) -> Cost:
    """Taking ``plan`` apart (gnn.explain) after predicting it: its graphs simulated again, a sampled plan's short
    graph once more, and the first DRAWN_RANKS pipeline ranks of that graph drawn."""
    passes, per_pass = graph_passes(plan), nodes_per_pass(plan)
    simulated = [*passes, *passes[:1]] if len(passes) > 1 else passes
    again = sum(simulated) * per_pass
    pairs = sum((p * per_pass) ** 2 for p in simulated)
    drawn = passes[0] * per_pass * min(1.0, DRAWN_RANKS / plan.pp)
    return plan_cost(plan) + Cost(0, again, 0, max(passes) * per_pass, 0, drawn, 1, pairs)


def request_cost(plans) -> Cost:
    total = Cost()
    for plan in plans:
        total = total + plan_cost(plan)
    return total


def over_budget(cost: Cost, seconds: float = REQUEST_SECONDS, max_bytes: float = REQUEST_BYTES) -> str | None:
    """Why a request of this cost is refused, with its estimate and the budget; None within both."""
    if cost.seconds > seconds:
        return (
            f"the request's estimated work is {cost.seconds:.1f} s ({cost.plans} plans, {cost.sim_nodes:,.0f} "
            f"simulated nodes), over the budget of {seconds:.0f} s per request: send fewer plans, or fewer "
            "pipeline stages x micro-batches per plan"
        )
    if cost.peak_bytes > max_bytes:
        return (
            f"the request's estimated memory is {cost.peak_bytes / 2**20:,.0f} MiB (its largest plan's graph holds "
            f"{cost.largest_graph:,.0f} nodes), over the budget of {max_bytes / 2**20:,.0f} MiB per request: fewer "
            "pipeline stages x micro-batches per plan"
        )
    return None
