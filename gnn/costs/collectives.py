"""A collective's seconds on a datasheet preset, the way NCCL's own tuning model prices it.

After NVIDIA/nccl src/graph/tuning.cc (ncclTopoTuneModel, ncclTopoGetAlgoTime): time = latency + bytes / algorithm
bandwidth, for a ring under the Simple and the LL protocols, NCCL taking the faster. A ring of n ranks over
``nodes`` nodes takes 2(n - 1) steps for an all-reduce, n - 1 for an all-gather or reduce-scatter, of which
2(nodes - 1) or nodes - 1 cross the network; each step pays the hardware's latency, the call a base latency.
The bus bandwidth of a ring inside a node is the NVLink bandwidth per GPU. Across nodes NCCL runs one channel per
NIC, and the preset's nodes have one NIC per GPU (DGX): a group with k ranks on each node moves its data through
k NICs, so its bus bandwidth is k times one NIC's, never more than NVLink's. A tensor-parallel group of 16 over
two nodes so keeps most of NVLink's bandwidth; a data-parallel group with one rank per node has one NIC.

An all-reduce across more than one node may also run as NCCL's double binary tree, whose latency grows with the
log of the node count where a ring's grows with the rank count: at 32 nodes of 8 a ring pays 510 steps, a tree
2 x (7 NVLink + 5 network) hops. tuning.cc prices it at half its bus bandwidth, capped at 80 GB/s beyond two nodes
(110 GB/s on two), 0.9 of the channel bandwidth; NCCL picks the faster, and so does this model. NVLink SHARP
(NVLS) and CollNet need switch support this model does not describe, and are not priced.
"""

from __future__ import annotations

import math

# tuning.cc's latencies in microseconds, ring algorithm: a call's base latency, then per step over NVLink and
# over the network, for the Simple and LL protocols (LL: 8-byte flag-and-data lines, quarter bandwidth across
# nodes or for all-reduce, a third otherwise)
BASE_LATENCY_US = {"simple": 8.4, "ll": 6.6}
STEP_LATENCY_US = {"simple": (3.4, 9.6), "ll": (0.47, 2.7)}  # (NVLink, network)
LL_MULTI_NODE_STEP = 1.8  # tuning.cc: an NVLink step of LL costs 1.8x when the ring spans nodes
# tuning.cc's tree: base latency and per-hop latency (NVLink, network) in microseconds, Simple and LL protocols
TREE_BASE_LATENCY_US = {"simple": 0.0, "ll": 4.4}
TREE_HOP_LATENCY_US = {"simple": (28.0, 50.0), "ll": (0.52, 5.0)}
TREE_MAX_BUS_BW = {False: 80e9, True: 110e9}  # bytes/s: beyond two nodes, on two (tuning.cc maxTreeBw)
TREE_BW_SHARE, TREE_LL_SHARE = 0.9, 1 / 3.8  # of the channel bandwidth; LL's share of the tree's


def ring_steps(op: str, ranks: int, nodes: int) -> tuple[int, int]:
    """(steps, of them crossing the network) of one ring collective."""
    if op == "all_reduce":
        return 2 * (ranks - 1), 2 * (nodes - 1)
    return ranks - 1, nodes - 1  # all_gather, reduce_scatter


def bus_bandwidth(intra_bw: float, inter_bw: float, per_node: int, nodes: int) -> float:
    """Bytes/s of a ring's bus: NVLink inside a node; across nodes, one NIC per GPU of the group on a node."""
    return intra_bw if nodes == 1 else min(intra_bw, per_node * inter_bw)


