"""One forward pass for all members of an ensemble: their node states batched as [members, nodes, hidden].

Run one by one, M members pay PyG's per-call overhead M times for every gather, scatter and linear of every
layer and head, which dominates on the small graphs a single request brings. Here each of those is one
batched matmul / gather / scatter for all members, with the members' weights stacked once and cached.
The inputs' masks and standardisations are stacked too, and the physics base is computed once when the
members' bases agree (they are fitted on the same rows). Inference only: the
result matches running the members one by one to float rounding (tests/model/test_fused.py).
"""

from __future__ import annotations

import ctypes
import warnings
import weakref

import torch
from torch import nn

from gnn import cancel
from gnn.model.standardize import Standardize

_CACHE: "weakref.WeakKeyDictionary[nn.ModuleList, dict]" = weakref.WeakKeyDictionary()
# below this many edges building the sparse matrix costs more than it saves: one plan's graph (~100-400 edges)
# ran its forward pass in 2.4 ms edge by edge and 2.6-3.8 ms typed
TYPED_FROM = 2048


# PlanGNN's depth (gnn.model.network builds by these): linears in each GINE layer's MLP and in the head
CONV_LINEARS, HEAD_LINEARS = 2, 3


def weight_names(num_layers: int) -> list[str]:
    """The state-dict names of gnn.model.network.PlanGNN's tensors, under the training module's ``model``: what the
    forward pass here reads (the physics base aside: a module of its own)."""

    def linear(name: str) -> list[str]:
        return [f"model.{name}.weight", f"model.{name}.bias"]

    names = [f"model.{norm}.{b}" for norm in ("node_norm", "global_norm") for b in ("mean", "scale")]
    names += linear("node_in")
    for i in range(num_layers):
        names += linear(f"convs.{i}.lin") + [f"model.convs.{i}.eps"]
        names += [n for j in range(CONV_LINEARS) for n in linear(f"convs.{i}.nn.lins.{j}")]
    return names + [n for j in range(HEAD_LINEARS) for n in linear(f"head.lins.{j}")]


def _tensors(member: nn.Module) -> dict[str, torch.Tensor]:
    """A member's tensors by state-dict name: a training module's parameters, or a loaded member's buffers."""
    return {**dict(member.named_parameters()), **dict(member.named_buffers())}


def fusable(members: nn.ModuleList) -> bool:
    """Members in eval mode holding PlanGNN's tensors, alike in shape."""
    if any(m.training for m in members):
        return False
    entry = _entry(members)
    if entry["fusable"] is None:
        names = weight_names(members[0].config["num_layers"])
        shapes = [[tuple(t[n].shape) if n in t else None for n in names] for t in map(_tensors, members)]
        entry["fusable"] = None not in shapes[0] and all(s == shapes[0] for s in shapes)
    return entry["fusable"]


def _entry(members: nn.ModuleList) -> dict:
    """Per ensemble, cached: whether it fuses, its parameters, and its stacked weights with their version."""
    entry = _CACHE.get(members)
    if entry is None:
        # buffers too: the stacked inputs hold the masks, standardisation statistics and physics fits
        entry = _CACHE[members] = {
            "fusable": None,
            "params": [*members.parameters(), *members.buffers()],
            "version": None,
        }
    return entry


def _stack(tensors: list[dict], name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, in, out] weights and [M, 1, out] biases of linear ``name``, so that baddbmm(bias, x, weight) = x @ W.T + b
    per member."""
    return (
        torch.stack([t[f"model.{name}.weight"].detach().t() for t in tensors]).contiguous(),
        torch.stack([t[f"model.{name}.bias"].detach() for t in tensors]).unsqueeze(1),
    )


def _weights(members: nn.ModuleList) -> dict:
    """The members' weights stacked, rebuilt whenever a parameter changed (trained, loaded) since the last call."""
    entry = _entry(members)
    version = [(p.data_ptr(), p._version) for p in entry["params"]]
    if entry["version"] == version:
        return entry["weights"]
    tensors = [_tensors(m) for m in members]
    layers = [
        (
            _stack(tensors, f"convs.{i}.lin"),
            *(_stack(tensors, f"convs.{i}.nn.lins.{j}") for j in range(CONV_LINEARS)),
            torch.stack([t[f"model.convs.{i}.eps"].detach().reshape(()) for t in tensors]).view(-1, 1, 1),
        )
        for i in range(members[0].config["num_layers"])
    ]
    heads = [_stack(tensors, f"head.lins.{j}") for j in range(HEAD_LINEARS)]
    entry.update(version=version, weights={"layers": layers, "heads": heads, "inputs": _stack_inputs(members, tensors)})
    return entry["weights"]


