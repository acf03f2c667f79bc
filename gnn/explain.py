"""One plan taken apart, for people choosing it: where each pipeline rank's memory goes at its simulated peak, and
the simulated timeline of its step (gnn.render).

    explain(spec, "h100-80gb") -> {"ranks": [{"rank": 0, "weights": ..., ...}], "timeline_png": b"...", ...}

The breakdown is the execution graph's own accounting (gnn.graph.memory): resident state per rank from its
stages, the gradients its first backward allocates, and the rest of the simulator's peak, which is what the
passes hold at that moment (saved activations, communication buffers, workspace). The service's prediction of
the peak comes from the trained model; this says how the graph splits its simulated peak, not the model's.
"""

from __future__ import annotations

import io

from collect.hardware.records import default_hardware_dir
from collect.schema import RunSpec
from gnn.costs.hardware import hardware_model
from gnn.graph.passes import PassCompiler, shared_compiler
from gnn.render import draw_timeline
from gnn.sim.plan import sampled_counts, simulate_plan
from gnn.sim.simulate import simulate

PARTS = ("weights", "gradients", "optimizer", "buffers", "activations")


def explain(spec: RunSpec, hardware: str, hardware_dir=None) -> dict:
    """The memory breakdown per pipeline rank, the simulated times, and the timeline as PNG bytes."""
    hw = hardware_model(hardware, str(hardware_dir or default_hardware_dir()))
    w, plan, cluster = spec.workload, spec.plan, spec.cluster
    compilers: dict = {}
    graph, sim = simulate_plan(w, plan, cluster, hw, compilers)
    compiler = shared_compiler(compilers, w, plan, cluster, hw)  # the one simulate_plan compiled with
    counts = sampled_counts(plan)
    drawn = f"micro-batches 0-{counts[0] - 1} of {plan.num_microbatches}" if counts else "the whole step"
    png = io.BytesIO()
    # a plan simulated short: sim's times are the full plan's extrapolated, the drawn graph's are its own
    draw_timeline(graph, f"{describe(spec)}: {drawn}", png, simulate(graph) if counts else sim)
    return {
        "ranks": memory_by_rank(spec, compiler, sim.peak_mem_per_rank),
        "capacity_bytes": cluster.memory_bytes,
        "simulated": {
            "iter_time_s": sim.iter_time_s,
            "peak_mem_bytes": sim.peak_mem_bytes,
            "compute_s": sim.compute_s,
            "exposed_comm_s": sim.exposed_comm_s,
            "bubble_s": sim.bubble_s,
        },
        "timeline": drawn,
        "timeline_png": png.getvalue(),
    }


def memory_parts(spec: RunSpec, hardware: str, hardware_dir=None) -> list[dict]:
    """memory_by_rank of the plan simulated, without drawing it (what serve verify sets beside a trace)."""
    hw = hardware_model(hardware, str(hardware_dir or default_hardware_dir()))
    compilers: dict = {}
    _, sim = simulate_plan(spec.workload, spec.plan, spec.cluster, hw, compilers)
    compiler = shared_compiler(compilers, spec.workload, spec.plan, spec.cluster, hw)
    return memory_by_rank(spec, compiler, sim.peak_mem_per_rank)


def memory_by_rank(spec: RunSpec, compiler: PassCompiler, peaks: list[float]) -> list[dict]:
    """Per pipeline rank (holding stages rank, rank + pp, ...): bytes of each of PARTS at its simulated peak."""
    plan, memory = spec.plan, compiler.memory
    out = []
    for rank, peak in enumerate(peaks):
        part = dict.fromkeys(PARTS, 0.0)
        for stage in range(rank, plan.num_stages, plan.pp):
            state = memory.state(stage)
            part["weights"] += state["param"] + state.get("quantised_weights", 0.0)
            part["optimizer"] += state["optimizer"]
            part["buffers"] += state["ddp_buckets"] + memory.fsdp_held_bytes(stage)
            part["gradients"] += memory.grad_bytes(stage) * memory.grads_written_at_gather(stage)
        # what the passes hold at the peak besides the state above: saved activations, gathers, buckets in flight
        part["activations"] = max(peak - sum(part.values()), 0.0)
        stages = list(range(rank, plan.num_stages, plan.pp))
        out.append({"rank": rank, "stages": stages, **part, "peak_bytes": peak})
    return out


def describe(spec: RunSpec) -> str:
    """A plan in a few words: its degrees and the settings that are not the defaults."""
    p = spec.plan
    degrees = [f"{k}{getattr(p, k)}" for k in ("dp", "tp", "pp", "cp", "ep") if (getattr(p, k, 1) or 1) > 1]
    extra = [p.sharding if p.sharding != "none" else "", f"recompute {p.recompute}" if p.recompute != "none" else ""]
    if p.pp > 1:
        extra.append(p.pp_schedule or "")
    return " ".join([*(degrees or ["single rank"]), *filter(None, extra), f"mbs {spec.workload.micro_batch_size}"])
