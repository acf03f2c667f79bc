"""The service's steps, as LitServe names them: setup (load_predictor), decode_request, predict, encode_response.
The HTTP app, the CLI and the plan search answer through them.

    from serve.api import load_predictor, predict
    predictor = load_predictor("models:/plansight@champion")      # or a path to a saved predictor.pt
    predict(predictor, PredictRequest(workload=..., cluster=..., plans=[...]))
"""

from __future__ import annotations

import numpy as np

from collect.schema import RunSpec
from gnn.inference.predictor import POINT_COLUMNS, BatchPredictor
from gnn.inference.probe import MachineCorrection, fit_correction, load_probe, probe_path
from gnn.tracking.model_cache import load_model
from gnn.tracking.shipped import CHAMPION_URI, local_store, register_shipped
from serve.schemas import PlanPrediction, PredictRequest, PredictResponse

PROBE_CACHE = 16  # probes' corrections kept per predictor


def load_predictor(source: str) -> BatchPredictor:
    """Setup: a saved predictor.pt, or any MLflow model URI (models:/name@alias, models:/name/3, runs:/id/model).

    Without a usable champion in the embedded store (a fresh clone), the champion shipped in models/champion is
    registered there first, if it reads this code's features (gnn.tracking.shipped); never into a team server."""
    try:
        return load_model(source)
    except ValueError:
        if source != CHAMPION_URI or not local_store() or not register_shipped():
            raise
    return load_model(source)


def decode_request(request: PredictRequest) -> tuple[list[RunSpec], str]:
    """The plans as run specs, and the hardware they run on."""
    return request.specs(), request.cluster.hardware_name()


def encode_response(
    predictor: BatchPredictor,
    columns: dict[str, np.ndarray],
    correction: MachineCorrection | None = None,
    world_size: int = 1,
    pricing: str | None = None,
    calibration: str | None = None,
) -> PredictResponse:
    probe = correction.summary(world_size) if correction else None
    summary, found = model_summary(predictor), predictions(columns)
    return PredictResponse(
        model=summary, predictions=found, probe=probe, compute_pricing=pricing, calibration=calibration
    )


def compute_pricing(request: PredictRequest, specs: list[RunSpec]) -> str:
    """What the simulator priced this request's compute from (PredictResponse.compute_pricing)."""
    record = request.cluster.record
    if record.get("source") != "datasheet":
        return f"the block profile of fingerprint {record['id']!r}, measured on the machine"
    table = (record.get("kernels") or {}).get("table")
    if not table:
        return f"the datasheet of {record['id']!r}: no kernel table was measured on this GPU"
    mla = "; MLA's attention core from the datasheet" if any(s.workload.mla for s in specs) else ""
    return f"kernel table {table!r}, measured on this GPU (data/hardware/kernels){mla}"


def predict(predictor: BatchPredictor, request: PredictRequest, should_stop=None) -> PredictResponse:
    """A request answered: decode, predict (the batched path, gnn.inference), correct by the request's probe if
    it names one, encode. ``should_stop``: asked between chunks (BatchPredictor.predict_columns)."""
    specs, hardware = decode_request(request)
    columns = predictor.predict_columns(specs, hardware, should_stop=should_stop)
    pricing, calibration = compute_pricing(request, specs), predictor.calibration(request.cluster.record)
    if not request.probe:
        return encode_response(predictor, columns, pricing=pricing, calibration=calibration)
    correction, world_size = probe_correction(predictor, request.probe), request.cluster.world_size
    corrected = correction.apply(columns, world_size)
    return encode_response(predictor, corrected, correction, world_size, pricing, calibration)


def probe_correction(predictor: BatchPredictor, name: str) -> MachineCorrection:
    """A probe's correction for this predictor, fitted once per probe file's state (a probe may still be growing)."""
    path = probe_path(name)
    key = (name, path.stat().st_mtime_ns if path.exists() else 0)
    cache = predictor.__dict__.setdefault("probe_corrections", {})
    if key not in cache:
        if len(cache) >= PROBE_CACHE:
            cache.pop(next(iter(cache)))
        cache[key] = fit_correction(predictor, load_probe(name), name)
    return cache[key]


def predictions(columns: dict[str, np.ndarray]) -> list[PlanPrediction]:
    """BatchPredictor.predict_columns as the service's typed predictions. Column by column: converting each value
    of a row on its own (a dict per row, np.clip per share) cost 40 us a plan, 4x this."""
    values = [columns[k].tolist() for k in POINT_COLUMNS]
    shares = [np.clip(columns[k], 0.0, 1.0).tolist() for k in ("compute_frac", "exposed_frac", "bubble_frac")]
    return [
        PlanPrediction(
            iter_time_s=t,
            iter_time_interval_s=(t_lo, t_hi),
            peak_mem_bytes=m,
            peak_mem_interval_bytes=(m_lo, m_hi),
            fits=bool(fits),
            oom_risk=risk,
            breakdown={"compute": compute, "communication_exposed": exposed, "bubble": bubble},
            extrapolation=extrapolation,
        )
        for t, t_lo, t_hi, m, m_lo, m_hi, fits, risk, compute, exposed, bubble, extrapolation in zip(
            *values, *shares, columns["extrapolation"]
        )
    ]


def model_summary(predictor: BatchPredictor) -> dict:
    return {k: v for k, v in predictor.info.items() if k != "metrics"} | {
        "members": len(predictor.ensemble.members),
        "featurisation_workers_ready": predictor.workers_ready,
    }