def _stack_inputs(members: nn.ModuleList, tensors: list[dict]) -> dict:
    """The members' input masks and standardisations as [M, 1, dim], and whether one physics base serves all."""
    models = [m.model for m in members]

    def stacked(name):
        return torch.stack([t[name].detach() for t in tensors]).unsqueeze(1)

    one = models[0]
    shared_physics = all(torch.equal(m.u_mask, members[0].u_mask) for m in members) and all(
        model.sim_index == one.sim_index
        and (model.time_base is None) == (one.time_base is None)
        and (
            one.time_base is None
            or (torch.equal(model.time_base.coef, one.time_base.coef) and model.time_base.index == one.time_base.index)
        )
        for model in models
    )
    return {
        "x_mask": stacked("x_mask"),
        "u_mask": stacked("u_mask"),
        "x_mean": stacked("model.node_norm.mean"),
        "x_scale": stacked("model.node_norm.scale"),
        "u_mean": stacked("model.global_norm.mean"),
        "u_scale": stacked("model.global_norm.scale"),
        "node_in": _stack(tensors, "node_in"),
        "shared_physics": shared_physics,
    }


def _standardized(values: torch.Tensor, mask, mean, scale) -> torch.Tensor:
    """gnn.model.network.Standardize of every member's masked input at once: [M, rows, dim]."""
    return ((values * mask - mean) * scale).clamp_(-Standardize.CLIP, Standardize.CLIP)


def physics_offsets(members: nn.ModuleList, u: torch.Tensor) -> torch.Tensor:
    """[M, n_graphs, 3] the physics base each member's heads add, or [1, n_graphs, 3] when the members' bases
    agree (fitted on the same rows): then it is computed once."""
    models = [m.model for m in members]
    if _weights(members)["inputs"]["shared_physics"]:
        return models[0].physics_offset(u * members[0].u_mask).unsqueeze(0)
    return torch.stack([model.physics_offset(u * m.u_mask) for m, model in zip(members, models)])


def keep_freed_memory() -> None:
    """Ask glibc to keep freed blocks of up to 64 MiB for reuse, once per process.

    By default it maps blocks over 128 KiB (or the largest one freed so far) fresh from the OS and returns
    them on free, so each of the forward pass's ~2 MB intermediates is touched page by page for the first
    time, at ~2.5 us a page here: zeroing a fresh 2.2 MB buffer took 1.36 ms. Kept, the forward pass took
    17% less CPU (278-294 against 333-363 us per plan, 3 runs of the demo's 960 plans, one thread). The price
    is that the process keeps up to its peak heap. Nothing to do where the C library is not glibc.
    """
    global _MEMORY_KEPT
    if _MEMORY_KEPT:
        return
    _MEMORY_KEPT = True
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 64 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 256 << 20)
    except (OSError, AttributeError):  # macOS, musl: not glibc
        pass


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
_MEMORY_KEPT = False


def forward_members(members: nn.ModuleList, batch, physics: torch.Tensor | None = None) -> torch.Tensor:
    """[M, n_graphs, 3]: what ``torch.stack([m(batch) for m in members])`` computes. ``physics``: the members'
    physics_offsets for this batch, when the caller has them already."""
    keep_freed_memory()
    weights = _weights(members)
    inputs = weights["inputs"]
    typed = _typed_aggregation(batch) if batch.edge_index.shape[1] >= TYPED_FROM else None
    aggregate = typed or _edge_aggregation(batch)
    w_in, b_in = inputs["node_in"]
    h = torch.baddbmm(b_in, _standardized(batch.x, inputs["x_mask"], inputs["x_mean"], inputs["x_scale"]), w_in)
    for (w_edge, b_edge), (w1, b1), (w2, b2), eps in weights["layers"]:  # CONV_LINEARS = 2
        cancel.check("the network's forward pass")  # a layer of the largest graph is ~0.3 s
        z = aggregate(h, w_edge, b_edge).addcmul_(h, 1 + eps)  # a fresh tensor: summed in place
        h = h.add_(torch.baddbmm(b2, torch.baddbmm(b1, z, w1).relu_(), w2).relu_())
    # readout: sum and mean pooling per graph, the graph features, the heads and the physics base
    graphs = batch.num_graphs
    summed = torch.zeros(h.shape[0], graphs, h.shape[2]).index_add_(1, batch.batch, h)
    counts = torch.bincount(batch.batch, minlength=graphs).clamp_min(1).to(h.dtype).view(1, -1, 1)
    z = torch.cat(
        [summed, summed / counts, _standardized(batch.u, inputs["u_mask"], inputs["u_mean"], inputs["u_scale"])], 2
    )
    *hidden, (w_out, b_out) = weights["heads"]
    for w, b in hidden:
        z = torch.baddbmm(b, z, w).relu_()
    physics = physics_offsets(members, batch.u) if physics is None else physics
    return torch.baddbmm(b_out, z, w_out) + physics


