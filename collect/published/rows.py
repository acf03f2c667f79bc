"""What every converter of published measurements shares: a printed row into the row schema (or the reason it
cannot be), the columns every converted row carries, and writing the rows with what was left out."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

import pandas as pd

from collect.schema import RunSpec

SWEEP_PREFIX = "published-"  # every converted source's sweep id starts so (gnn.dataset.splits reads it)


def convert_records(
    records: Iterable[dict], spec_of: Callable[[dict], RunSpec], row_of: Callable[[RunSpec, dict, int], dict]
) -> tuple[pd.DataFrame, Counter]:
    """(rows, reasons): each record the schema can express as a row, and why the others could not be expressed."""
    rows, reasons = [], Counter()
    for i, r in enumerate(records):
        try:
            spec = spec_of(r)
        except ValueError as e:  # pydantic's ValidationError is one
            reasons[first_reason(e)] += 1
            continue
        rows.append(row_of(spec, r, i))
    return pd.DataFrame(rows), reasons


def spec_columns(spec: RunSpec, measurement: str, sweep_id: str, hardware: str) -> dict:
    """The columns a converted row shares with collected ones: the spec's fields and ids, the sweep, the hardware
    record (a preset) and ``measurement``, which tells the row's printed case from others of the same plan."""
    w, p, c = spec.workload, spec.plan, spec.cluster
    return {
        **w.model_dump(exclude_none=True),
        **p.model_dump(),
        **c.model_dump(),
        "world_size": c.world_size,
        "num_params": w.num_params,
        "run_id": spec.run_id,
        "measurement_id": f"{spec.run_id}-{measurement}",
        "repeat_group": None,
        "sweep_id": sweep_id,
        "fingerprint_id": hardware,
        "is_reference": False,
    }


def first_reason(error: ValueError) -> str:
    errors = getattr(error, "errors", None)
    text = errors()[0]["msg"] if errors else str(error)
    return text.split(";")[0].split(":")[0].removeprefix("Value error, ")


def save(df: pd.DataFrame, reasons: Counter, out: str, summary: str) -> None:
    """Write a converted source's rows and say what they hold and what could not be expressed, most common first."""
    df.to_parquet(out, compression="zstd", index=False)
    print(f"{out}: {summary}")
    for reason, n in reasons.most_common():
        print(f"  not expressible ({n}): {reason}")
