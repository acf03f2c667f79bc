"""What a results row may hold: the check every journal line passes before collect.store reads or compacts it.

A row is a JSON object with a ``measurement_id`` string and a known ``status``, and each value of the kind its
column holds: the plan's, workload's and cluster's fields as collect.schema types them, the measurements as
numbers. A value of the wrong kind would be read (pandas takes anything) and then fail the compaction into
Parquet, or whatever reads the column next; here it is refused with its line.
"""

from __future__ import annotations

from typing import Literal, get_args, get_origin

from collect.schema import Cluster, Plan, Workload
from collect.schema.shown import shown

KEY = "measurement_id"
STATUSES = ("ok", "oom", "error", "timeout")
INT64 = 2**63  # Parquet's integers: a larger one fails the compaction, not the append


def _kind(annotation) -> str:
    """number, bool or string: what a schema field's values are in a row (null aside)."""
    if get_origin(annotation) is Literal:
        return "string"
    options = [a for a in get_args(annotation) if a is not type(None)] or [annotation]
    if len(options) != 1:
        return "any"
    if get_origin(options[0]) is Literal:
        return "string"
    return {bool: "bool", int: "number", float: "number", str: "string"}.get(options[0], "any")


# What each known column holds; a column not named here holds scalars or lists of them.
COLUMN_KINDS = {
    **{name: _kind(f.annotation) for model in (Workload, Plan, Cluster) for name, f in model.model_fields.items()},
    **dict.fromkeys(("world_size", "num_params", "iter_time_s", "iter_time_p10_s", "iter_time_p90_s"), "number"),
    **dict.fromkeys(("peak_mem_bytes", "rss_hwm_bytes", "wall_s", "ref_time_s"), "number"),
    **dict.fromkeys(("iter_times_s", "peak_mem_bytes_per_rank"), "numbers"),
    **dict.fromkeys(("run_id", "collected_at", "error", "peak_mem_method", "sweep_id", "host"), "string"),
    "is_reference": "bool",
}
_KIND_NAMES = {
    "number": "a number or null",
    "bool": "true, false or null",
    "string": "a string or null",
    "numbers": "a list of numbers",
    "any": "a string, number, boolean, null or a list of them (integers within 64 bits)",
}


def row_problem(row) -> str | None:
    """Why ``row`` (a parsed journal line) is not a results row, or None."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    if not isinstance(row.get(KEY), str) or not row[KEY]:
        return f"no {KEY!r} string"
    if row.get("status") not in STATUSES:
        return f"'status' is {shown(row.get('status'))}, not one of {list(STATUSES)}"
    for column, value in row.items():
        kind = COLUMN_KINDS.get(column, "any")
        if not _holds(kind, value):
            return f"{shown(column)} is {shown(value)}, not {_KIND_NAMES[kind]}"
    return None


def _holds(kind: str, value) -> bool:
    if kind == "numbers":
        return isinstance(value, list) and all(v is None or _number(v) for v in value)
    if value is None:
        return True
    if kind == "number":
        return _number(value)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    items = value if isinstance(value, list) else [value]
    return all(v is None or isinstance(v, (str, bool)) or _number(v) for v in items)


def _number(value) -> bool:
    return isinstance(value, float) or (
        isinstance(value, int) and not isinstance(value, bool) and -INT64 <= value < INT64
    )
