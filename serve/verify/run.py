"""Plans verified: each traced under fake tensors, its exact per-stage peak set beside the model's prediction and
the simulator's breakdown of it.

    from serve.verify.run import verify
    verify(predictor, PredictRequest(...), budget_s=300.0) -> VerifyResponse

A trace counts what the collector's own model code allocates on each stage's first rank, at full size, on a fake
world of the plan's size (collect.fake): exact for that code. What only the hardware adds (CUDA's context and
cuBLAS's workspace, the caching allocator's reserve) is added at its median as measured on an H100
(collect.fake.device) to say whether the trace fits; the prediction, a peak allocated, is set beside the trace
itself. NCCL's buffers, the allocator's gaps beyond the median, and another framework's kernels or buffers beyond
the conventions the plan names are not in it. Plans are traced one after another, each stopped at
a multiple of its estimate (serve.verify.cost); the request's later plans are not traced once its budget is spent,
and a trace is killed within half a second when the work is told to stop (gnn.cancel: its client hung up, or the
service is stopping).
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel

from collect.fake.device import UNSEEN, on_device
from collect.fake.sweep import trace_point
from gnn import cancel
from gnn.explain import memory_parts
from gnn.inference.predictor import BatchPredictor
from serve.api import model_summary, predict
from serve.schemas import PlanPrediction, PredictRequest
from serve.verify.cost import plan_timeout, within_budget


class VerifiedPlan(BaseModel):
    prediction: PlanPrediction
    status: Literal["ok", "error", "timeout", "not_run"]
    """ok: traced; error: torch could not trace it (``error`` says what failed); timeout: not traced within its
    time; not_run: the request's budget was spent on the plans before it."""
    error: str | None = None
    traced_peak_bytes: float | None = None
    """The busiest traced rank's peak: exact for the collector's code, without what only the hardware adds."""
    traced_on_gpu_bytes: float | None = None
    """The traced peak with what a GPU adds at the median (RESERVED_OVER_ALLOCATED, OUTSIDE_ALLOCATOR_BYTES): what
    the device would hold, to set beside its memory. The traced peak itself on a CPU cluster."""
    traced_peak_per_stage_bytes: list[float] = []
    """Each pipeline stage's first rank (``traced_ranks``), in stage order."""
    traced_ranks: list[int] = []
    predicted_over_traced: float | None = None
    """The predicted peak over the traced one (both allocated: PlanPrediction.peak_mem_bytes)."""
    within_interval: bool | None = None
    """Whether traced_peak_bytes lies in the prediction's 80% memory interval."""
    traced_fits: bool | None = None
    """traced_on_gpu_bytes within the device's memory."""
    simulated: list[dict] = []
    """The simulator's peak per pipeline rank and its parts (weights, gradients, optimizer, buffers, activations),
    as the explorer draws them (gnn.explain)."""
    estimated_s: float
    wall_s: float | None = None
    trace_cpu_s: float | None = None


class VerifyResponse(BaseModel):
    model: dict
    capacity_bytes: float
    plans: list[VerifiedPlan]
    budget_s: float
    estimated_s: float
    wall_s: float
    unseen: str = UNSEEN
    """What a fake-tensor trace does not count."""


def verify(predictor: BatchPredictor, request: PredictRequest, budget_s: float) -> VerifyResponse:
    """Every plan of ``request`` predicted and traced; VerifyRefused (before any work) if over ``budget_s``."""
    specs, start = request.specs(), time.monotonic()
    estimates = within_budget(specs, budget_s, "this request")
    predicted = predict(predictor, request).predictions
    hardware, plans = request.cluster.hardware_name(), []
    for spec, prediction, estimate in zip(specs, predicted, estimates):
        cancel.check("verifying the plans")
        left = budget_s - (time.monotonic() - start)
        plans.append(_verified(spec, prediction, estimate, left, hardware, predictor.hardware_dir))
    return VerifyResponse(
        model=model_summary(predictor),
        capacity_bytes=request.cluster.cluster().memory_bytes,
        plans=plans,
        budget_s=budget_s,
        estimated_s=sum(estimates),
        wall_s=time.monotonic() - start,
    )


def _verified(spec, prediction: PlanPrediction, estimate: float, left_s: float, hardware, hardware_dir):
    simulated = memory_parts(spec, hardware, hardware_dir)
    if left_s <= 0:
        return VerifiedPlan(prediction=prediction, status="not_run", simulated=simulated, estimated_s=estimate)
    result, extra = trace_point(spec, min(plan_timeout(estimate), max(left_s, 1.0)), cancel.stopping)
    cancel.check("verifying the plans")
    out = VerifiedPlan(
        prediction=prediction,
        status=result.status,
        error=result.error or None,
        simulated=simulated,
        estimated_s=estimate,
        wall_s=result.wall_s,
        trace_cpu_s=extra.get("trace_cpu_s"),
    )
    if result.status != "ok":
        return out
    peaks = [float(p) for p in result.peak_mem_bytes_per_rank]
    peak, (lo, hi) = max(peaks), prediction.peak_mem_interval_bytes
    on_gpu = on_device(peak, spec.cluster.device)
    return out.model_copy(
        update={
            "traced_peak_bytes": peak,
            "traced_on_gpu_bytes": on_gpu,
            "traced_peak_per_stage_bytes": peaks,
            "traced_ranks": extra["traced_ranks"],
            "predicted_over_traced": prediction.peak_mem_bytes / peak if peak > 0 else None,
            "within_interval": lo <= peak <= hi,
            "traced_fits": on_gpu <= spec.cluster.memory_bytes,
        }
    )
