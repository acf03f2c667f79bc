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
from gnn.graph import COL, COLUMNS, EDGE_KINDS, KINDS, PHASES, ExecGraph
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
    t, n = g.table, g.num_nodes
    x = np.zeros((n, NODE_DIM), dtype=np.float32)
    rows = np.arange(n)
    x[rows, t[:, COL["kind"]].astype(np.int64)] = 1
    x[rows, len(KINDS) + t[:, COL["phase"]].astype(np.int64)] = 1
    base = len(KINDS) + len(PHASES)
    column = {name: t[:, COL[name]] for name in COLUMNS}
    for i, value in ((0, column["count"]), (1, column["flops"] / 1e6), (2, column["message_bytes"] / 1e3),
                     (5, column["alloc_bytes"] / 1e6), (6, column["free_bytes"] / 1e6),
                     (7, column["transient_bytes"] / 1e6), (8, column["est_time"] * 1e6)):
        x[:, base + i] = np.log1p(np.maximum(value, 0.0))
    x[:, base + 3] = np.log2(column["group"])
    x[:, base + 4] = column["crosses_node"]
    x[:, base + 9] = column["stage"] / g.plan.num_stages
    x[:, base + 10] = np.maximum(column["microbatch"], -1) / g.plan.num_microbatches
    x[:, base + 11] = column["stream"]
    return x


def edge_arrays(g: ExecGraph) -> tuple[np.ndarray, np.ndarray]:
    attr = np.zeros((len(g.edge_kind), EDGE_DIM), dtype=np.float32)
    attr[np.arange(len(g.edge_kind)), g.edge_kind] = 1
    return g.edge_index, attr


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
