"""A plan as arrays for the network: its execution graph (x, edge_index, edge_attr), its flat features (u), and
the simulator's outputs. numpy only: the inference path and its workers need neither PyG nor Lightning."""

from __future__ import annotations

import numpy as np

from collect.schema import RunSpec
from gnn.costs.hardware import HardwareModel
from gnn.dataset.features import edge_arrays, node_features, plan_features, sim_features
from gnn.sim.plan import simulate_plan


def featurize_arrays(
    spec: RunSpec, hw: HardwareModel, flags: dict, compilers: dict | None = None, memory_pp_rank: int | None = None
) -> tuple[dict[str, np.ndarray], dict]:
    """A plan's execution graph as arrays (x, edge_index, edge_attr, u), and its flat features and simulator
    outputs. Plain numpy, so it crosses process boundaries as bytes: torch tensors would travel through
    shared-memory handles, one per tensor, which costs more than building the graph. ``compilers``: a pass
    compiler cache for a batch of plans (gnn.sim.plan.simulate_plan). ``memory_pp_rank``: the pipeline rank
    whose peak memory was measured (gnn.dataset.rows.measured_pp_rank), for the simulator's memory feature."""
    graph, sim = simulate_plan(spec.workload, spec.plan, spec.cluster, hw, compilers)
    index, attr = edge_arrays(graph)
    flat = {f"f_{k}": v for k, v in {**plan_features(spec, hw, flags), **sim_features(sim, memory_pp_rank)}.items()}
    arrays = {
        "x": node_features(graph),
        "edge_index": index,
        "edge_attr": attr,
        "u": np.array([list(flat.values())], dtype=np.float32),
    }
    return arrays, {
        **flat,
        "sim_time_s": sim.iter_time_s,
        "sim_mem_bytes": sim.peak_mem_bytes,
        "sim_compute_s": sim.compute_s,
        "sim_comm_s": sim.comm_s,
        "sim_bubble_s": sim.bubble_s,
        "sim_exposed_s": sim.exposed_comm_s,
        "num_nodes": graph.num_nodes,
    }
