"""An ensemble of surrogates with conformally calibrated prediction intervals.

Members differ only in their seed (initialisation and batch order). The point
prediction is the members' mean in log space; the spread is their standard
deviation. Spread alone is not a calibrated interval (members trained on the
same rows agree more than the data warrants), so a split-conformal factor is
fitted on the validation rows: the interval mean +- k * (spread + floor)
holds the measured value on ``coverage`` of validation rows. k is fitted per
hardware domain, each GPU kind apart: one factor pooled over CPU and CUDA runs
covered 98% of A100 rows and 67% of CPU rows, and one pooled over the CUDA
runs 90% of A100 rows and 54% of H100 rows. A domain with fewer than
MIN_CALIBRATION_ROWS validation rows (or a query that names none) takes the
factor of its device class, CPU or CUDA. Fake traces are a domain of their own
("fake"), pipelined and unpipelined ones apart ("fake/pipelined"), a part with
too few rows taking the factor of every trace (gnn.dataset.splits.calibration_domain).
How often the interval holds on the test rows is the calibration we report.

Out of distribution the members disagree, and their correction of the physics
is then least trustworthy. So each prediction falls back toward its physics
base (memory: the simulator's peak; time: the fitted analytical model) as the
members' spread exceeds what they showed on the validation rows: past its
99th percentile there, the correction is scaled by (limit / spread)^2. On the
rows the model was fitted for nothing changes; held-out strategy families and
world sizes are where it acts. Time's base is far weaker than memory's (25%
against 4% MAPE on the CPU random split), but a correction the members cannot
agree on is worse: on held-out FSDP-full plans they drew 13x and 17x time
predictions without the guard (docs/accuracy.md).

An interval's half-width in log units is k * (spread + floor), the spread capped at that same 99th percentile
(beyond it, disagreement says the correction is not to be trusted, which the fallback acts on, not how wide the
truth may lie), plus the part of the correction the fallback set aside (the disagreement between physics and
correction), plus a widening per doubling outside the training rows. The point and both ends then lie between the
plan's floor and ceiling (gnn.model.intervals.bounds): never zero, never infinite, never beyond what its physics allows.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn

from gnn.dataset.packed import Packed, pack
from gnn.model.fused import forward_members, fusable, physics_offsets
from gnn.model.intervals.bounds import Limits
from gnn.model.intervals.conformal import bounded, domain_rows, factors, fall_back, parent

COVERAGE = 0.8
# nodes per forward pass: enough to amortise its ~40 tensor ops, few enough that a layer's node states stay in
# cache. On the node graphs of old (the demo's 960 plans, 104k nodes), 32 graphs a batch (~3.5k nodes) took
# 1.7 s and 1,024 graphs 3.0 s.
INFERENCE_NODES = 4096
AGGREGATES = ("mean", "median")
DEFAULT_AGGREGATE = "median"
SPREAD_FLOOR = 0.01  # log units: members that agree exactly still leave ~1% of doubt, before calibration
SPREAD_QUANTILE = 0.99  # of the validation rows' member spread: beyond it a correction counts as out of distribution
FALLBACK_TARGETS = (0, 1)  # log time, log memory: the targets that fall back toward their physics base
# below this many validation rows a domain's 80% quantile is one of its few largest scores: its device class's
# factor is steadier
MIN_CALIBRATION_ROWS = 20
# no interval reaches beyond e^20 (~5e8) times its point, whatever a model without calibrated limits says: exp()
# of it stays finite
MAX_HALF_WIDTH = 20.0
# per target: the output's point, low and high names, and the summary's log point and spread
TARGETS = (
    ("iter_time_s", "iter_time_lo_s", "iter_time_hi_s", "log_time", "time_spread"),
    ("peak_mem_bytes", "peak_mem_lo_bytes", "peak_mem_hi_bytes", "log_mem", "mem_spread"),
)


class Ensemble(nn.Module):
    def __init__(
        self,
        members: list[nn.Module],
        coverage: float = COVERAGE,
        class_column: int | None = None,
        aggregate: str = DEFAULT_AGGREGATE,
        domain_names: list[str] | None = None,
        range_names: list[str] | None = None,
    ):
        super().__init__()
        if aggregate not in AGGREGATES:
            raise ValueError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}")
        self.members = nn.ModuleList(members)
        self.coverage = coverage
        # the point prediction from the members' log outputs: their median (the default: robust to one member far
        # off, which happens out of distribution and even on validation rows: on b200/held_out_gpu's, one of three
        # members said e^184 times the time of the others on NeMo's 405B runs), or their mean (gnn_mean)
        self.aggregate = aggregate
        self.class_column = class_column  # graph feature that is 1 on CUDA devices (f_cuda): the device class
        self.register_buffer("k", torch.ones(2, 2))  # conformal factor [device class: CPU, CUDA][log time, log memory]
        # the hardware domains (cpu, a100, h100, ...) with a factor of their own, [domain][log time, log memory]
        self.domain_names = list(domain_names or [])
        self.register_buffer("k_domain", torch.full((len(self.domain_names), 2), float("nan")))
        # member spread [device class][log time, log memory] beyond which the correction fades toward the physics base
        self.register_buffer("spread_limit", torch.full((2, 2), float("inf")))
        # the doubt left where members agree, [device class][log time, log memory]: the median error on the
        # calibration rows (members trained on the same rows agree more than the truth does), at least SPREAD_FLOOR
        self.register_buffer("spread_floor", torch.full((2, 2), SPREAD_FLOOR))
        # [beyond the largest scale, beyond the largest model][log time, log memory]: whether the members' correction
        # is kept there, as nested checks at training found it beat the physics (gnn.predictors.nested)
        self.register_buffer("keeps_correction", torch.ones(2, 2, dtype=torch.bool))
        # [device class][tau, tau_ws, sigma]: how far sittings of one machine moved its times (log units): all plans,
        # a world size's, and each plan's own; the prior a probe's correction starts from (gnn.inference.probe); NaN
        # where the data had no sittings
        self.register_buffer("machine_shift", torch.full((2, 3), float("nan")))
        # each plan's floor, ceiling and distance from the training rows (gnn.model.intervals.bounds), per range domain
        self.limits = Limits(_feature_names(members), range_names)

    @torch.inference_mode()
    def raw(self, graphs, batch_nodes: int = INFERENCE_NODES) -> tuple[np.ndarray, ...]:
        """[members, n, 3] (every member's log time, log memory, oom logit), each graph's device class (0 CPU,
        1 CUDA), [n, 2] the physics base the members correct (log time, log memory), and [n, m] the flat features
        the limits read (gnn.model.intervals.bounds)."""
        # batches packed directly: a DataLoader costs ~2 ms per call, the whole forward of one small graph
        fused = fusable(self.members)
        if not fused:
            from torch_geometric.data import Batch  # lazy: unfused training modules only; loaded models fuse
        parts = []
        for start, stop in _batches([g.x.shape[0] for g in graphs], batch_nodes):
            chunk = [graphs[i] for i in range(start, stop)]
            parts.append(self._raw_batch(pack(chunk) if fused else Batch.from_data_list(chunk), fused))
        if not parts:
            empty = self.limits.columns(torch.zeros(0, 0))
            return np.zeros((len(self.members), 0, 3)), np.zeros(0, dtype=int), np.zeros((0, 2)), empty
        outs, classes, bases, cols = zip(*parts)
        return np.concatenate(outs, axis=1), np.concatenate(classes), np.concatenate(bases), np.concatenate(cols)

    @torch.inference_mode()
    def raw_packed(self, batch: Packed) -> tuple[np.ndarray, ...]:
        """raw() of graphs already joined into one (gnn.dataset.packed.Packed), as featurisation workers send them."""
        fused = fusable(self.members)
        if not fused:
            from torch_geometric.data import Batch  # lazy: unfused training modules only; loaded models fuse
        return self._raw_batch(batch if fused else Batch.from_data_list(batch.graphs()), fused)

    def _raw_batch(self, batch, fused: bool) -> tuple[np.ndarray, ...]:
        if fused:
            physics = physics_offsets(self.members, batch.u)  # once: the forward pass adds the same
            out, base = forward_members(self.members, batch, physics), physics[..., :2].mean(0)
        else:
            out, base = torch.stack([m(batch) for m in self.members]), self._physics(batch.u)
        col = self.class_column
        classes = (batch.u[:, col] > 0.5).long() if col is not None else torch.zeros(batch.num_graphs).long()
        return out.numpy(), classes.numpy(), base.numpy(), self.limits.columns(batch.u)

    def _physics(self, u: torch.Tensor) -> torch.Tensor:
        """[n, 2] the members' physics base (log time, log memory), averaged (members fitted on the same rows
        share it)."""
        models = [getattr(m, "model", None) for m in self.members]
        if any(model is None or not hasattr(model, "physics_offset") for model in models):
            return torch.full((u.shape[0], 2), float("nan"))
        return torch.stack([model.physics_offset(u * m.u_mask)[:, :2] for m, model in zip(self.members, models)]).mean(
            0
        )

    def summarize(
        self, raw: np.ndarray, base: np.ndarray | None = None, classes: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """Log point predictions and the spreads their intervals scale, and ``set_aside``: per target, how much of
        the members' correction the fallback did not apply (0 where they agree as on the validation rows)."""
        point, spread = self._point_and_spread(raw)
        set_aside = np.zeros((point.shape[0], 2))
        if base is not None and classes is not None:
            limit = self.spread_limit.numpy()[classes]
            agreed = point.copy()
            for j in FALLBACK_TARGETS:
                point[:, j] = fall_back(agreed[:, j], spread[:, j], base[:, j], limit[:, j])
                set_aside[:, j] = np.abs(agreed[:, j] - point[:, j])
            spread = np.concatenate([np.minimum(spread[:, :2], limit), spread[:, 2:]], 1)
        spread = spread[:, :2] + (self.spread_floor.numpy()[classes] if classes is not None else SPREAD_FLOOR)
        return {
            "log_time": point[:, 0],
            "log_mem": point[:, 1],
            "time_spread": spread[:, 0],
            "mem_spread": spread[:, 1],
            "set_aside": set_aside,
            "oom_prob": 1 / (1 + np.exp(-np.clip(point[:, 2], -50, 50))),
        }

    def predict(
        self, graphs, batch_nodes: int = INFERENCE_NODES, domains: list[str] | None = None, calibrated_as=None
    ) -> dict[str, np.ndarray]:
        """Point predictions and interval bounds (seconds, bytes), in graph order. ``domains``: each graph's
        hardware domain (cpu, a100, ...), whose ranges and interval factor apply; None: its device class's.
        ``calibrated_as``: per graph, the calibration domain whose interval factor applies instead ("fake" for a
        fake trace: gnn.dataset.splits.scored_domain)."""
        return self._outputs(*self.raw(graphs, batch_nodes), domains, calibrated_as)

    def predict_packed(self, batch: Packed, domains: list[str] | None = None, calibrated_as=None) -> dict:
        """predict() of graphs already joined into one (gnn.dataset.packed.Packed)."""
        return self._outputs(*self.raw_packed(batch), domains, calibrated_as)

    def interval_factors(self, classes: np.ndarray, domains: list[str] | None = None) -> np.ndarray:
        """[n, 2] the conformal factor of each graph: its domain's where calibrated, else its parent domain's (that of
        "fake/pipelined" is "fake"), else its device class's."""
        k = self.k.numpy()
        k = k[classes] if k.ndim == 2 else np.broadcast_to(k, (len(classes), 2))  # 1-D: one shared factor
        if domains is None or not self.domain_names:
            return k
        index = {name: i for i, name in enumerate(self.domain_names)}
        own = self.k_domain.numpy()
        found = [next((index[n] for n in (d, parent(d)) if n in index), None) for d in domains]
        return np.array([k[i] if j is None else own[j] for i, j in enumerate(found)]).reshape(-1, 2)

    def _outputs(self, raw, classes, base, cols, domains=None, calibrated_as=None) -> dict[str, np.ndarray]:
        floor, ceiling = self.limits.limits(cols, classes, base[:, 0])
        s = self.summarize(bounded(raw, floor, ceiling, base), base, classes)
        self._physics_beyond(s, base, self.limits.beyond_largest(cols, domains))
        k = self.interval_factors(classes, domains if calibrated_as is None else calibrated_as)
        widen = self.limits.widen.numpy()[classes] * self.limits.distance(cols, domains)
        out = {"oom_prob": s["oom_prob"]}
        for j, (name, lo, hi, log, spread) in enumerate(TARGETS):
            half = np.minimum(k[:, j] * s[spread] + s["set_aside"][:, j] + widen[:, j], MAX_HALF_WIDTH)
            point = np.clip(s[log], floor[:, j], ceiling[:, j])
            out[name] = np.exp(point)
            out[lo] = np.exp(np.clip(point - half, floor[:, j], point))
            out[hi] = np.exp(np.clip(point + half, point, ceiling[:, j]))
        return out

    def _physics_beyond(self, s: dict, base: np.ndarray, beyond: np.ndarray) -> None:
        """Beyond a range where the nested checks found the correction did not carry, the physics base is the
        point (in ``s``, in place), and the correction set aside widens its interval."""
        keeps = self.keeps_correction.numpy()
        for j, log in ((0, "log_time"), (1, "log_mem")):
            gated = (beyond[:, :, j] & ~keeps[:, j]).any(1) & np.isfinite(base[:, j])
            s["set_aside"][:, j] += np.where(gated, np.abs(s[log] - base[:, j]), 0.0)
            s[log] = np.where(gated, base[:, j], s[log])

    def calibrate(self, graphs, log_time: np.ndarray, log_mem: np.ndarray, domains: list[str] | None = None) -> None:
        """Fit, per device class on held-out (validation) graphs with their measured log targets: the spread beyond
        which memory falls back toward physics, then the conformal factor k of the intervals around that; and,
        given each graph's calibration domain (its hardware's, or "fake/..." for a fake trace, whose peak has no
        measurement's noise), k per domain with at least MIN_CALIBRATION_ROWS rows: "fake" on every trace's."""
        raw, classes, base, cols = self.raw(graphs)
        self.limits.fit_ceiling(cols, classes, base[:, 0], log_time, log_mem)
        raw = bounded(raw, *self.limits.limits(cols, classes, base[:, 0]), base)
        s = self._calibrate_classes(raw, classes, base, log_time, log_mem)
        names = np.asarray(domains if domains is not None else [], dtype=object)
        rows = domain_rows(names)
        kept = sorted(d for d, of in rows.items() if of.sum() >= MIN_CALIBRATION_ROWS)
        own = [np.array(factors(s, log_time, log_mem, rows[d], self.coverage)) for d in kept]
        # a target the domain's rows never measured (vTrain's A100 rows: memory) keeps its device class's factor
        of_class = [self.k.numpy()[classes[rows[d]][0]] for d in kept]
        self.domain_names = kept
        self.k_domain = torch.tensor(
            np.array([np.where(np.isnan(k), c, k) for k, c in zip(own, of_class)]).reshape(-1, 2), dtype=torch.float32
        )

    def _point_and_spread(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The members' combined log outputs and how far apart they are: median and median absolute deviation
        (one member far off moves neither), or mean and standard deviation."""
        if self.aggregate == "median":
            point = np.median(raw, 0)
            return point, np.median(np.abs(raw - point), 0)
        return raw.mean(0), raw.std(0)

    def _calibrate_classes(self, raw, classes, base, log_time, log_mem) -> dict[str, np.ndarray]:
        """Spread limits and conformal factors per device class; returns the summary the factors were fitted on."""
        point, spread = self._point_and_spread(raw)
        limit, floor = np.full((2, 2), np.inf), np.full((2, 2), SPREAD_FLOOR)
        truth = np.column_stack([log_time, log_mem])
        for c in (0, 1):
            if (classes == c).any():
                limit[c] = np.quantile(spread[classes == c, :2], SPREAD_QUANTILE, axis=0)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # a target no row of the class measured
                    typical = np.nanmedian(np.abs(truth - point[:, :2])[classes == c], axis=0)
                floor[c] = np.fmax(typical, SPREAD_FLOOR)
        self.spread_limit.copy_(torch.tensor(limit, dtype=torch.float32))
        self.spread_floor.copy_(torch.tensor(floor, dtype=torch.float32))
        s = self.summarize(raw, base, classes)
        k = np.array([factors(s, log_time, log_mem, classes == c, self.coverage) for c in (0, 1)])
        # a device class without validation rows (or without measured memory) takes the widest factor seen
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: no memory measured anywhere
            widest = np.nanmax(k, axis=0)
        k = np.where(np.isnan(k), np.where(np.isnan(widest), 1.0, widest), k)
        self.k.copy_(torch.tensor(k, dtype=torch.float32))
        return s


def _feature_names(members: list[nn.Module]) -> list[str] | None:
    """The flat feature names the members were trained on (their config), if they say."""
    for m in members:
        if m.config.get("feature_names"):
            return list(m.config["feature_names"])
    return None


def _batches(sizes: list[int], max_nodes: int) -> list[tuple[int, int]]:
    """Consecutive [start, stop) ranges of graphs with at most max_nodes nodes each (or one larger graph)."""
    bounds, start, nodes = [], 0, 0
    for i, n in enumerate(sizes):
        if i > start and nodes + n > max_nodes:
            bounds.append((start, i))
            start, nodes = i, 0
        nodes += n
    return bounds + ([(start, len(sizes))] if start < len(sizes) else [])
