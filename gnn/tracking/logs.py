"""Library chatter (Lightning's tips, MLflow's hints and progress bars, torch's warnings) to a file, not the
terminal: a user of `make demo` or `make train` reads plansight's own lines and progress bars only.

    with library_logs_to(Path("build/demo.log")):
        ...

Import the libraries before entering: they install their own handlers at import, and this replaces them.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

LIBRARY_LOGGERS = (
    "lightning",
    "lightning.pytorch",
    "lightning.fabric",
    "pytorch_lightning",
    "mlflow",
    "alembic",
    "torch_geometric",
    "py.warnings",
)


@contextlib.contextmanager
def library_logs_to(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode="a")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = {}
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    logging.captureWarnings(True)
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        saved[name] = (logger.handlers[:], logger.propagate, logger.level)
        logger.handlers, logger.propagate = [handler], False
        logger.setLevel(logging.INFO)
    # MLflow's registry prints its own lines ("Successfully registered model ...") through this stream
    from mlflow.utils.logging_utils import MLFLOW_LOGGING_STREAM  # lazy: callers import MLflow first (see above)

    MLFLOW_LOGGING_STREAM.write = handler.stream.write
    try:
        yield
    finally:
        del MLFLOW_LOGGING_STREAM.write  # back to the class's own
        for name, (handlers, propagate, level) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers, logger.propagate = handlers, propagate
            logger.setLevel(level)
        logging.captureWarnings(False)
        handler.close()
