"""How fast error grows outside the training rows, measured inside them: nested leave-a-group-out checks.

Within a split's training rows, each hardware domain's largest scale (world size) and largest model (parameters)
are held out in turn; the network's physics base (gnn.predictors.baselines: the analytical model for time, the
simulator's peak for memory) is fitted on the rest of the device class's rows and scored on the held-out group,
whose distance outside the rest's range (gnn.model.intervals.bounds.Limits) is known. The growth of the 80th
percentile of its log error from inside the range to the held-out group, per doubling of distance, is how much an
interval widens per doubling (gnn.model.ensemble). The base stands in for the network here because it is fitted
in milliseconds, so every check is cheap; it is what the network corrects, and its error out of range is the part
the correction cannot be trusted to remove.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from gnn.dataset.rows import has_time
from gnn.model.intervals.bounds import Limits
from gnn.predictors.baselines import AnalyticalPredictor, SimulatorPredictor

TARGET_COLUMNS = ("iter_time_s", "peak_mem_bytes")
HELD_OUT = ("world_size", "f_log_params")  # the largest scale, the largest model: what a planner extrapolates
MIN_ROWS = 10  # a group (or what is left to fit on) smaller than this says nothing about growth
COVERAGE = 0.8


def widening(
    rows: pd.DataFrame, limits: Limits, feature_names: list[str], scored: pd.Series | None = None
) -> np.ndarray:
    """[device class][time, memory]: log units of widening per doubling outside the training range (0 where no
    check could be made, or the error did not grow). ``scored``: the rows whose error growth is measured (held
    out in groups, and the inside error taken over the rest of them; every row if None), the physics base being
    fitted on every other row of their device class: fake traces apart from measured runs."""
    out = np.zeros((2, 2))
    classes = (rows["f_cuda"] > 0.5).astype(int).to_numpy()
    scored = pd.Series(True, index=rows.index) if scored is None else scored
    for c in (0, 1):
        own = rows[classes == c]
        checks = [check for check in _checks(own, scored.loc[own.index], limits, feature_names) if check is not None]
        for j in (0, 1):
            found = [(e[j], d[j]) for e, d in checks if np.isfinite(e[j]) and d[j] > 0]
            if found:
                excess, distance = np.array(found).T
                out[c, j] = max(0.0, float(excess.sum() / distance.sum()))  # growth per doubling, pooled
    return out


def _checks(rows: pd.DataFrame, scored: pd.Series, limits: Limits, names: list[str]):
    for domain, group in rows[scored].groupby("domain"):
        for column in HELD_OUT:
            held = group[column] >= group[column].max() - 1e-9
            if held.sum() >= MIN_ROWS and (~held).sum() >= MIN_ROWS:
                fit = rows.drop(index=group.index[held])
                yield _check(fit, scored.loc[fit.index], group[held], limits, names, str(domain))


def _check(fit: pd.DataFrame, scored: pd.Series, held: pd.DataFrame, limits: Limits, names: list[str], domain: str):
    """(growth of the 80% log error per target from inside the fit (its ``scored`` rows) to the held-out group, the
    held-out rows' median distance per target), or None where the group lies inside the rest's range."""
    inner = Limits(names)
    inner.fit_ranges(_columns(fit, inner, names), fit["domain"].astype(str).tolist(), measured(fit))
    distance = np.median(inner.distance(_columns(held, inner, names), [domain] * len(held)), axis=0)
    if (distance <= 0).all():
        return None
    bases = AnalyticalPredictor().fit(fit), SimulatorPredictor().fit(fit)
    inside, outside = (_predict(bases, rows) for rows in (fit[scored], held))
    excess = [
        _quantile(outside[p], held[t]) - _quantile(inside[p], fit.loc[scored, t])
        for p, t in (("pred_time_s", "iter_time_s"), ("pred_mem_bytes", "peak_mem_bytes"))
    ]
    return np.array(excess), distance


def _predict(bases: tuple, rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` predicted by the network's physics base per target (``bases``: fitted predictors of
    gnn.predictors.baselines): the analytical model's time, the simulator's peak (scaled, with an offset) for memory."""
    time, memory = (base.predict(rows)[column] for base, column in zip(bases, ("pred_time_s", "pred_mem_bytes")))
    return pd.DataFrame({"pred_time_s": time, "pred_mem_bytes": memory})


def measured(rows: pd.DataFrame) -> np.ndarray:
    """[n, time / memory] which rows a target's training range is taken over: time over the rows that measured it,
    memory over all (a fake trace extends memory's range, never time's; vTrain's rows, without memory, are still
    the plans memory is predicted for)."""
    return np.column_stack([has_time(rows).to_numpy(), np.ones(len(rows), dtype=bool)])


def _quantile(pred: pd.Series, truth: pd.Series) -> float:
    """The 80th percentile of |log(pred / truth)| over rows where both are known (NaN if fewer than MIN_ROWS)."""
    p, t = pred.to_numpy(dtype=float), truth.to_numpy(dtype=float)
    ok = np.isfinite(p) & np.isfinite(t) & (p > 0) & (t > 0)
    return float(np.quantile(np.abs(np.log(p[ok] / t[ok])), COVERAGE)) if ok.sum() >= MIN_ROWS else np.nan


def _columns(rows: pd.DataFrame, limits: Limits, names: list[str]) -> np.ndarray:
    return limits.columns(torch.tensor(rows[names].to_numpy(dtype=np.float32)))


def correction_gates(ds, parts: dict, fit_member) -> np.ndarray:
    """[check (scale, size)][target (time, memory)]: whether the network's correction carries beyond the largest
    scale and the largest model of the training rows. Per check and target, one member is trained without each
    domain's largest group of the rows its range is taken over (``measured``; ``fit_member(ds, parts)``,
    gnn.predictors.surrogate.fit; one member serves both targets where their groups are the same rows) and scored
    on it against its physics base (time: the fitted analytical model, memory: the simulator): the correction is
    kept where it beats the base there (median |log error|), else a plan beyond that range is predicted by its
    physics. Memory's largest group may be fake traces (gnn.dataset.rows.fake_as_gpu_rows), time's never is."""
    from gnn.model.ensemble import Ensemble  # lazy: the ensemble imports this package's neighbours

    keeps = np.ones((len(HELD_OUT), 2), dtype=bool)
    meta, members = ds.meta, {}
    ranged = pd.DataFrame(measured(meta), index=meta.index)  # the rows each target's range is taken over
    for c, column in enumerate(HELD_OUT):
        for j, target in enumerate(TARGET_COLUMNS):
            train = meta.loc[parts["train"]]
            largest = _largest(train[ranged.loc[train.index, j]], column)
            if not largest:
                continue
            held, val = (_at_largest(meta.loc[parts[k]], column, largest) for k in ("train", "val"))
            if (key := (held.tobytes(), val.tobytes())) not in members:
                inner = {"train": np.setdiff1d(parts["train"], held), "val": np.setdiff1d(parts["val"], val)}
                members[key] = fit_member(ds, inner)
            raw, _, base, _ = Ensemble([members[key]]).raw(ds[torch.as_tensor(held)])
            truth = np.log(meta.loc[held, target].to_numpy(dtype=float))
            ok = np.isfinite(truth) & np.isfinite(base[:, j])
            if ok.sum() >= MIN_ROWS:
                gnn, physics = (np.median(np.abs(x[ok] - truth[ok])) for x in (raw[0, :, j], base[:, j]))
                keeps[c, j] = gnn < physics
    return keeps


def _largest(rows: pd.DataFrame, column: str) -> dict[str, float]:
    """Each domain's largest ``column`` where at least MIN_ROWS rows lie there and MIN_ROWS below."""
    out = {}
    for domain, group in rows.groupby("domain"):
        held = group[column] >= group[column].max() - 1e-9
        if held.sum() >= MIN_ROWS and (~held).sum() >= MIN_ROWS:
            out[str(domain)] = float(group[column].max())
    return out


def _at_largest(rows: pd.DataFrame, column: str, largest: dict[str, float]) -> np.ndarray:
    """Index of the rows at (or beyond) their domain's largest ``column``."""
    limit = rows["domain"].astype(str).map(largest)
    return rows.index[(rows[column] >= limit - 1e-9).fillna(False).to_numpy()].to_numpy().copy()
