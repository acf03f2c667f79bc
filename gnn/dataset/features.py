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

from collect.schema import FAMILIES, PIPELINE_SCHEDULES, RECOMPUTES, SHARDINGS, RunSpec
from collect.schema.choices import BLOCK_SCALED, gemm_rate_key
from gnn.costs.analytic import analytic_peak_bytes, dtype_bytes
from gnn.costs.hardware import HardwareModel
from gnn.graph.build import ExecGraph
from gnn.graph.table import COL, EDGE_KINDS, KINDS, PASS_PHASES, PHASES
from gnn.sim.simulate import SimResult

SCHEDULES = (None, *PIPELINE_SCHEDULES)  # None: no pipeline
# The GNN's nodes are passes (gnn.graph.build.PassView). A pass's blocks and collectives become its features: the
# estimated time of each kind of block, what it computes, moves and allocates, and where it sits in the schedule.
KIND_TIMES = tuple(f"log_{k}_us" for k in KINDS)
# Kind times come last: the compiled _pass_rows (numba caches it by its own file) takes their positions as an
# argument, so a kind added to gnn.graph.table moves none of the positions it holds as constants.
NODE_FEATURES = (
    tuple(f"pass_{p}" for p in PASS_PHASES)
    + ("first_stage", "last_stage")
    + (
        "log_recompute_us",
        "log_layers",
        "log_mflops",
        "log_message_kb",
        "log2_group",
        "crosses_node",
        "log_alloc_mb",
        "log_free_mb",
        "log_transient_mb",
        "log_nodes",
        "stage_frac",
        "microbatch_frac",
    )
    + KIND_TIMES
)
NODE_DIM = len(NODE_FEATURES)
# the analytical cost model's estimates among them: what the no-physics ablation hides
PHYSICS_NODE_FEATURES = KIND_TIMES + ("log_recompute_us",)
EDGE_DIM = len(EDGE_KINDS)
_RECOMPUTE = PHASES.index("recompute")
_LAST_BLOCK = KINDS.index("mlp")  # embed, attn, mlp: the blocks whose count is the stage's layers
_FEATURE_INDEX = {name: i for i, name in enumerate(NODE_FEATURES)}


def node_features(g: ExecGraph) -> np.ndarray:
    """[passes, NODE_DIM]: per pass, sums over its rows (maxima for the layer count, group size, node crossing
    and transients, which do not add up along a pass), then logs where magnitudes span decades."""
    view = g.passes
    x = np.zeros((len(view.start), NODE_DIM))
    _pass_rows(
        x,
        _KIND_TIME_INDEX,
        g.table,
        np.append(view.start, len(g.table)),
        view.phase,
        g.plan.num_stages,
        g.plan.num_microbatches,
    )
    x[:, _LOG1P_INDEX] = np.log1p(x[:, _LOG1P_INDEX])
    return x.astype(np.float32)


_K, _PHASE, _TIME, _FLOPS, _COUNT, _MESSAGE, _GROUP, _CROSSES, _ALLOC, _FREE, _TRANSIENT, _STAGE, _MICROBATCH = (
    COL[c]
    for c in (
        "kind",
        "phase",
        "est_time",
        "flops",
        "count",
        "message_bytes",
        "group",
        "crosses_node",
        "alloc_bytes",
        "free_bytes",
        "transient_bytes",
        "stage",
        "microbatch",
    )
)
# the features _pass_rows fills, by position: each kind's time, then these sums, maxima and positions
_KIND_TIME_INDEX = np.array([_FEATURE_INDEX[f] for f in KIND_TIMES])
(
    _RECOMPUTE_US,
    _MFLOPS,
    _MESSAGE_KB,
    _ALLOC_MB,
    _FREE_MB,
    _LAYERS,
    _GROUP_LOG2,
    _CROSSES_NODE,
    _TRANSIENT_MB,
    _FIRST,
    _LAST,
    _NODES,
    _STAGE_FRAC,
    _MICROBATCH_FRAC,
) = (
    _FEATURE_INDEX[f]
    for f in (
        "log_recompute_us",
        "log_mflops",
        "log_message_kb",
        "log_alloc_mb",
        "log_free_mb",
        "log_layers",
        "log2_group",
        "crosses_node",
        "log_transient_mb",
        "first_stage",
        "last_stage",
        "log_nodes",
        "stage_frac",
        "microbatch_frac",
    )
)
_LOG1P_INDEX = np.array(
    [*_KIND_TIME_INDEX, _RECOMPUTE_US, _MFLOPS, _MESSAGE_KB, _ALLOC_MB, _FREE_MB, _LAYERS, _TRANSIENT_MB, _NODES]
)


