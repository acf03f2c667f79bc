"""Real CPU peaks with FSDP's collectives in place: how much of the fake-vs-real gap is gloo's staging copies.

    python -m experiments.memory.gloo_staging [--over 0.01] [--repeats 3]

On gloo, FSDP2's reduce-scatter clones its whole input and all-reduces the clone, and its all-gather gathers into a
flat buffer of its own before copying out (torch's ProcessGroupGloo.cpp): a buffer of one FSDP group's unsharded
size that NCCL never allocates, alive for as long as gloo's thread takes, so a CPU rank's peak moves between runs by
up to one such group. The ranks of experiments.memory.fake's latest proof (its traces and re-measurements, of the
code they name) more than ``--over`` off their trace are measured again on this code, with both collectives
replaced by in-place all-reduces (gloo_staging/sitecustomize.py, loaded into the collector's ranks through
PYTHONPATH; the collector itself is unchanged), ``--repeats`` times each. Writes
experiments/results/gloo_staging.json: per rank its trace, its re-measurements as collected and in place, and both
codes (the proof's and this one's).
"""

from __future__ import annotations

import os
from pathlib import Path
from unittest.mock import patch

SHIM = Path(__file__).parent  # holds sitecustomize.py


def in_place_collectives():
    """The collector's ranks, spawned inside, load the shim: their environment is this process's at spawn."""
    path = os.pathsep.join(p for p in (str(SHIM), os.environ.get("PYTHONPATH")) if p)
    return patch.dict(os.environ, {"PYTHONPATH": path, "PLANSIGHT_GLOO_IN_PLACE": "1"})
