"""The model registry and its champion policy: every model trained on the serving split is registered as a version,
and made champion only if it beats the champion on the validation selection metric, re-scored under the current
features when they changed.
"""

from __future__ import annotations

import mlflow

from gnn.inference.predictor import BatchPredictor
from gnn.tracking.model_cache import cached_copy
from gnn.tracking.scoring import ensemble_records, selection_value

MODEL_NAME = "plansight"
CHAMPION = "champion"
FEATURES = "feature_version"  # a version's tag: the dataset and graph code it was scored under (its metric's meaning)
SETTLE_READS = 20  # each read either finds the alias settled or moves it to a better version: few are needed


def champion_selection_now(ds, parts: dict, split: str) -> float | None:
    """The champion's validation selection metric under the current data and graph code (inf if it cannot read
    the current graphs).

    The recorded metric holds only while the features are computed as they were when the champion was
    trained (``feature_version``, the dataset's cache key over data and graph code). After a change to the
    graph code the champion is scored again on the same validation rows, so the comparison is like for like.
    """
    client = mlflow.MlflowClient()
    try:
        version = client.get_model_version_by_alias(MODEL_NAME, CHAMPION)
    except mlflow.exceptions.MlflowException:
        return None
    try:  # a copy is kept after the first time (build/models), so this costs little
        champion = load_registered(f"models:/{MODEL_NAME}@{CHAMPION}", f"{version.source}@{version.run_id}")
    except ValueError:  # saved as pickled modules, before models were weights: unreadable now, so replaced
        print(f"champion (version {version.version}) is in a format this code no longer reads; a new model replaces it")
        return float("inf")
    run = client.get_run(version.run_id)
    if run.data.params.get("feature_version") == ds.key:
        return run.data.metrics.get("val_selection")
    if _input_dims(champion.ensemble) != (ds.num_node_features, ds[0].u.shape[1]):
        # the graph's format changed (other features): this code can neither score nor serve it, so any model wins
        print(f"champion (version {version.version}) reads another graph format; a new model replaces it")
        return float("inf")
    records, _ = ensemble_records(champion.ensemble, ds, parts, split, which=("val",))
    value = selection_value(records)
    print(
        f"champion (version {version.version}) re-scored under the current features: {value:.4f} "
        f"(recorded {run.data.metrics.get('val_selection', float('nan')):.4f})"
    )
    return value


def load_registered(uri: str, resolved: str | None = None):
    """The BatchPredictor of a logged model (models:/name@alias, models:/name/N, runs:/id/model), from its artifacts:
    the weights file is loaded with weights_only and the pyfunc's pickle is never read. The artifacts are copied
    once into build/models/<resolved> (``resolved``: what the URI names now, e.g. the logged model id of the
    alias's version), so asking again costs no copy."""
    local = cached_copy(uri, resolved)
    return BatchPredictor.load(local / "artifacts" / "predictor.pt", local / "artifacts" / "hardware")


def _input_dims(ensemble) -> tuple[int, int]:
    model = ensemble.members[0].model
    return model.node_norm.mean.numel(), model.global_norm.mean.numel()


def register(
    model_uri: str, metric: str, value: float, feature_version: str, allow_equal: bool = False,
    current: float | None = None,
) -> bool:  # fmt: skip
    """Register the model as a new version, whatever its score, and make it champion if it beats the champion
    (lower is better). Returns whether it is the champion once the alias settled.

    Trainings may register at once (several processes on one tracking server): each, after registering, points
    the alias at the best version it can see and reads again until what it reads agrees with the alias, so the
    last to look leaves it on the best of all (a rival that registers later settles it again itself). Versions
    compete on their recorded ``metric`` when their features are this one's (``feature_version``); the champion
    the training started with, at ``current`` (its value re-scored under these features, else its record).
    ``allow_equal``: a re-calibrated copy of the champion (same predictions, new intervals) may replace it.
    """
    client = mlflow.MlflowClient()
    start = _champion(client)
    if current is None and start is not None:
        current = client.get_run(start.run_id).data.metrics.get(metric)
    tags = {metric: repr(float(value)), FEATURES: feature_version}
    mine = str(mlflow.register_model(model_uri, MODEL_NAME, tags=tags).version)  # an int or a str, by store
    for _ in range(SETTLE_READS):
        champion = _champion(client)
        held = None if champion is None else str(champion.version)
        scores = {
            str(v.version): float(v.tags[metric])
            for v in client.search_model_versions(f"name='{MODEL_NAME}'")
            if v.tags.get(FEATURES) == feature_version and metric in v.tags
        }
        if held is not None and held not in scores:
            scores[held] = float("inf") if current is None else current
        incumbent = mine if allow_equal else held
        best = min(scores, key=lambda v: (scores[v], v != incumbent, int(v)))
        if best == held:
            return best == mine
        try:
            client.set_registered_model_alias(MODEL_NAME, CHAMPION, best)
        except mlflow.exceptions.MlflowException:
            # a rival set it first: a server inserts an alias it has not seen, and two first inserts collide
            # (PostgreSQL's unique key); the next read sees the rival's and settles from there
            continue
    raise RuntimeError(f"the {CHAMPION} alias of {MODEL_NAME} kept moving over {SETTLE_READS} reads")


def unreadable_champion(client: mlflow.MlflowClient) -> float | None:
    """inf where the registered champion is one this code cannot load (any model replaces it); None where there is
    none, or it loads (its recorded metric stands)."""
    version = _champion(client)
    if version is None:
        return None
    try:
        load_registered(f"models:/{MODEL_NAME}@{CHAMPION}", f"{version.source}@{version.run_id}")
    except ValueError:
        return float("inf")
    return None


def _champion(client: mlflow.MlflowClient):
    try:
        return client.get_model_version_by_alias(MODEL_NAME, CHAMPION)
    except mlflow.exceptions.MlflowException:
        return None
