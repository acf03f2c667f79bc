"""Numeric features of an execution graph: per node, per edge and per graph.

Everything is on log scales where magnitudes span decades. Graph-level
features carry the plan degrees, the workload shape, the hardware and the
simulator's own estimates, so a learned model can correct the physics rather
than learn it.
"""
from __future__ import annotations

import math

import numpy as np

from collect.schema import RunSpec
from gnn.costs import analytic_peak_bytes, dtype_bytes
from gnn.graph import EDGE_KINDS, KINDS, PHASES, ExecGraph
from gnn.hardware_model import HardwareModel
from gnn.simulate import SimResult

SHARDINGS = ("none", "zero1", "fsdp_grad_op", "fsdp_full")
RECOMPUTES = ("none", "selective", "full")
SCHEDULES = (None, "gpipe", "1f1b", "interleaved_1f1b")
NUMERIC_NODE_FEATURES = ("log_count", "log_mflops", "log_message_kb", "log2_group", "crosses_node", "log_alloc_mb",
                         "log_free_mb", "log_transient_mb", "log_est_time_us", "stage_frac", "microbatch_frac", "stream")
NODE_FEATURES = tuple(f"kind_{k}" for k in KINDS) + tuple(f"phase_{p}" for p in PHASES) + NUMERIC_NODE_FEATURES
NODE_DIM = len(NODE_FEATURES)
EDGE_DIM = len(EDGE_KINDS)


def node_features(g: ExecGraph) -> np.ndarray:
    num_stages, nmb = g.plan.num_stages, g.plan.num_microbatches
    kind_index = {k: i for i, k in enumerate(KINDS)}
    phase_index = {p: len(KINDS) + i for i, p in enumerate(PHASES)}
    n = len(g.nodes)
    x = np.zeros((n, NODE_DIM), dtype=np.float32)
    rows = np.arange(n)
    x[rows, [kind_index[node.kind] for node in g.nodes]] = 1
    x[rows, [phase_index[node.phase] for node in g.nodes]] = 1
    raw = np.array([(node.count, node.flops / 1e6, node.message_bytes / 1e3, node.group, node.crosses_node,
                     node.alloc_bytes / 1e6, node.free_bytes / 1e6, node.transient_bytes / 1e6, node.est_time * 1e6,
                     node.stage, node.microbatch, node.stream) for node in g.nodes], dtype=np.float64).reshape(n, 12)
    logged = np.log1p(np.maximum(raw[:, [0, 1, 2, 5, 6, 7, 8]], 0.0))
    base = len(KINDS) + len(PHASES)
    x[:, base + np.array([0, 1, 2, 5, 6, 7, 8])] = logged
    x[:, base + 3] = np.log2(raw[:, 3])
    x[:, base + 4] = raw[:, 4]
    x[:, base + 9] = raw[:, 9] / num_stages
    x[:, base + 10] = np.maximum(raw[:, 10], -1) / nmb
    x[:, base + 11] = raw[:, 11]
    return x


def edge_arrays(g: ExecGraph) -> tuple[np.ndarray, np.ndarray]:
    index = np.array([(s, d) for s, d, _ in g.edges], dtype=np.int64).T.reshape(2, -1)
    kinds = np.array([EDGE_KINDS.index(k) for _, _, k in g.edges], dtype=np.int64)
    attr = np.zeros((len(g.edges), EDGE_DIM), dtype=np.float32)
    attr[np.arange(len(kinds)), kinds] = 1
    return index, attr


def plan_features(spec: RunSpec, hw: HardwareModel, flags: dict) -> dict[str, float]:
    """Flat plan, workload and hardware features (the tabular baseline's input)."""
    w, p, c = spec.workload, spec.plan, spec.cluster
    f = {f"log2_{k}": math.log2(getattr(p, k)) for k in ("dp", "tp", "pp", "virtual_stages", "num_microbatches")}
    f.update({f"sharding_{s}": float(p.sharding == s) for s in SHARDINGS})
    f.update({f"recompute_{r}": float(p.recompute == r) for r in RECOMPUTES})
    f.update({f"schedule_{s}": float(p.pp_schedule == s) for s in SCHEDULES})
    f.update({"sequence_parallel": float(p.sequence_parallel), "log_mbs": math.log2(w.micro_batch_size),
              "log_layers": math.log(w.layers), "log_hidden": math.log(w.hidden), "log_heads": math.log(w.heads),
              "log_seq": math.log(w.seq_len), "log_vocab": math.log(w.vocab), "dtype_bytes": dtype_bytes(w),
              "log_params": math.log(w.num_params), "log_world": math.log2(c.world_size),
              "log_capacity": math.log(c.memory_bytes), "cuda": float(c.device == "cuda"),
              "log_flops_per_s": math.log(hw.compute_time(1.0, w.dtype) ** -1),
              "log_mem_bw": math.log(hw.memory_bandwidth),
              "log_analytic_mem": math.log(analytic_peak_bytes(w, p))})
    f.update({k: float(v) for k, v in flags.items()})
    return f


def sim_features(sim: SimResult) -> dict[str, float]:
    return {"log_sim_time": math.log(sim.iter_time_s), "log_sim_mem": math.log(sim.peak_mem_bytes),
            "log_sim_compute": math.log(sim.compute_s + 1e-9), "log_sim_comm": math.log(sim.comm_s + 1e-9),
            "log_sim_exposed": math.log(sim.exposed_comm_s + 1e-9)}
