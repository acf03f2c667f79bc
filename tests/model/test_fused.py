"""The fused ensemble forward equals running the members one by one."""

import numpy as np
import pytest
import torch
from torch import nn
from torch_geometric.data import Batch

from gnn.model.fused import forward_members, fusable
from gnn.predictors.surrogate import TrainConfig, build_module


def members(dataset, **config) -> nn.ModuleList:
    cfg = TrainConfig(**{"hidden": 16, "num_layers": 2, **config})
    train_idx = np.arange(0, len(dataset), 3)
    out = []
    for seed in range(3):
        torch.manual_seed(seed)
        out.append(build_module(dataset, cfg, train_idx).eval())
    return nn.ModuleList(out)


def one_by_one(ms, batch) -> torch.Tensor:
    return torch.stack([m(batch) for m in ms])


@pytest.mark.parametrize(
    "config", [{}, {"physics": False}, {"time_base": "simulator"}], ids=["analytical", "no_physics", "simulator"]
)
def test_fused_forward_matches_the_members(vtrain_dataset, config):
    ms = members(vtrain_dataset, **config)
    assert fusable(ms)
    with torch.inference_mode():
        for graphs in ([vtrain_dataset[0]], [vtrain_dataset[i] for i in range(0, 200, 5)]):
            batch = Batch.from_data_list(graphs)
            torch.testing.assert_close(forward_members(ms, batch), one_by_one(ms, batch), rtol=1e-5, atol=1e-5)


def test_a_changed_weight_is_picked_up_and_training_mode_is_not_fused(vtrain_dataset):
    ms = members(vtrain_dataset)
    batch = Batch.from_data_list([vtrain_dataset[i] for i in range(8)])
    with torch.inference_mode():
        before = forward_members(ms, batch)
    with torch.no_grad():
        ms[1].model.convs[0].nn.lins[0].weight.mul_(2.0)  # in place: the cached stack must notice
    with torch.inference_mode():
        after = forward_members(ms, batch)
        torch.testing.assert_close(after, one_by_one(ms, batch), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(before[1], after[1]) and torch.equal(before[0], after[0])
    ms[0].train()
    assert not fusable(ms)


def test_typed_aggregation_equals_the_edge_by_edge_sum(vtrain_dataset):
    from gnn.model.fused import _edge_aggregation, _typed_aggregation

    batch = Batch.from_data_list([vtrain_dataset[i] for i in range(0, 60, 3)])
    torch.manual_seed(0)
    h, w_edge, b_edge = (
        torch.randn(3, batch.num_nodes, 8),
        torch.randn(3, batch.edge_attr.shape[1] + 1, 8),
        torch.randn(3, 1, 8),
    )
    typed = _typed_aggregation(batch)
    assert typed is not None
    torch.testing.assert_close(
        typed(h, w_edge, b_edge), _edge_aggregation(batch)(h, w_edge, b_edge), rtol=1e-5, atol=1e-5
    )
    # an edge given twice sends its message twice in both
    batch.edge_index = torch.cat([batch.edge_index, batch.edge_index[:, :7]], 1)
    batch.edge_attr = torch.cat([batch.edge_attr, batch.edge_attr[:7]])
    torch.testing.assert_close(
        _typed_aggregation(batch)(h, w_edge, b_edge), _edge_aggregation(batch)(h, w_edge, b_edge), rtol=1e-5, atol=1e-5
    )
    batch.edge_attr = batch.edge_attr * 0.5  # not one-hot: only the edge-by-edge sum applies
    assert _typed_aggregation(batch) is None


def test_inference_batches_cut_by_nodes_and_agree_with_one_batch(vtrain_dataset):
    from gnn.model.ensemble import Ensemble, _batches

    assert _batches([3, 3, 3, 10, 1], 6) == [(0, 2), (2, 3), (3, 4), (4, 5)]  # a graph over budget goes alone
    assert _batches([], 6) == []
    ensemble = Ensemble(list(members(vtrain_dataset))).eval()
    graphs = [vtrain_dataset[i] for i in range(40)]
    small, whole = ensemble.raw(graphs, batch_nodes=50), ensemble.raw(graphs, batch_nodes=10**6)
    for a, b in zip(small, whole):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_packed_graphs_split_back_into_the_graphs_they_join(vtrain_dataset):
    from gnn.dataset.packed import pack

    graphs = [vtrain_dataset[i] for i in (0, 7, 3, 11)]
    for graph, back in zip(graphs, pack(graphs).graphs(), strict=True):
        for key in ("x", "edge_index", "edge_attr", "u"):
            assert torch.equal(graph[key], back[key]), key


def test_the_names_the_forward_pass_reads_are_the_networks_own(vtrain_dataset):
    """gnn.model.fused reads PlanGNN's tensors by state-dict name: every one of them, and nothing else but the
    physics base and the input masks."""
    from gnn.model.fused import weight_names

    for layers in (1, 2):
        (member,) = members(vtrain_dataset, num_layers=layers)[:1]
        held = {k for k in member.state_dict() if not k.startswith("model.time_base.")} - {"x_mask", "u_mask"}
        assert held == set(weight_names(layers))


def test_a_saved_member_serves_the_training_modules_own_answer(vtrain_dataset, tmp_path):
    """Saved and loaded, a member holds the same tensors under the same names and answers as its training module;
    a file lacking one of them is refused as another version's."""
    from gnn.model import checkpoint
    from gnn.model.ensemble import Ensemble

    trained = Ensemble(list(members(vtrain_dataset))).eval()
    checkpoint.save(tmp_path / "m.pt", trained, {})
    loaded, _ = checkpoint.load(tmp_path / "m.pt")
    assert set(loaded.state_dict()) == set(trained.state_dict())
    batch = Batch.from_data_list([vtrain_dataset[i] for i in range(0, 40, 4)])
    with torch.inference_mode():
        torch.testing.assert_close(
            forward_members(loaded.members, batch), one_by_one(trained.members, batch), rtol=1e-5, atol=1e-5
        )
    blob = torch.load(tmp_path / "m.pt", weights_only=True)
    del blob["state_dict"]["members.1.model.convs.0.lin.weight"]
    torch.save(blob, tmp_path / "lacking.pt")
    with pytest.raises(ValueError, match="another version of the code"):
        checkpoint.load(tmp_path / "lacking.pt")
