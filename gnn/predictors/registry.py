"""Every predictor by name: the baselines and the GNN surrogate, each behind gnn.predictors.base's fit/predict.

REGISTRY["gbt"]().fit(train_rows).predict(rows)
REGISTRY["gnn"](ds, cfg).fit(train_rows, val_rows).predict(rows)
"""

from __future__ import annotations

from gnn.predictors.base import Predictor
from gnn.predictors.baselines import (
    AnalyticalPredictor,
    GBTPredictor,
    MegatronMemoryPredictor,
    PhysicsPredictor,
    RuleOfThumbPredictor,
    SimulatorPredictor,
)
from gnn.predictors.surrogate import GNNPredictor

BASELINES: tuple[type[Predictor], ...] = (
    RuleOfThumbPredictor,
    MegatronMemoryPredictor,
    AnalyticalPredictor,
    PhysicsPredictor,
    SimulatorPredictor,
    GBTPredictor,
)
REGISTRY: dict[str, type[Predictor]] = {cls.name: cls for cls in (*BASELINES, GNNPredictor)}
BASELINE_NAMES = tuple(cls.name for cls in BASELINES)
