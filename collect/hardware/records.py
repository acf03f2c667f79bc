"""Hardware descriptions in one format: measured fingerprints and datasheet presets.

A fingerprint is measured at sweep start (collect.hardware.fingerprint.take_fingerprint
on the sweep's own pools) and saved as data/hardware/<id>.json; every row
carries its id. This module only reads and describes them: it imports no
torch, so validating a request or naming hardware costs nothing.
Presets describe clusters never measured here, from vendor datasheets, marked
``"source": "datasheet"``; a cluster can name one (``"preset": "a100-80gb"``).
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

from collect import REPO
from collect.hardware.costmodel import fit_three_region
from collect.schema.shown import shown

PRESET_DIR = Path(__file__).parent / "presets"


def fit_collectives(points: list[dict]) -> dict:
    """{op: {group_size: ThreeRegionCurve dict}} from raw collective points."""
    grouped = defaultdict(list)
    for pt in points:
        grouped[(pt["op"], pt["group_size"])].append((pt["bytes"], pt["time_s"]))
    fits = defaultdict(dict)
    for (op, group), pts in sorted(grouped.items()):
        sizes, times = zip(*sorted(pts))
        fits[op][str(group)] = fit_three_region(sizes, times).to_dict()
    return dict(fits)


@lru_cache(maxsize=1)
def _presets() -> dict[str, str]:
    """Every preset's file by name, read once per process: presets ship with the package and do not change
    while it runs (a request naming one read its file again to validate it: ~0.3 ms of a single-plan request).
    A name is looked up here, never joined into a path."""
    return {path.stem: path.read_text() for path in sorted(PRESET_DIR.glob("*.json"))}


class UnknownHardware(ValueError):
    """A hardware name that is neither a preset nor a fingerprint found where fingerprints are looked up."""


def default_hardware_dir() -> Path:
    """Where collected fingerprints live: data/hardware, or $PLANSIGHT_HARDWARE_DIR."""
    return Path(os.environ.get("PLANSIGHT_HARDWARE_DIR", REPO / "data" / "hardware"))


FINGERPRINT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # what collect names them: no separators


def hardware_dirs(hardware_dir: str | Path) -> list[Path]:
    """The folders a fingerprint is looked up in, first match wins: ``hardware_dir`` may list several,
    separated by os.pathsep (a model's own bundled fingerprints after the repository's data/hardware)."""
    return [Path(d) for d in str(hardware_dir).split(os.pathsep) if d]


def load_hardware(name: str, hardware_dir: str | Path = "data/hardware") -> dict:
    """A preset by name (a100-80gb, ...) or a measured fingerprint by id. A fingerprint taken before block
    profiles existed may name, in ``blocks_from``, a later fingerprint of the same host whose profile it uses
    (data/README.md says which and why); its ``blocks`` are then that one's."""
    if name in _presets():
        return json.loads(_presets()[name])  # a fresh dict: callers may add to it
    dirs = hardware_dirs(hardware_dir)
    if not FINGERPRINT_ID.fullmatch(name) or ".." in name:
        raise UnknownHardware(
            f"hardware {shown(name)}: not a preset (presets: {sorted(_presets())}), and not a "
            "fingerprint id (letters, digits, '.', '_' and '-', as collect names them)"
        )
    path = next((d / f"{name}.json" for d in dirs if (d / f"{name}.json").is_file()), None)
    if path is None:
        where = " or ".join(_shown(d) for d in dirs)
        raise UnknownHardware(
            f"hardware {name!r}: no preset of that name (presets: {sorted(_presets())}) and no "
            f"fingerprint {name}.json in {where} (make collect writes one to data/hardware)"
        )
    try:
        record = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{_shown(path)}: not a fingerprint (invalid JSON: {e})") from None
    if "blocks" not in record and record.get("blocks_from"):
        source = load_hardware(record["blocks_from"], hardware_dir)
        # the source's compute points go along: gnn.costs.blocks rescales the borrowed throughput by them
        record["blocks"], record["blocks_compute"] = source.get("blocks", []), source["compute"]
    return record


def _shown(path: Path) -> str:
    """A path as an error message may show it: relative to the repository, else only its last two parts
    (a served model's folder says nothing a client needs and something about the server)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(Path(*path.parts[-2:]))