def _both_ways(batch) -> torch.Tensor:
    """[2, 2E]: every edge, then its reverse (gnn.model.network.PlanGNN.body): sources, targets."""
    return torch.cat([batch.edge_index, batch.edge_index.flip(0)], dim=1)


def _directed(batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """_both_ways's sources and targets, and their attributes with the reverse flag."""
    flag = torch.zeros(batch.edge_attr.shape[0], 1)
    src, dst = _both_ways(batch)
    attrs = torch.cat([torch.cat([batch.edge_attr, flag], 1), torch.cat([batch.edge_attr, 1 - flag], 1)])
    return src, dst, attrs


def _edge_aggregation(batch):
    """GINE's sum over incoming edges of relu(h_src + edge embedding), edge by edge: any edge attributes.

    Node-major ([n, M * H]): gathering and scattering whole rows is several times faster than indexing the
    node dimension of [M, n, H] (one plan's forward pass: 5.5 ms before).
    """
    src, dst, attrs = _directed(batch)

    def aggregate(h, w_edge, b_edge):
        members, n, hidden = h.shape
        by_node = h.transpose(0, 1).reshape(n, members * hidden)
        embedded = torch.addmm(
            b_edge.transpose(0, 1).reshape(1, -1), attrs, w_edge.transpose(0, 1).reshape(attrs.shape[1], -1)
        )  # [edges, M * H]
        messages = (by_node.index_select(0, src) + embedded).relu_()
        summed = torch.zeros_like(by_node).index_add_(0, dst, messages)
        return summed.view(n, members, hidden).transpose(0, 1)

    return aggregate


def _typed_aggregation(batch):
    """The same sum when edge attributes are one-hot kinds (gnn.dataset.features.edge_arrays), ~2x faster.

    With K kinds and the reverse flag there are only 2K distinct edge embeddings, so a message depends on its
    source node and its type alone: relu(h + e_t) is computed once per node and type, and a sparse matrix per
    type (targets x sources) sums them, instead of gathering and scattering a hidden vector per edge. One type
    at a time, into one reused buffer: materialising all types at once ([2K, n, M * H], ~11 MB for the
    largest chunk of a search) cost more in allocating and writing it than the products themselves.
    """
    attr = batch.edge_attr
    if attr.numel() == 0 or not bool(((attr == 0) | (attr == 1)).all() and (attr.sum(1) == 1).all()):
        return None
    kinds, n = attr.shape[1], batch.x.shape[0]
    kind = attr.argmax(1)
    src, dst = _both_ways(batch)
    adjacency = _adjacency_per_type(src, dst, torch.cat([kind, kind + kinds]), 2 * kinds, n)
    eye = torch.eye(kinds)
    embeddings_in = torch.cat([torch.cat([eye, torch.zeros(kinds, 1)], 1), torch.cat([eye, torch.ones(kinds, 1)], 1)])

    def aggregate(h, w_edge, b_edge):
        members, _, hidden = h.shape
        table = torch.baddbmm(b_edge, embeddings_in.expand(members, -1, -1), w_edge)  # [M, types, H]
        per_type = table.transpose(0, 1).reshape(2 * kinds, members * hidden)
        by_node = h.transpose(0, 1).reshape(n, members * hidden)  # node-major: one row per sparse-matrix column
        summed, message = torch.zeros(n, members * hidden), torch.empty(n, members * hidden)
        for t, matrix in adjacency:
            torch.add(by_node, per_type[t], out=message).relu_()
            summed.addmm_(matrix, message)
        return summed.view(n, members, hidden).transpose(0, 1)

    return aggregate


def _adjacency_per_type(src, dst, types, num_types: int, n: int) -> list[tuple[int, torch.Tensor]]:
    """(type, [n, n] CSR matrix of its edges, targets x sources) for each type that has edges. Built straight
    from one sort by (type, target): coalescing a COO matrix cost ~3.6 ms of the largest chunk's forward pass.
    Repeated edges stay repeated, and the product sums them, as coalescing would."""
    row = types * n + dst
    order = torch.argsort(row, stable=True)
    crow = torch.zeros(num_types, n + 1, dtype=torch.long)
    crow[:, 1:] = torch.bincount(row, minlength=num_types * n).view(num_types, n).cumsum(1)
    bounds = torch.cat([torch.zeros(1, dtype=torch.long), crow[:, -1].cumsum(0)]).tolist()
    cols, out = src[order], []
    with warnings.catch_warnings():  # "sparse CSR support is in beta": CSR products on CPU are what we need
        warnings.simplefilter("ignore", UserWarning)
        for t in range(num_types):
            lo, hi = bounds[t], bounds[t + 1]
            if hi > lo:
                out.append((t, torch.sparse_csr_tensor(crow[t], cols[lo:hi], torch.ones(hi - lo), (n, n))))
    return out
