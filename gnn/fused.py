"""One forward pass for all members of an ensemble: their node states batched as [members, nodes, hidden].

Run one by one, M members pay PyG's per-call overhead M times for every gather, scatter and linear of every
layer and head, which dominates on the small graphs a single request brings. Here each of those is one
batched matmul / gather / scatter for all members, with the members' weights stacked once and cached.
The members' own modules still normalise the inputs and compute the physics base. Inference only: the
result matches running the members one by one to float rounding (tests/unit/test_fused.py).
"""
from __future__ import annotations

import warnings
import weakref

import torch
from torch import nn
from torch_geometric.nn import GINEConv

_CACHE: "weakref.WeakKeyDictionary[nn.ModuleList, dict]" = weakref.WeakKeyDictionary()
# below this many edges building the sparse matrix costs more than it saves: one plan's graph (~100-400 edges)
# ran its forward pass in 2.4 ms edge by edge and 2.6-3.8 ms typed
TYPED_FROM = 2048


def fusable(members: nn.ModuleList) -> bool:
    """Members in eval mode built like gnn.model.PlanGNN: GINE convolutions and heads of ReLU MLPs, no norms."""
    if any(m.training for m in members):
        return False
    entry = _entry(members)
    if entry["fusable"] is None:
        entry["fusable"] = _built_like_plan_gnn(members)
    return entry["fusable"]


def _built_like_plan_gnn(members: nn.ModuleList) -> bool:
    for m in members:
        model = getattr(m, "model", None)
        if model is None or not hasattr(model, "physics_offset"):
            return False
        mlps = [conv.nn for conv in model.convs] + [model.head]
        if not all(isinstance(conv, GINEConv) and conv.lin is not None for conv in model.convs) or any(
                not isinstance(mlp.act, nn.ReLU) or mlp.act_first or not mlp.plain_last
                or not all(isinstance(n, nn.Identity) for n in mlp.norms) for mlp in mlps):
            return False
    return len({tuple(p.shape for p in m.model.parameters()) for m in members}) == 1


def _entry(members: nn.ModuleList) -> dict:
    """Per ensemble, cached: whether it fuses, its parameters, and its stacked weights with their version."""
    entry = _CACHE.get(members)
    if entry is None:
        entry = _CACHE[members] = {"fusable": None, "params": list(members.parameters()), "version": None}
    return entry


def _stack(linears) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, in, out] weights and [M, 1, out] biases, so that baddbmm(bias, x, weight) = x @ W.T + b per member."""
    return (torch.stack([lin.weight.detach().t() for lin in linears]).contiguous(),
            torch.stack([lin.bias.detach() for lin in linears]).unsqueeze(1))


def _weights(members: nn.ModuleList) -> dict:
    """The members' weights stacked, rebuilt whenever a parameter changed (trained, loaded) since the last call."""
    entry = _entry(members)
    version = [(p.data_ptr(), p._version) for p in entry["params"]]
    if entry["version"] == version:
        return entry["weights"]
    models = [m.model for m in members]
    layers = []
    for i in range(len(models[0].convs)):
        convs = [model.convs[i] for model in models]
        layers.append((_stack([c.lin for c in convs]), _stack([c.nn.lins[0] for c in convs]),
                       _stack([c.nn.lins[1] for c in convs]),
                       torch.stack([c.eps.detach().reshape(()) for c in convs]).view(-1, 1, 1)))
    heads = [_stack([model.head.lins[j] for model in models]) for j in range(len(models[0].head.lins))]
    entry.update(version=version, weights={"layers": layers, "heads": heads})
    return entry["weights"]


