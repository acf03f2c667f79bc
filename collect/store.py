"""Loss-free storage of measured rows: an append-only journal compacted into Parquet.

Each finished plan is one JSON line appended and fsynced to
``<name>.journal.jsonl``, so a crash, kill or Ctrl-C loses at most the plan in
flight. ``compact()`` folds the journal into ``<name>.parquet`` by writing a
temporary file and renaming it over the old one (atomic on POSIX), then empties
the journal. Rows are keyed by ``measurement_id``; a row present in both files
(a crash between rename and truncation) is read once.

Corruption is never silent: an unreadable Parquet file or a malformed journal
line raises CorruptResultsError naming the file and line. The one exception is
a torn last line with no newline, which is what a kill mid-write leaves: it is
moved aside to ``<journal>.torn-<time>`` (kept, not deleted) and reported.
"""
from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

import pandas as pd

KEY = "measurement_id"


class CorruptResultsError(RuntimeError):
    pass


class ResultStore:
    def __init__(self, parquet_path: str | Path):
        self.parquet_path = Path(parquet_path)
        self.journal_path = self.parquet_path.with_suffix(".journal.jsonl")
        self.parquet_path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, row: dict) -> None:
        line = json.dumps(row, default=_json_default, separators=(",", ":")) + "\n"
        fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def load(self) -> pd.DataFrame:
        frames = []
        if self.parquet_path.exists():
            try:
                frames.append(pd.read_parquet(self.parquet_path))
            except Exception as exc:
                raise CorruptResultsError(f"{self.parquet_path}: unreadable Parquet ({exc}); "
                                          "move it aside or restore it from git, nothing was changed") from exc
        journal_rows = self._read_journal()
        if journal_rows:
            frames.append(pd.DataFrame(journal_rows))
        if not frames:
            return pd.DataFrame()
        df = pd.concat(frames, ignore_index=True)
        return df.drop_duplicates(subset=KEY, keep="last").reset_index(drop=True)

    def done_ids(self) -> set[str]:
        """Measurements that are final: ok and oom. Errors and timeouts are retried on resume."""
        df = self.load()
        return set(df.loc[df["status"].isin(["ok", "oom"]), KEY]) if len(df) else set()

    def compact(self) -> pd.DataFrame:
        df = self.load()
        if len(df) == 0:
            return df
        tmp = self.parquet_path.with_suffix(".parquet.tmp")
        df.to_parquet(tmp, compression="zstd", index=False)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.parquet_path)
        # Only now may the journal go: every row in it is inside the renamed Parquet.
        with open(self.journal_path, "w") as f:
            f.flush()
            os.fsync(f.fileno())
        return df

    def _read_journal(self) -> list[dict]:
        if not self.journal_path.exists():
            return []
        raw = self.journal_path.read_bytes()
        lines = raw.split(b"\n")
        torn = lines.pop() if lines and lines[-1] else None  # last element is b"" when the file ends in \n
        rows = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise CorruptResultsError(f"{self.journal_path}:{number}: malformed row ({exc}); "
                                          "fix or remove that line, nothing was changed") from exc
        if torn is not None:
            self._set_aside_torn_line(raw, torn)
        return rows

    def _set_aside_torn_line(self, raw: bytes, torn: bytes) -> None:
        aside = self.journal_path.with_name(f"{self.journal_path.name}.torn-{int(time.time())}")
        aside.write_bytes(torn)
        tmp = self.journal_path.with_suffix(".tmp")
        tmp.write_bytes(raw[: len(raw) - len(torn)])
        os.replace(tmp, self.journal_path)
        warnings.warn(f"{self.journal_path}: last line was cut off mid-write (a killed run); "
                      f"moved its {len(torn)} bytes to {aside}")


def _json_default(value):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in a results row")
