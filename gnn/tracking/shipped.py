"""The champion shipped in the repository: models/champion/predictor.pt (weights plus a JSON description,
gnn.model.checkpoint) and champion.json (where it came from: run, version, metrics, the data and code it was
trained on, and its predictions for a few fixed plans on this code).

    python -m gnn.tracking.shipped export      # make ship-champion: the registered champion -> models/champion
    python -m gnn.tracking.shipped register    # models/champion -> the tracking store's champion
    python -m gnn.tracking.shipped recalibrate --new-source ROWS.csv   # make recalibrate: its new-cluster calibration

A fresh clone has no registered model: serve.api.load_predictor registers the shipped one into the embedded
store on first use, unless this code makes other features than it was trained on (then a training replaces
it). tests/model/test_shipped.py fails when the shipped model no longer reproduces its reference predictions.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from collect import REPO
from collect.hardware.records import default_hardware_dir, load_hardware
from collect.schema import RunSpec
from gnn.inference import new_source
from gnn.inference.predictor import BatchPredictor
from gnn.tracking.model_cache import MODEL_CACHE, registry_info, tracking_uri

SHIPPED = REPO / "models" / "champion"
CHAMPION_URI = "models:/plansight@champion"
RUN_NAME = "shipped champion"
SHA_TAG = "shipped_sha256"  # the run's tag: which predictor.pt it logged (a second registration finds it)
EXAMPLE_RUNS = REPO / "data" / "runs" / "vtrain-a100.parquet"  # the logged model's input example: preset hardware
RELATIVE_TOLERANCE = 1e-3
TARGETS = ("iter_time_s", "peak_mem_bytes")

_GPT = dict(family="gpt", layers=4, hidden=256, heads=4, seq_len=128, vocab=1024, micro_batch_size=2)
_GPT_20L = dict(
    family="gpt", layers=20, hidden=1536, heads=16, seq_len=1024, vocab=51200, micro_batch_size=1,
    global_batch_size=64, dtype="bfloat16",
)  # fmt: skip
_LLAMA_8B = dict(
    family="llama", layers=32, hidden=4096, heads=32, seq_len=8192, vocab=128256, micro_batch_size=1,
    global_batch_size=256, dtype="bfloat16", kv_heads=8, ffn_hidden=14336,
)  # fmt: skip
_MIXTRAL = dict(
    family="moe", layers=32, hidden=4096, heads=32, seq_len=4096, vocab=32000, micro_batch_size=1,
    global_batch_size=256, dtype="bfloat16", kv_heads=8, experts=8, top_k=2, expert_ffn_hidden=14336,
)  # fmt: skip
# (name, hardware: a fingerprint in data/hardware or a preset, workload, plan, cluster: a preset's nodes, or a CPU
# host's size)
REFERENCE = (
    (
        "gpt 4x256 dp2 pp2 on 4 CPU ranks (gloo)", "vm-20261122T003239",
        {**_GPT, "global_batch_size": 8, "dtype": "float32"},
        dict(dp=2, pp=2, pp_schedule="1f1b", num_microbatches=2), dict(devices_per_node=4, memory_bytes=16 * 2**30),
    ),
    (
        "gpt 20x1536 dp2 tp2 pp2 on 8 x a100-80gb", "a100-80gb", _GPT_20L,
        dict(dp=2, tp=2, pp=2, pp_schedule="1f1b", num_microbatches=32), dict(nodes=1),
    ),
    (
        "llama 3.1 8b fsdp on 8 x h100-80gb", "h100-80gb", _LLAMA_8B,
        dict(dp=8, sharding="fsdp_full", num_microbatches=32), dict(nodes=1),
    ),
    (
        "mixtral 8x7b ep8 fsdp on 16 x h100-80gb", "h100-80gb", _MIXTRAL,
        dict(dp=16, ep=8, sharding="fsdp_full", recompute="full", num_microbatches=16), dict(nodes=2),
    ),
)  # fmt: skip


def reference_specs() -> list[dict]:
    """REFERENCE as run specs (JSON), a preset's cluster filled from its datasheet as the service fills it."""
    out = []
    for name, hardware, workload, plan, cluster in REFERENCE:
        if "devices_per_node" not in cluster:  # a preset: its GPUs, memory and NCCL
            p = load_hardware(hardware)
            cluster = {
                **cluster, "devices_per_node": p["devices_per_node"], "device": "cuda", "device_kind": p["id"],
                "memory_bytes": p["memory_bytes"], "backend": "nccl",
            }  # fmt: skip
        spec = RunSpec.model_validate({"workload": workload, "plan": plan, "cluster": cluster})
        out.append({"name": name, "hardware": hardware, "spec": spec.model_dump(mode="json")})
    return out


