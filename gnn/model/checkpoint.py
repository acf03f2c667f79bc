"""A saved model is weights plus a JSON description, never pickled code.

    save(path, ensemble, info)      # torch.save of tensors and strings only
    ensemble, info = load(path)     # torch.load(weights_only=True), rebuilt from the description

The description holds what rebuilds the network (each member's constructor
arguments: dimensions, feature names, physics columns) and the ensemble's
settings; the state dict holds everything learned or fitted (weights, input
normalisation, the analytical base's coefficients, calibration factors and
fallback limits). A file is data: loading one runs no code from it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gnn.model.ensemble import Ensemble
from gnn.model.member import Member

FORMAT = 1


def describe(ensemble: Ensemble) -> dict:
    members = [dict(m.config) for m in ensemble.members]
    return {
        "format": FORMAT,
        "members": [_plain(m) for m in members],
        "ensemble": {
            "coverage": ensemble.coverage,
            "class_column": ensemble.class_column,
            "domain_names": ensemble.domain_names,
            "range_names": ensemble.limits.domain_names,
            "aggregate": ensemble.aggregate,
        },
    }


def build(description: dict) -> Ensemble:
    return Ensemble([Member(**m) for m in description["members"]], **description["ensemble"])


def save(path: str | Path, ensemble: Ensemble, info: dict) -> None:
    torch.save(
        {
            "format": FORMAT,
            "description": json.dumps(describe(ensemble)),
            "info": json.dumps(_plain(info)),
            "state_dict": ensemble.state_dict(),
        },
        path,
    )


# what calibration fits after training (Ensemble.calibrate, gnn.predictors.surrogate.calibrate_ensemble): a model
# loaded to be calibrated again may lack those its code did not have yet
CALIBRATION = ("k", "k_domain", "spread_limit", "spread_floor", "keeps_correction", "limits.")
# buffers a model trained before them may lack, read at their defaults: a model without a sittings prior takes a
# probe's runs at their own mean (gnn.inference.probe)
OPTIONAL = ("machine_shift",)


def load(path: str | Path, recalibrate: bool = False) -> tuple[Ensemble, dict]:
    """``recalibrate``: the caller calibrates the model again (make evaluate's cached models), so calibration
    buffers it lacks keep their defaults; any other missing or unknown weight is still an error."""
    try:
        blob = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same answer
        raise ValueError(
            f"{path}: not a plansight model ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
            "models saved as pickled modules are no longer read: train again (make train)"
        ) from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise ValueError(f"{path}: not a plansight model of format {FORMAT}")
    try:
        ensemble = build(json.loads(blob["description"]))
        ranges = blob["state_dict"].get("limits.ranges")
        if ranges is not None and ranges.ndim == 3:  # a model of one range for both targets (before fake traces)
            blob["state_dict"]["limits.ranges"] = ranges[:, None].expand(-1, 2, -1, -1).clone()
        missing, unexpected = ensemble.load_state_dict(blob["state_dict"], strict=False)
        lacking = [k for k in missing if not k.startswith(OPTIONAL)]
        stray = [k for k in lacking if not (recalibrate and k.startswith(CALIBRATION))] + list(unexpected)
        if stray:
            raise RuntimeError(f"missing or unexpected weights: {', '.join(stray[:5])}")
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        # a model saved by other code: its features, physics terms or layers are not this code's
        raise ValueError(
            f"{path}: a plansight model from another version of the code, which this one cannot rebuild "
            f"({type(e).__name__}: {str(e).splitlines()[0][:200]}); train it again on this code (make train)"
        ) from None
    return ensemble.eval(), json.loads(blob["info"])


def _plain(value):
    """JSON-ready: tuples as lists, numpy scalars as Python numbers."""
    return json.loads(json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else list(v)))