@njit(cache=True, nogil=True)
def _pass_rows(
    x: np.ndarray,
    kind_time_index: np.ndarray,
    t: np.ndarray,
    bounds: np.ndarray,
    phase: np.ndarray,
    num_stages: int,
    num_microbatches: int,
) -> None:
    """Fills x, [passes, NODE_DIM] float64 zeros, before the logs: for pass p (rows bounds[p] to bounds[p + 1])
    its phase, the sums of each kind's time (us, at kind_time_index), recompute time, MFLOP, KB moved, MB
    allocated and freed, the maxima of the layer count, log2 group, node crossing and transient MB, its stage's
    role and place, its micro-batch's place and its row count. One loop in row order, where numpy took ~50 calls
    per graph."""
    for p in range(len(bounds) - 1):
        row = x[p]
        row[phase[p]] = 1.0
        for i in range(bounds[p], bounds[p + 1]):
            kind, time = int(t[i, _K]), t[i, _TIME] * 1e6
            row[kind_time_index[kind]] += time
            row[_RECOMPUTE_US] += time if t[i, _PHASE] == _RECOMPUTE else 0.0
            row[_MFLOPS] += t[i, _FLOPS] / 1e6
            row[_MESSAGE_KB] += t[i, _COUNT] * t[i, _MESSAGE] / 1e3
            row[_ALLOC_MB] += t[i, _ALLOC] / 1e6
            row[_FREE_MB] += t[i, _FREE] / 1e6
            row[_LAYERS] = max(row[_LAYERS], t[i, _COUNT] if kind <= _LAST_BLOCK else 0.0)
            row[_GROUP_LOG2] = max(row[_GROUP_LOG2], np.log2(t[i, _GROUP]))
            row[_CROSSES_NODE] = max(row[_CROSSES_NODE], t[i, _CROSSES])
            row[_TRANSIENT_MB] = max(row[_TRANSIENT_MB], t[i, _TRANSIENT] / 1e6)
        first = bounds[p]
        stage = t[first, _STAGE]
        row[_FIRST] = 1.0 if stage == 0 else 0.0
        row[_LAST] = 1.0 if stage == num_stages - 1 else 0.0
        row[_NODES] = bounds[p + 1] - first
        row[_STAGE_FRAC] = stage / num_stages
        row[_MICROBATCH_FRAC] = max(t[first, _MICROBATCH], -1.0) / num_microbatches


def edge_arrays(g: ExecGraph) -> tuple[np.ndarray, np.ndarray]:
    """The pass graph's edges and their one-hot kinds."""
    kinds = g.passes.edge_kind
    attr = np.zeros((len(kinds), EDGE_DIM), dtype=np.float32)
    attr[np.arange(len(kinds)), kinds] = 1
    return g.passes.edge_index, attr


def plan_features(spec: RunSpec, hw: HardwareModel, flags: dict) -> dict[str, float]:
    """Flat plan, workload and hardware features (the tabular baseline's input)."""
    w, p = spec.workload, spec.plan
    f = {name: math.log2(getattr(p, k)) for name, k in _LOG2_DEGREES}
    f.update({name: float(p.sharding == s) for name, s in _SHARDING_NAMES})
    f.update({name: float(p.recompute == r) for name, r in _RECOMPUTE_NAMES})
    f.update({name: float(p.pp_schedule == s) for name, s in _SCHEDULE_NAMES})
    f["sequence_parallel"] = float(p.sequence_parallel)
    f["float8_all_gather"] = float(p.float8_all_gather)
    f["tp_layer_latency"] = float(p.tp_layer_latency)  # a convention priced only by the fitted time models
    # tensor parallelism's collectives wait in each layer's critical path unless the framework overlaps them with its
    # GEMMs (plan.tp_comm_overlap): priced, as the convention above, only by the fitted time models
    f["tp_exposed"] = float(not p.tp_comm_overlap)
    f["log2_etp"] = math.log2(p.expert_tp) if w.family == "moe" else 0.0
    f["bf16_moments"] = float(p.optimizer_state_dtype == "bfloat16")
    f.update(_setting_features(w, spec.cluster, hw))
    f["log_analytic_mem"] = math.log(analytic_peak_bytes(w, p))
    f.update({k: float(v) for k, v in flags.items()})
    return f


