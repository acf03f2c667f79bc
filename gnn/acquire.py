"""Active collection's surrogate, and the command that runs an active sweep with it.

    python -m gnn.acquire collect/sweeps/active-cpu.yaml [--out data/runs] [--hardware data/hardware] [--limit N]
    torchrun --nproc_per_node 8 ... -m gnn.acquire SWEEP.yaml     # on a GPU cluster: rank 0 chooses, all measure

The sweep YAML is collect's, with ``sampler: active`` and a budget (collect.sweep.SweepSpec); collect.active
keeps the loop's account and chooses by it. The surrogate is an ensemble of gradient-boosted trees that corrects
the physics simulator's time (log measured - log simulated) from the plan's flat features, each member fitted on
a bootstrap of the measured plans; its spread is the members' standard deviation. Trees rather than the GNN:
a sweep refits after every batch, and on 2 cores a tree ensemble refits in about a second where the GNN takes
minutes; the replay over measured pools (experiments.active.replay) uses the same ensemble.
"""

from __future__ import annotations

import argparse

import numpy as np

from collect.inputs import run_reporting_errors
from collect.launch.run import SweepRunner
from collect.launch.torchrun import run_under_torchrun, under_torchrun
from collect.schema import RunSpec
from collect.sweep import SweepSpec
from gnn.costs.hardware import hardware_model
from gnn.dataset.featurize import featurize_arrays
from gnn.predictors.base import PLAN_FEATURES_PREFIX

MEMBERS = 4


class ResidualTrees:
    """Bootstrap ensemble of trees predicting log(measured / simulated) time from plan features."""

    def __init__(self, members: int = MEMBERS, seed: int = 0):
        self.members, self.seed = members, seed
        self.models: list = []

    def fit(self, x: np.ndarray, residual: np.ndarray, rng: np.random.Generator) -> "ResidualTrees":
        # lazy: only fits need sklearn (~1.4 s to import)
        from sklearn.ensemble import HistGradientBoostingRegressor

        self.models = []
        for m in range(self.members):
            sample = rng.choice(len(x), size=len(x), replace=True)
            model = HistGradientBoostingRegressor(
                max_iter=100, learning_rate=0.1, min_samples_leaf=5, random_state=self.seed + m
            )
            self.models.append(model.fit(x[sample], residual[sample]))
        return self

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean, spread) of the predicted residual of each row."""
        preds = np.array([model.predict(x) for model in self.models])
        return preds.mean(0), preds.std(0)


class PlanSurrogate:
    """collect.active.TimeModel over plans priced on one hardware record: the simulator's log time corrected by
    ResidualTrees. Each plan is featurised once (execution graph and simulation) and kept."""

    def __init__(self, hardware: str, hardware_dir: str = "data/hardware", seed: int = 0):
        self.hw = hardware_model(hardware, hardware_dir)
        self.trees = ResidualTrees(seed=seed)
        self.rng = np.random.default_rng(seed)
        self.cache: dict[str, tuple[np.ndarray, float]] = {}

    def _features(self, points: list[RunSpec]) -> tuple[np.ndarray, np.ndarray]:
        for p in points:
            if p.run_id not in self.cache:
                _, flat = featurize_arrays(p, self.hw, {})
                x = np.array([v for k, v in sorted(flat.items()) if k.startswith(PLAN_FEATURES_PREFIX)], float)
                self.cache[p.run_id] = (x, float(np.log(flat["sim_time_s"])))
        rows = [self.cache[p.run_id] for p in points]
        return np.array([x for x, _ in rows]), np.array([b for _, b in rows])

    def fit(self, points: list[RunSpec], log_times: np.ndarray) -> None:
        x, base = self._features(points)
        self.trees.fit(x, np.asarray(log_times, float) - base, self.rng)

    def predict(self, points: list[RunSpec]) -> tuple[np.ndarray, np.ndarray]:
        x, base = self._features(points)
        mean, spread = self.trees.predict(x)
        return base + mean, spread


def run_sweep(args) -> None:
    spec = SweepSpec.from_yaml(args.sweep)

    def surrogate(hardware: str) -> PlanSurrogate:
        return PlanSurrogate(args.hardware_name or hardware, args.hardware, seed=spec.seed)

    if under_torchrun():  # GPU clusters: torchrun made the ranks, this process is one of them
        counts = run_under_torchrun(spec, args.out, args.limit, surrogate=surrogate)
    else:
        counts = SweepRunner(spec, args.out, args.hardware, surrogate=surrogate).run(limit=args.limit)
    if counts is not None:
        print(f"{spec.name}: {counts}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gnn.acquire", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", help="a sweep YAML with sampler: active")
    parser.add_argument("--out", default="data/runs")
    parser.add_argument("--hardware", default="data/hardware")
    parser.add_argument("--limit", type=int, default=None, help="measure at most N more plans")
    parser.add_argument(
        "--hardware-name",
        default=None,
        help="the hardware record plans are priced on (default: the sweep's fingerprint; under torchrun its "
        "device_kind, a preset such as h100-80gb)",
    )
    run_reporting_errors(run_sweep, parser.parse_args(argv))


if __name__ == "__main__":
    main()
