"""Take a machine's fingerprint: run collect.hardware.fingerprint on every pool's ranks and save the record.

python -m collect fingerprint [--world-sizes 1 2 4]   (or at the start of every sweep)
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import torch

from collect.hardware.records import fit_collectives
from collect.launch.pool import LocalPool
from collect.schema import DTYPE_BYTES

MAX_MESSAGE_BYTES = 64 * 2**20  # larger messages add minutes and nothing new: bandwidth has saturated


def largest_message(points) -> int:
    """The largest collective message a sweep's plans send (a model's parameters), capped: beyond it bandwidth
    has long saturated."""
    largest = max(p.workload.num_params * DTYPE_BYTES[p.workload.dtype] for p, *_ in points)
    return min(MAX_MESSAGE_BYTES, largest)


def take_fingerprint(
    pools: dict[int, LocalPool], max_bytes: int, hardware_dir: Path, host: str, blocks: bool = True
) -> str:
    """Measure, save as ``hardware_dir/<id>.json`` and return the id: compute and (``blocks``) the block profile
    on one rank, collectives and (``blocks``) concurrency on every world size of ``pools``."""
    if 1 in pools:
        solo = pools[1].fingerprint(max_bytes=max_bytes, blocks=blocks)
    else:
        with LocalPool(1) as one:
            solo = one.fingerprint(max_bytes=max_bytes, blocks=blocks)
    multi = [
        pt
        for ws, pool in sorted(pools.items())
        if ws > 1
        for pt in pool.fingerprint(max_bytes=max_bytes, blocks=blocks)
    ]
    return save_fingerprint(solo + multi, hardware_dir, host, {"device": "cpu", "threads_per_rank": 1})


def save_fingerprint(points: list[dict], hardware_dir: Path, host: str, machine: dict) -> str:
    """Save the measured points as ``hardware_dir/<id>.json`` and return the id. ``machine``: what the device is
    (``device``: cpu or cuda, and what else names it: threads per rank, the GPU's name and kind)."""
    collectives = [pt for pt in points if pt["kind"] == "collective"]
    now = datetime.datetime.now(datetime.timezone.utc)
    fingerprint_id = f"{host}-{now:%Y%m%dT%H%M%S}"
    record = {
        "id": fingerprint_id,
        "source": "measured",
        "host": host,
        "measured_at": now.isoformat(timespec="seconds"),
        "torch": torch.__version__,
        **machine,
        "compute": [pt for pt in points if pt["kind"] in ("matmul", "memory_bandwidth")],
        "collectives": collectives,
        "collective_fits": fit_collectives(collectives),
        "blocks": [pt for pt in points if pt["kind"] in ("block", "optimizer", "concurrency")],
    }
    hardware_dir.mkdir(parents=True, exist_ok=True)
    (hardware_dir / f"{fingerprint_id}.json").write_text(json.dumps(record, indent=1))
    return fingerprint_id
