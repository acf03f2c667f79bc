"""gnn.tracking.logs: library chatter goes to the log file, the terminal keeps plansight's own lines."""

import logging
import warnings

import lightning  # noqa: F401  imported first, as the demo does: it installs its own handlers
import mlflow  # noqa: F401

from gnn.tracking.logs import library_logs_to


def test_library_logs_and_warnings_go_to_the_file(tmp_path, capfd):
    from mlflow.utils.logging_utils import eprint

    log = tmp_path / "run.log"
    with library_logs_to(log):
        logging.getLogger("lightning.pytorch.utilities.rank_zero").info("Tip: try litlogger")
        logging.getLogger("mlflow.pyfunc").warning("Passing a Python object as python_model")
        warnings.warn("'pin_memory' argument is set as true", UserWarning, stacklevel=1)
        eprint("Successfully registered model 'plansight'.")
        print("plansight's own line")
    out, err = capfd.readouterr()
    assert out == "plansight's own line\n" and err == ""
    text = log.read_text()
    for line in ("Tip: try litlogger", "python_model", "pin_memory", "Successfully registered model"):
        assert line in text
