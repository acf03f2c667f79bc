"""Numeric features of an execution graph: per node, per edge and per graph.

Everything is on log scales where magnitudes span decades. Graph-level
features carry the plan degrees, the workload shape, the hardware and the
simulator's own estimates, so a learned model can correct the physics rather
than learn it.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from collect.schema import RunSpec
from gnn.costs import analytic_peak_bytes, dtype_bytes
from gnn.graph import COL, COLUMNS, EDGE_KINDS, KINDS, PASS_PHASES, PHASES, ExecGraph
from gnn.hardware_model import HardwareModel
from gnn.simulate import SimResult

SHARDINGS = ("none", "zero1", "fsdp_grad_op", "fsdp_full")
RECOMPUTES = ("none", "selective", "full")
SCHEDULES = (None, "gpipe", "1f1b", "interleaved_1f1b")
# The GNN's nodes are passes (gnn.graph.PassView). A pass's blocks and collectives become its features: the
# estimated time of each kind of block, what it computes, moves and allocates, and where it sits in the schedule.
KIND_TIMES = tuple(f"log_{k}_us" for k in KINDS)
NODE_FEATURES = (tuple(f"pass_{p}" for p in PASS_PHASES) + ("first_stage", "last_stage") + KIND_TIMES
                 + ("log_recompute_us", "log_layers", "log_mflops", "log_message_kb", "log2_group", "crosses_node",
                    "log_alloc_mb", "log_free_mb", "log_transient_mb", "log_nodes", "stage_frac", "microbatch_frac"))
NODE_DIM = len(NODE_FEATURES)
# the analytical cost model's estimates among them: what the no-physics ablation hides
PHYSICS_NODE_FEATURES = KIND_TIMES + ("log_recompute_us",)
EDGE_DIM = len(EDGE_KINDS)
_RECOMPUTE = PHASES.index("recompute")
_LAST_BLOCK = KINDS.index("mlp")  # embed, attn, mlp: the blocks whose count is the stage's layers
_FEATURE_INDEX = {name: i for i, name in enumerate(NODE_FEATURES)}
# the columns _pass_totals sums, in its order: each kind's time, then these
_SUMMED_INDEX = np.array([_FEATURE_INDEX[f] for f in KIND_TIMES + (
    "log_recompute_us", "log_mflops", "log_message_kb", "log_alloc_mb", "log_free_mb")])


def node_features(g: ExecGraph) -> np.ndarray:
    """[passes, NODE_DIM]: per pass, sums over its rows (maxima for the layer count, group size, node crossing
    and transients, which do not add up along a pass)."""
    t, view = g.table, g.passes
    start, n = view.start, len(t)
    summed, largest = _pass_totals(t, np.append(start, n))
    x = np.zeros((len(start), NODE_DIM), dtype=np.float32)
    x[np.arange(len(start)), view.phase] = 1
    x[:, _SUMMED_INDEX] = np.log1p(summed)
    placed = t[start]
    stage = placed[:, COL["stage"]]
    for name, values in (("log_layers", np.log1p(largest[:, 0])), ("log2_group", largest[:, 1]),
                         ("crosses_node", largest[:, 2]), ("log_transient_mb", np.log1p(largest[:, 3])),
                         ("first_stage", stage == 0), ("last_stage", stage == g.plan.num_stages - 1),
                         ("log_nodes", np.log1p(np.diff(np.append(start, n)))), ("stage_frac", stage / g.plan.num_stages),
                         ("microbatch_frac", np.maximum(placed[:, COL["microbatch"]], -1) / g.plan.num_microbatches)):
        x[:, _FEATURE_INDEX[name]] = values
    return x


_K, _PHASE, _TIME, _FLOPS, _COUNT, _MESSAGE, _GROUP, _CROSSES, _ALLOC, _FREE, _TRANSIENT = (
    COL[c] for c in ("kind", "phase", "est_time", "flops", "count", "message_bytes", "group", "crosses_node",
                     "alloc_bytes", "free_bytes", "transient_bytes"))


@njit(cache=True)
def _pass_totals(t: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per pass (rows bounds[p] to bounds[p + 1]): the sums of _SUMMED_INDEX's quantities (each kind's time,
    recompute time, MFLOP, KB moved, MB allocated and freed), and the maxima of the layer count, log2 group,
    node crossing and transient MB. One loop in row order, where numpy took ~40 calls."""
    passes, kinds = len(bounds) - 1, len(KINDS)
    summed, largest = np.zeros((passes, kinds + 5)), np.zeros((passes, 4))
    for p in range(passes):
        for i in range(bounds[p], bounds[p + 1]):
            kind, time = int(t[i, _K]), t[i, _TIME] * 1e6
            row = summed[p]
            row[kind] += time
            row[kinds] += time if t[i, _PHASE] == _RECOMPUTE else 0.0
            row[kinds + 1] += t[i, _FLOPS] / 1e6
            row[kinds + 2] += t[i, _COUNT] * t[i, _MESSAGE] / 1e3
            row[kinds + 3] += t[i, _ALLOC] / 1e6
            row[kinds + 4] += t[i, _FREE] / 1e6
            top = largest[p]
            top[0] = max(top[0], t[i, _COUNT] if kind <= _LAST_BLOCK else 0.0)
            top[1] = max(top[1], np.log2(t[i, _GROUP]))
            top[2] = max(top[2], t[i, _CROSSES])
            top[3] = max(top[3], t[i, _TRANSIENT] / 1e6)
    return summed, largest


def edge_arrays(g: ExecGraph) -> tuple[np.ndarray, np.ndarray]:
    """The pass graph's edges and their one-hot kinds."""
    kinds = g.passes.edge_kind
    attr = np.zeros((len(kinds), EDGE_DIM), dtype=np.float32)
    attr[np.arange(len(kinds)), kinds] = 1
    return g.passes.edge_index, attr


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