def predict_reference(predictor: BatchPredictor, reference: list[dict]) -> list[dict]:
    """The model's point predictions for each reference plan, featurised in this process (deterministic on CPU).
    Raises ValueError when the model cannot read this code's features (BatchPredictor._check_layout)."""
    out = []
    for ref in reference:
        columns = predictor.predict_columns([RunSpec.model_validate(ref["spec"])], ref["hardware"], workers=0)
        out.append({k: float(columns[k][0]) for k in TARGETS})
    return out


def reference_problems(folder: Path = SHIPPED) -> list[str]:
    """What of the shipped model's recorded reference predictions this code does not reproduce (within
    RELATIVE_TOLERANCE); empty when it is current. ValueError: this code cannot read the model at all."""
    meta = json.loads((folder / "champion.json").read_text())
    predictor = BatchPredictor.load(folder / "predictor.pt", default_hardware_dir())
    problems = []
    for ref, got in zip(meta["reference"], predict_reference(predictor, meta["reference"])):
        for k in TARGETS:
            want = ref["prediction"][k]
            if abs(got[k] - want) > RELATIVE_TOLERANCE * abs(want):
                problems.append(f"{ref['name']}: {k} {got[k]:.6g}, recorded {want:.6g}")
    return problems


def export(uri: str = CHAMPION_URI, out: Path = SHIPPED, new_source_rows: Path | None = None) -> Path:
    """Write a registered model (models:/name@alias or models:/name/N) to ``out``: predictor.pt and
    champion.json. ``new_source_rows``: experiments.sources.loso's held-out rows, whose calibration of a GPU cluster
    never trained on (gnn.inference.new_source) ships with the model."""
    import mlflow  # lazy: loading a shipped model (the service's start) needs no MLflow

    from gnn.tracking.registry import load_registered  # lazy: it imports MLflow

    if not uri.startswith("models:/"):
        raise ValueError(f"{uri}: export takes a registered model, models:/name@alias or models:/name/N")
    mlflow.set_tracking_uri(tracking_uri())
    info = registry_info(uri)  # its name, version, run, val_/test_ metrics and what it names now
    run = mlflow.MlflowClient().get_run(info["run_id"])
    out.mkdir(parents=True, exist_ok=True)
    registered = load_registered(uri, info["source"])
    if new_source_rows is not None:
        registered.info["new_source"] = new_source.fit(pd.read_csv(new_source_rows))
    registered.save(out / "predictor.pt")
    predictor = BatchPredictor.load(out / "predictor.pt", default_hardware_dir())  # predict as it will be read
    member = predictor.ensemble.members[0]
    config = member.config
    reference = _predicted(predictor, reference_specs())
    params = run.data.params
    meta = {
        "model_uri": uri,
        "registered_model": info["name"],
        "version": info["version"],
        "run_id": info["run_id"],
        "exported_at": _now(),
        "code": {**_git(), "trained_at": run.data.tags.get("mlflow.source.git.commit")},
        "dataset_version": params.get("dataset_version"),
        "feature_version": params.get("feature_version"),
        "split": params.get("split"),
        "features": {"node": int(config["node_dim"]), "plan": int(config["global_dim"])},
        "params": dict(sorted(params.items())),
        "metrics": dict(sorted(info["metrics"].items())),
        "new_source": predictor.info.get("new_source"),
        "reference": reference,
    }
    (out / "champion.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out


def recalibrate(new_source_rows: Path, folder: Path = SHIPPED) -> Path:
    """The shipped model's new-cluster calibration refitted on leave-one-source-out rows (experiments.sources.loso's),
    its weights unchanged: predictor.pt's and champion.json's calibration and reference predictions rewritten, so a
    leave-one-source-out run ships without a retraining (make recalibrate)."""
    predictor = BatchPredictor.load(folder / "predictor.pt", default_hardware_dir())
    predictor.info["new_source"] = new_source.fit(pd.read_csv(new_source_rows))
    predictor.save(folder / "predictor.pt")
    predictor = BatchPredictor.load(folder / "predictor.pt", default_hardware_dir())  # predict as it will be read
    meta = json.loads((folder / "champion.json").read_text())
    meta |= {"new_source": predictor.info["new_source"], "reference": _predicted(predictor, meta["reference"])}
    meta["recalibrated"] = {"at": _now(), "code": _git(), "rows": str(new_source_rows)}
    (folder / "champion.json").write_text(json.dumps(meta, indent=1) + "\n")
    return folder


def _predicted(predictor: BatchPredictor, reference: list[dict]) -> list[dict]:
    """The reference plans with this model's predictions of them."""
    return [{**ref, "prediction": p} for ref, p in zip(reference, predict_reference(predictor, reference))]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _git() -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def local_store() -> bool:
    """The tracking and registry stores are local sqlite files (the embedded default), not a team server: the only
    stores the shipped model is registered into without being asked."""
    uri = tracking_uri()
    return uri.startswith("sqlite:///") and os.environ.get("MLFLOW_REGISTRY_URI", uri).startswith("sqlite:///")


def register_shipped(folder: Path = SHIPPED) -> bool:
    """Register the shipped model as a version of the tracking store's model, champion unless a better one is
    there; False (one line said why) when there is none, or this code cannot read it (then train one). Safe to
    run twice or in two processes at once: it registers one version per store."""
    if not (folder / "predictor.pt").is_file():
        return False
    meta = json.loads((folder / "champion.json").read_text())
    try:
        predictor = BatchPredictor.load(folder / "predictor.pt", default_hardware_dir())
        predict_reference(predictor, meta["reference"])
    except ValueError as e:
        why = "is for another feature layout" if "feature layout" in str(e) else f"is unusable ({str(e)[:200]})"
        print(f"the shipped champion ({folder}) {why}: not registered (a training replaces it: make train)")
        return False
    import mlflow  # lazy: loading a shipped or registered model needs no MLflow

    from gnn.tracking.registry import CHAMPION, MODEL_NAME, register, unreadable_champion  # lazy: MLflow
    from gnn.tracking.runs import setup  # lazy: as registry

    sha = hashlib.sha256((folder / "predictor.pt").read_bytes()).hexdigest()
    with _lock():
        setup()
        client = mlflow.MlflowClient()
        logged = {
            r.info.run_id for r in mlflow.search_runs(filter_string=f"tags.{SHA_TAG} = '{sha}'", output_format="list")
        }
        for v in client.search_model_versions(f"name='{MODEL_NAME}'"):
            if v.run_id in logged:
                print(f"the shipped champion is already registered as models:/{MODEL_NAME}/{v.version}")
                return True
        current = unreadable_champion(client)
        value = float(meta["metrics"]["val_selection"])
        with mlflow.start_run(run_name=RUN_NAME) as run:
            mlflow.set_tags({SHA_TAG: sha, "shipped_from_run": meta["run_id"]})
            mlflow.log_params(
                {
                    "dataset_version": meta["dataset_version"],
                    "feature_version": meta["feature_version"],
                    "split": meta["split"],
                    "code_commit": meta["code"]["trained_at"] or meta["code"]["commit"],
                    "shipped_commit": meta["code"]["commit"],
                }
            )
            mlflow.log_metrics(meta["metrics"])
            info = _log_model(predictor)
        champion = register(info.model_uri, "val_selection", value, meta["feature_version"], current=current)
        mine = client.search_model_versions(f"run_id='{run.info.run_id}'")[0].version
    commit = (meta["code"]["trained_at"] or meta["code"]["commit"])[:10]
    print(
        f"registered the shipped champion (trained at {commit} on data {meta['dataset_version']}) as "
        + (f"models:/{MODEL_NAME}@{CHAMPION} version {mine}" if champion else f"version {mine}, not champion"),
        file=sys.stderr,  # beside the answer, not in it: `serve predict --json` prints JSON alone
    )
    return True


def _log_model(predictor: BatchPredictor):
    from gnn.tracking.pyfunc import log_model  # lazy: it imports MLflow

    return log_model(predictor, pd.read_parquet(EXAMPLE_RUNS).head(2))


@contextlib.contextmanager
def _lock():
    """One registration at a time on this machine, so a second finds the first's version."""
    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    with open(MODEL_CACHE / ".shipped.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="write the registered champion to models/champion")
    ex.add_argument("--model", default=CHAMPION_URI)
    ex.add_argument("--out", type=Path, default=SHIPPED)
    ex.add_argument("--new-source", type=Path, metavar="ROWS.csv", help="ship the leave-one-source-out calibration "
                    "fitted on these rows (experiments/results/loso_rows.csv) with the model")  # fmt: skip
    sub.add_parser("register", help="register models/champion in the tracking store (MLFLOW_TRACKING_URI)")
    re = sub.add_parser("recalibrate", help="refit models/champion's new-cluster calibration, weights unchanged")
    re.add_argument("--new-source", type=Path, metavar="ROWS.csv", required=True)
    args = parser.parse_args()
    if args.command == "export":
        out = export(args.model, args.out, args.new_source)
        sizes = ", ".join(f"{p.name} {p.stat().st_size / 2**20:.1f} MiB" for p in sorted(out.iterdir()))
        print(f"exported {args.model} to {out} ({sizes})")
    elif args.command == "recalibrate":
        print(f"recalibrated {recalibrate(args.new_source)} on {args.new_source}")
    elif not register_shipped():
        raise SystemExit(1)


if __name__ == "__main__":
    main()