_LOG2_DEGREES = tuple((f"log2_{k}", k) for k in ("dp", "cp", "ep", "tp", "pp", "virtual_stages", "num_microbatches"))
_SHARDING_NAMES = tuple((f"sharding_{s}", s) for s in SHARDINGS)
_RECOMPUTE_NAMES = tuple((f"recompute_{r}", r) for r in RECOMPUTES)
_SCHEDULE_NAMES = tuple((f"schedule_{s}", s) for s in SCHEDULES)
_SETTINGS: dict[tuple, dict[str, float]] = {}


def _setting_features(w, cluster, hw: HardwareModel) -> dict[str, float]:
    """The workload's, cluster's and hardware's features: the same for every plan of a search, so computed once
    per setting (bounded: a process sees few)."""
    key = (w, cluster, hw)  # the hardware model by identity
    found = _SETTINGS.get(key)
    if found is None:
        if len(_SETTINGS) >= 256:
            _SETTINGS.clear()
        found = _SETTINGS[key] = {
            "log_mbs": math.log2(w.micro_batch_size),
            "log_layers": math.log(w.layers),
            "log_hidden": math.log(w.hidden),
            "log_heads": math.log(w.heads),
            "log_seq": math.log(w.seq_len),
            "log_vocab": math.log(w.vocab),
            "dtype_bytes": dtype_bytes(w),
            "log_params": math.log(w.num_params),
            "log_active_params": math.log(w.active_params),
            **{f"family_{name}": float(w.family == name) for name in FAMILIES},
            "log_query_per_kv": math.log(w.heads / w.n_kv_heads),
            "log_ffn_ratio": math.log(max(w.dense_ffn, 1) / w.hidden),
            "log_experts": math.log(w.experts or 1),
            "log_top_k": math.log(w.top_k or 1),
            "float8": float(w.float8 != "none"),
            # how much faster the GEMMs' format runs than the dtype: continuous, so a format never trained on
            # (NVFP4 from MXFP8 and BF16) is placed by its datasheet rate rather than by a flag no row set
            "log_gemm_speedup": _gemm_speedup(w, hw),
            "block_scaled": float(w.float8 in BLOCK_SCALED),
            "mla": float(w.mla),
            "windowed_share": w.sliding_layers / w.layers,
            "log_world": math.log2(cluster.world_size),
            "log_capacity": math.log(cluster.memory_bytes),
            "cuda": float(cluster.device == "cuda"),
            "log_flops_per_s": math.log(hw.compute_time(1.0, w.dtype) ** -1),
            "log_mem_bw": math.log(hw.memory_bandwidth),
            # compute priced from a kernel table measured on the GPU, not from its datasheet: the two err
            # differently, so a correction learned on one must not be read as the other's
            "kernel_table": float(hw.kernels is not None and hw.kernels.table is not None),
        }
    return found


def _gemm_speedup(w, hw: HardwareModel) -> float:
    key = gemm_rate_key(w.float8)
    rate = hw.flops_per_s.get(key) if key else None
    return math.log(rate * hw.compute_time(1.0, w.dtype)) if rate else 0.0


def sim_features(sim: SimResult, memory_pp_rank: int | None = None) -> dict[str, float]:
    """``memory_pp_rank``: the pipeline rank whose peak a row measured (rows.measured_pp_rank); None: the largest."""
    mem = sim.peak_mem_bytes if memory_pp_rank is None else sim.peak_mem_per_rank[memory_pp_rank]
    return {
        "log_sim_time": math.log(sim.iter_time_s),
        "log_sim_mem": math.log(mem),
        "log_sim_compute": math.log(sim.compute_s + 1e-9),
        "log_sim_comm": math.log(sim.comm_s + 1e-9),
        "log_sim_exposed": math.log(sim.exposed_comm_s + 1e-9),
    }