def forward_members(members: nn.ModuleList, batch) -> torch.Tensor:
    """[M, n_graphs, 3]: what ``torch.stack([m(batch) for m in members])`` computes."""
    weights, models = _weights(members), [m.model for m in members]
    typed = _typed_aggregation(batch) if batch.edge_index.shape[1] >= TYPED_FROM else None
    aggregate = typed or _edge_aggregation(batch)
    h = torch.stack([model.node_in(model.node_norm(batch.x * m.x_mask)) for m, model in zip(members, models)])
    for (w_edge, b_edge), (w1, b1), (w2, b2), eps in weights["layers"]:
        z = aggregate(h, w_edge, b_edge) + (1 + eps) * h
        h = h + torch.baddbmm(b2, torch.baddbmm(b1, z, w1).relu_(), w2).relu_()
    # readout: sum and mean pooling per graph, the graph features, the heads and the physics base
    graphs = batch.num_graphs
    summed = torch.zeros(h.shape[0], graphs, h.shape[2]).index_add_(1, batch.batch, h)
    counts = torch.bincount(batch.batch, minlength=graphs).clamp_min(1).to(h.dtype).view(1, -1, 1)
    us = [batch.u * m.u_mask for m in members]
    z = torch.cat([summed, summed / counts, torch.stack([model.global_norm(u) for model, u in zip(models, us)])], 2)
    *hidden, (w_out, b_out) = weights["heads"]
    for w, b in hidden:
        z = torch.baddbmm(b, z, w).relu_()
    return torch.baddbmm(b_out, z, w_out) + torch.stack([model.physics_offset(u) for model, u in zip(models, us)])


def _directed(batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every edge and its reverse (gnn.model.PlanGNN.body): sources, targets, attributes with the reverse flag."""
    flag = torch.zeros(batch.edge_attr.shape[0], 1)
    src, dst = torch.cat([batch.edge_index, batch.edge_index.flip(0)], dim=1)
    attrs = torch.cat([torch.cat([batch.edge_attr, flag], 1), torch.cat([batch.edge_attr, 1 - flag], 1)])
    return src, dst, attrs


def _edge_aggregation(batch):
    """GINE's sum over incoming edges of relu(h_src + edge embedding), edge by edge: any edge attributes."""
    src, dst, attrs = _directed(batch)

    def aggregate(h, w_edge, b_edge):
        messages = (h[:, src] + torch.baddbmm(b_edge, attrs.expand(h.shape[0], -1, -1), w_edge)).relu_()
        return torch.zeros_like(h).index_add_(1, dst, messages)
    return aggregate


def _typed_aggregation(batch):
    """The same sum when edge attributes are one-hot kinds (gnn.features.edge_arrays), 1.6x faster.

    With K kinds and the reverse flag there are only 2K distinct edge embeddings, so a message depends on its
    source node and its type alone: relu(h + e_t) is computed once per node and type, and one sparse matrix
    (targets x [type, source]) sums them, instead of gathering and scattering a hidden vector per edge.
    """
    attr = batch.edge_attr
    if attr.numel() == 0 or not bool(((attr == 0) | (attr == 1)).all() and (attr.sum(1) == 1).all()):
        return None
    kinds, n = attr.shape[1], batch.x.shape[0]
    src, dst, _ = _directed(batch)
    kind = attr.argmax(1)
    types = torch.cat([kind, kind + kinds])  # forward edges, then their reverses
    eye = torch.eye(kinds)
    embeddings_in = torch.cat([torch.cat([eye, torch.zeros(kinds, 1)], 1), torch.cat([eye, torch.ones(kinds, 1)], 1)])
    with warnings.catch_warnings():  # "sparse CSR support is in beta": sparse.mm on CPU CSR is what we need
        warnings.simplefilter("ignore", UserWarning)
        adjacency = torch.sparse_coo_tensor(torch.stack([dst, types * n + src]), torch.ones(len(src)),
                                            (n, 2 * kinds * n)).coalesce().to_sparse_csr()

    def aggregate(h, w_edge, b_edge):
        members, _, hidden = h.shape
        table = torch.baddbmm(b_edge, embeddings_in.expand(members, -1, -1), w_edge)  # [M, types, H]
        # node-major, so that the per-type messages come out as the [types * n, M * H] the product needs
        # without a copy: one copy of h instead of one of all its messages
        by_node = h.transpose(0, 1).reshape(n, members * hidden)
        per_type = (by_node.unsqueeze(0) + table.transpose(0, 1).reshape(2 * kinds, 1, members * hidden)).relu_()
        summed = torch.sparse.mm(adjacency, per_type.view(2 * kinds * n, members * hidden))
        return summed.view(n, members, hidden).transpose(0, 1)
    return aggregate
