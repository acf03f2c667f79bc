"""plansight as an MLflow pyfunc model: one row per plan in, predictions out.

Logged with every training run, so the registered model serves with MLflow's
own tooling as well as ours::

    mlflow models serve -m models:/plansight@champion --env-manager local

Input columns are the plan-row fields of data/runs (workload, plan, cluster),
with ``hardware`` naming a preset (a100-80gb, ...) or a measured fingerprint
id shipped with the model. Output: iteration time, its 80% interval, peak
memory per device, its interval, the chance it runs out of memory (oom_risk) and whether it fits (that risk
at most 0.1).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.models import infer_signature

from gnn.dataset.rows import ASSUMED_DTYPE, ASSUMED_VOCAB
from gnn.inference.predictor import POINT_COLUMNS, BatchPredictor

INPUT_COLUMNS = {
    "layers": "int64",
    "hidden": "int64",
    "heads": "int64",
    "seq_len": "int64",
    "vocab": "int64",
    "micro_batch_size": "int64",
    "global_batch_size": "int64",
    "dtype": "str",
    "dp": "int64",
    "tp": "int64",
    "pp": "int64",
    "sharding": "str",
    "recompute": "str",
    "pp_schedule": "str",
    "virtual_stages": "int64",
    "num_microbatches": "int64",
    "sequence_parallel": "bool",
    "nodes": "int64",
    "devices_per_node": "int64",
    "device": "str",
    "device_kind": "str",
    "memory_bytes": "int64",
    "backend": "str",
    "hardware": "str",
}


def as_input(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows of data/runs in the pyfunc's input format (pp_schedule "" where there is no pipeline).

    Fields a source left unstated (vTrain's vocab, dtype, sharding) take the assumptions of gnn.dataset.rows; the pyfunc
    treats its input as fully stated, as a user's plan is.
    """
    df = rows.rename(columns={"fingerprint_id": "hardware"}).copy()
    df["pp_schedule"] = df["pp_schedule"].fillna("")
    df = df.fillna(
        {
            "vocab": ASSUMED_VOCAB,
            "dtype": ASSUMED_DTYPE,
            "sharding": "none",
            "recompute": "none",
            "sequence_parallel": False,
            "virtual_stages": 1,
            "hardware": "a100-80gb",
            "memory_bytes": 80 * 2**30,
        }
    )
    return df[list(INPUT_COLUMNS)].astype(INPUT_COLUMNS).reset_index(drop=True)


class PlansightModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        self.predictor = BatchPredictor.load(context.artifacts["predictor"], hardware_dir=context.artifacts["hardware"])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        rows = model_input.rename(columns={"hardware": "fingerprint_id"}).copy()
        rows["pp_schedule"] = rows["pp_schedule"].replace("", None)
        return self.predictor.predict_rows(rows)[list(POINT_COLUMNS)].reset_index(drop=True)


def log_model(predictor: BatchPredictor, example_rows: pd.DataFrame, name: str = "model"):
    """Log the predictor (ensemble + the fingerprints it may need) as an MLflow model with a signature."""
    example = as_input(example_rows)
    probe = PlansightModel()  # to infer the signature from real outputs
    probe.predictor = predictor
    with tempfile.TemporaryDirectory() as tmp:
        predictor.save(Path(tmp) / "predictor.pt")
        shutil.copytree(predictor.hardware_dir, Path(tmp) / "hardware")
        artifacts = {"predictor": str(Path(tmp) / "predictor.pt"), "hardware": str(Path(tmp) / "hardware")}
        signature = infer_signature(example, probe.predict(None, example))
        # models-from-code: the model is this package's code, named by a file, so nothing pickled is logged
        return mlflow.pyfunc.log_model(
            name=name,
            python_model=str(Path(__file__).with_name("pyfunc_code.py")),
            artifacts=artifacts,
            signature=signature,
            input_example=example,
        )
