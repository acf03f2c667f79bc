"""python -m collect.kernels --out FILE [--device cuda|cpu] [--grid full|quick] [--budget-s 420] [--sections S,..]:
see collect.kernels. The table is written after every section, so a run cut short keeps what it timed. With
--sections (key/sub names, e.g. attention/flash2), only those are timed: into FILE's table when it exists, each
section replaced whole and its own source kept under ``section_sources``."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from collect.kernels import ops
from collect.kernels.grid import GRIDS
from collect.kernels.timer import launch_seconds

# (table key, sub-key, share of the budget a section may take at most, rows); a section past its share or the
# budget stops where it is and says so
SECTIONS = [
    ("gemm", "bfloat16", 0.25, lambda g, d, dt: ops.gemm(g, d, dt)),
    ("attention", "sdpa", 0.15, lambda g, d, dt: ops.attention(g, d, dt)),
    ("gemm", "float8_tensorwise", 0.15, lambda g, d, dt: ops.gemm_fp8(g, d, "tensorwise")),
    ("elementwise", "bfloat16", 0.1, lambda g, d, dt: ops.elementwise(g, d, dt)),
    ("optimizer", "adamw", 0.1, lambda g, d, dt: ops.optimizer(g, d)),
    ("grouped_gemm", "bfloat16", 0.15, lambda g, d, dt: ops.grouped_gemm(g, d, dt)),
    ("gemm", "float8_rowwise", 0.15, lambda g, d, dt: ops.gemm_fp8(g, d, "rowwise")),
    ("attention", "flash2", 0.15, lambda g, d, dt: ops.attention(g, d, dt, "flash2")),
    ("attention", "cudnn", 0.15, lambda g, d, dt: ops.attention(g, d, dt, "cudnn")),
]


def source(device: torch.device, grid: str) -> dict:
    found = {
        "device": device.type,
        "torch": torch.__version__,
        "host": platform.node(),
        "grid": grid,
        "command": " ".join([Path(sys.executable).name, "-m", _module(), *sys.argv[1:]]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        found |= {"name": props.name, "sms": props.multi_processor_count, "memory_bytes": props.total_memory}
        found |= {"cuda": torch.version.cuda, "driver": _driver()}
    else:
        found |= {"name": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    return found


def _module() -> str:
    """The module this run was started as: python -m collect kernels, or python -m collect.kernels."""
    return "collect.kernels" if Path(sys.argv[0]).parent.name == "kernels" else "collect"


def _driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        )
        return out.stdout.strip() or None
    except OSError:
        return None


def _write(path: Path, table: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=None, separators=(",", ":")) + "\n")
    os.replace(tmp, path)


def _supported(key: str, sub: str, device: torch.device) -> str | None:
    """Why the device cannot run a section, else None."""
    if sub.startswith("float8") and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        return "float8 GEMMs need compute capability 8.9 or later"
    if key == "attention" and sub != "sdpa" and device.type != "cuda":
        return f"torch runs its {sub} attention kernel on CUDA only"
    return None


def run(out: Path, device: torch.device, grid_name: str, budget_s: float, only: list[str] | None = None) -> dict:
    grid, dtype = GRIDS[grid_name], torch.bfloat16
    table = {"id": out.stem, "source": source(device, grid_name), "columns": ops.COLUMNS, "skipped": {}}
    table["launch_s"] = launch_seconds(device)
    if only and out.exists():
        table = _extended(json.loads(out.read_text()), only, table["source"])
    start = time.monotonic()
    for key, sub, share, rows in SECTIONS:
        if only and f"{key}/{sub}" not in only:
            continue
        why = _supported(key, sub, device)
        if why:
            table["skipped"][f"{key}/{sub}"] = why
            continue
        begun = time.monotonic()
        deadline = min(start + budget_s, begun + share * budget_s)
        found = table.setdefault(key, {})[sub] = []
        try:
            for row in rows(grid, device, dtype):
                found.append(row)
                if time.monotonic() > deadline:
                    table["skipped"][f"{key}/{sub}"] = f"cut at its time share after {len(found)} points"
                    break
        except Exception as e:  # a kernel the device or this torch lacks, or memory: the rest is kept
            table["skipped"][f"{key}/{sub}"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        table.setdefault("seconds", {})[f"{key}/{sub}"] = round(time.monotonic() - begun, 1)
        print(f"{key}/{sub}: {len(found)} points in {time.monotonic() - begun:.1f} s", flush=True)
        _write(out, table)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    _write(out, table)
    return table


def _extended(table: dict, only: list[str], new_source: dict) -> dict:
    """An existing table made ready to take ``only`` again: those sections emptied, each with the new source."""
    if table.get("columns") != ops.COLUMNS:
        raise SystemExit("error: --out: its table's columns differ from this version's; write a new table instead")
    for name in only:
        table.setdefault("section_sources", {})[name] = new_source
        table["skipped"].pop(name, None)
    return table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, type=Path, help="the table's JSON file (its name is its id)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--grid", choices=sorted(GRIDS), default=None, help="full on a GPU, quick on a CPU")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop timing after this many seconds")
    names = ", ".join(f"{key}/{sub}" for key, sub, *_ in SECTIONS)
    parser.add_argument("--sections", default=None, help=f"comma-separated, of: {names} (default: all)")


def run_from_args(args: argparse.Namespace) -> None:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: torch sees no CUDA device here")
    if args.budget_s <= 0:
        raise SystemExit(f"error: --budget-s must be positive, got {args.budget_s}")
    grid = args.grid or ("full" if args.device == "cuda" else "quick")
    only = _sections(args.sections)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table = run(args.out, torch.device(args.device), grid, args.budget_s, only)
    print(f"{args.out}: {sum(len(rows) for key in ops.COLUMNS for rows in table.get(key, {}).values())} points")


def _sections(given: str | None) -> list[str] | None:
    if given is None:
        return None
    known = {f"{key}/{sub}" for key, sub, *_ in SECTIONS}
    names = [n.strip() for n in given.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SystemExit(f"error: --sections: {', '.join(unknown) or 'empty'}: not a section (known: {sorted(known)})")
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collect.kernels", description=__doc__)
    add_arguments(parser)
    run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    main()