def ring_seconds(
    op: str, message_bytes: float, ranks: int, per_node: int, intra_bw: float, inter_bw: float, half_bytes: float = 0.0
) -> float:
    """An all-reduce, all-gather or reduce-scatter over ``ranks`` ranks, ``per_node`` of them on a node.
    ``message_bytes`` is the buffer NCCL counts: all-reduce's, reduce-scatter's input, all-gather's output.
    ``half_bytes``: the message at which the Simple protocol reaches half its bandwidth, where a preset measured it
    (Hockney's n_1/2: NCCL opens channels as messages grow), priced as that many bytes more at full bandwidth."""
    nodes = math.ceil(ranks / per_node)
    steps, inter = ring_steps(op, ranks, nodes)
    busbw = bus_bandwidth(intra_bw, inter_bw, per_node, nodes)
    algbw = busbw * ranks / steps  # bus to algorithm bandwidth, as tuning.cc converts for rings
    best = math.inf
    for proto in ("simple", "ll"):
        nvl, net = STEP_LATENCY_US[proto]
        if proto == "ll" and nodes > 1:
            nvl *= LL_MULTI_NODE_STEP
        latency = (BASE_LATENCY_US[proto] + (steps - inter) * nvl + inter * net) * 1e-6
        bw = algbw if proto == "simple" else algbw / (4 if nodes > 1 or op == "all_reduce" else 3)
        best = min(best, latency + (message_bytes + (half_bytes if proto == "simple" else 0.0)) / bw)
    return best


def tree_all_reduce_seconds(
    message_bytes: float, ranks: int, per_node: int, intra_bw: float, inter_bw: float, half_bytes: float = 0.0
) -> float:
    """An all-reduce over nodes as NCCL's tree: up and down a chain inside each node and a binary tree across
    them (tuning.cc's log2i: whole levels); the faster of the Simple and LL protocols. ``half_bytes``: as a
    ring's."""
    nodes = math.ceil(ranks / per_node)
    bus = min(TREE_BW_SHARE * bus_bandwidth(intra_bw, inter_bw, per_node, nodes), TREE_MAX_BUS_BW[nodes <= 2])
    best = math.inf
    for proto in ("simple", "ll"):
        nvl, net = TREE_HOP_LATENCY_US[proto]
        nvl *= LL_MULTI_NODE_STEP if proto == "ll" else 1.0
        latency = (TREE_BASE_LATENCY_US[proto] + 2 * ((per_node - 1) * nvl + (nodes.bit_length() - 1) * net)) * 1e-6
        algbw = 0.5 * bus * (TREE_LL_SHARE if proto == "ll" else 1.0)  # tuning.cc: a tree's algorithm bandwidth
        best = min(best, latency + (message_bytes + (half_bytes if proto == "simple" else 0.0)) / algbw)
    return best


def all_to_all_seconds(
    message_bytes: float, ranks: int, per_node: int, intra_bw: float, inter_bw: float, remote_share: float = 1.0
) -> float:
    """Each rank sends (ranks - 1) / ranks of its message to the others at once: the share bound for other nodes
    through its own NIC, the rest over NVLink; the slower of the two, after one step's latency per peer.
    ``remote_share``: of the share bound for other nodes, what crosses the network (dispatch_remote_share)."""
    nodes = math.ceil(ranks / per_node)
    remote = (ranks - per_node) / ranks * message_bytes * remote_share if nodes > 1 else 0.0
    local = (min(per_node, ranks) - 1) / ranks * message_bytes
    nvl, net = STEP_LATENCY_US["simple"]
    latency = (BASE_LATENCY_US["simple"] + (per_node - 1) * nvl + (ranks - per_node) * net * (nodes > 1)) * 1e-6
    return latency + max(local / intra_bw, remote / inter_bw)


def send_recv_seconds(message_bytes: float, crosses_node: bool, intra_bw: float, inter_bw: float) -> float:
    """One point-to-point transfer: a base and one step's latency, then the link."""
    nvl, net = STEP_LATENCY_US["simple"]
    latency = (BASE_LATENCY_US["simple"] + (net if crosses_node else nvl)) * 1e-6
    return latency + message_bytes / (inter_bw if crosses_node else intra_bw)


def dispatch_remote_share(ranks: int, per_node: int, top_k: int) -> float:
    """A hierarchical expert dispatch (DeepEP, HybridEP) sends a token once to each remote node that holds any of
    its top_k experts, not once per expert: of the copies bound for other nodes, the share that crosses the
    network. Experts drawn evenly over the ranks (the pages' force-balanced routing): a remote node is hit with
    probability 1 - (1 - 1/nodes)^top_k, against top_k / nodes copies sent to it."""
    nodes = ranks / per_node
    if nodes <= 1 or top_k <= 0:
        return 1.0
    return (1 - (1 - 1 / nodes) ** top_k) / (top_k / nodes)
