"""Loss-free storage of measured rows: an append-only journal compacted into Parquet.

Each finished plan is one JSON line appended and fsynced to
``<name>.journal.jsonl``, so a crash, kill or Ctrl-C loses at most the plan in
flight. ``compact()`` folds the journal into ``<name>.parquet`` by writing a
temporary file and renaming it over the old one (atomic on POSIX), then empties
the journal. Rows are keyed by ``measurement_id``; a row present in both files
(a crash between rename and truncation) is read once.

Corruption is never silent: an unreadable Parquet file, one without the key
columns, or a journal line that is not a row (bad bytes, bad JSON, not an
object, no ``measurement_id`` or ``status``, a value of the wrong kind for its
column, collect.rows: ``"iter_time_s": "fast"``) raises CorruptResultsError
naming the file, line and rule, and leaves the files as they were. The one exception
is a torn last line with no newline, which is what a kill mid-write leaves: it
is moved aside to ``<journal>.torn-<time>`` (kept, not deleted) and reported.

Appends, loads and compactions of any handles, threads or processes, take turns
on ``<name>.journal.lock``, so a row appended while another handle compacts is
in the Parquet it writes or in the journal after it, never dropped by the
truncation, and the Parquet is read through one open handle, never half the old
file and half the new. One writer per store: ``with store.writing():`` holds an exclusive lock on
``<name>.lock`` (released by the OS if the process dies), and a second writer is
refused with StoreBusyError. A write that fails (a full or read-only disk)
raises StoreWriteError naming the path; what was stored before stays stored.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

import pandas as pd

from collect.rows import KEY, row_problem


class CorruptResultsError(RuntimeError):
    pass


class StoreBusyError(RuntimeError):
    """Another process is writing to the same store."""


class StoreWriteError(RuntimeError):
    """Writing the store failed (disk full, read-only, ...); nothing stored before was lost."""


@contextlib.contextmanager
def _writing_to(path: Path):
    try:
        yield
    except OSError as exc:
        raise StoreWriteError(
            f"cannot write {exc.filename or path}: {exc.strerror}; every row stored before is "
            "kept: free space or fix permissions, then run the same command again to resume"
        ) from exc


class ResultStore:
    def __init__(self, parquet_path: str | Path):
        self.parquet_path = Path(parquet_path)
        self.journal_path = self.parquet_path.with_suffix(".journal.jsonl")
        self.parquet_path.parent.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def writing(self):
        """Hold the store's writer lock: a second sweep on the same output is refused, not run twice."""
        lock_path = self.parquet_path.with_suffix(".lock")
        with _writing_to(lock_path):
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
                raise StoreBusyError(
                    f"{self.parquet_path} is being written by {holder}; wait for that sweep to "
                    "end (or stop it), or give this one another --out"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
            yield self
        finally:
            os.close(fd)  # releases the lock

    @contextlib.contextmanager
    def _turn(self, *, required: bool = True):
        """Hold the journal lock for one append, load or compaction (blocking; released on close or death).

        A reader of a read-only store (a checkout it may not write) reads without it: nobody writes there."""
        path = self.parquet_path.with_suffix(".journal.lock")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if required:
                raise StoreWriteError(f"cannot write {path}: {exc.strerror}") from exc
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def append(self, row: dict) -> None:
        line = json.dumps(row, default=_json_default, separators=(",", ":")) + "\n"
        with self._turn(), _writing_to(self.journal_path):
            fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                data = line.encode()
                written = os.write(fd, data)
                if written != len(data):  # a short write on a full disk: what got in is a torn line
                    raise OSError(28, "No space left on device (short write)", str(self.journal_path))
                os.fsync(fd)
            finally:
                os.close(fd)

    def load(self) -> pd.DataFrame:
        with self._turn(required=False):
            return self._load()

    def _load(self) -> pd.DataFrame:
        frames = []
        if self.parquet_path.exists():
            try:
                with open(self.parquet_path, "rb") as f:  # one inode, even if a compaction renames over the path
                    frames.append(pd.read_parquet(f))
            except Exception as exc:
                raise CorruptResultsError(
                    f"{self.parquet_path}: unreadable Parquet ({exc}); "
                    "move it aside or restore it from git, nothing was changed"
                ) from exc
            missing = {KEY, "status"} - set(frames[0].columns)
            if missing:
                raise CorruptResultsError(
                    f"{self.parquet_path}: not a results file (no {', '.join(sorted(missing))} "
                    "column); move it aside or restore it from git, nothing was changed"
                )
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
        with self._turn():
            return self._compact()

    def _compact(self) -> pd.DataFrame:
        df = self._load()
        if len(df) == 0:
            return df
        with _writing_to(self.parquet_path), self._temporary() as tmp:
            try:
                df.to_parquet(tmp, compression="zstd", index=False)
            except (ValueError, TypeError, OverflowError, NotImplementedError) as exc:  # pyarrow's, by column
                # the row checks know their columns; two rows disagreeing on another one's type end here
                raise CorruptResultsError(
                    f"{self.journal_path}: its rows cannot be stored as Parquet ({str(exc)[:300]}); fix the rows "
                    "whose values differ in type from the rest of that column, nothing was changed"
                ) from None
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, self.parquet_path)
            # Only now may the journal go: every row in it is inside the renamed Parquet.
            with open(self.journal_path, "w") as f:
                f.flush()
                os.fsync(f.fileno())
        return df

    @contextlib.contextmanager
    def _temporary(self):
        """A temporary file beside the store, named for this writer alone; removed if not renamed."""
        fd, name = tempfile.mkstemp(dir=self.parquet_path.parent, prefix=f"{self.parquet_path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, 0o644)  # renamed over the store: readable by the other users of a shared data folder
        finally:
            os.close(fd)
        try:
            yield Path(name)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)

    def _read_journal(self) -> list[dict]:
        if not self.journal_path.exists():
            return []
        if not self.journal_path.is_file():  # a device or folder in its place: never read one
            raise CorruptResultsError(f"{self.journal_path}: not a regular file; move it aside, nothing was changed")
        raw = self.journal_path.read_bytes()
        lines = raw.split(b"\n")
        torn = lines.pop() if lines and lines[-1] else None  # last element is b"" when the file ends in \n
        rows = [
            row for number, line in enumerate(lines, start=1) if line.strip() for row in [self._parse_row(number, line)]
        ]
        if torn is not None:
            self._set_aside_torn_line(raw, torn)
        return rows

    def _parse_row(self, number: int, line: bytes) -> dict:
        where = f"{self.journal_path}:{number}"
        try:
            row = json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # bad UTF-8, bad JSON, absurd nesting or numbers
            raise CorruptResultsError(
                f"{where}: malformed row ({type(exc).__name__}: {str(exc)[:200]}); "
                "fix or remove that line, nothing was changed"
            ) from None
        problem = row_problem(row)
        if problem:
            raise CorruptResultsError(
                f"{where}: not a results row ({problem}); fix or remove that line, nothing was changed"
            )
        return row

    def _set_aside_torn_line(self, raw: bytes, torn: bytes) -> None:
        aside = self.journal_path.with_name(f"{self.journal_path.name}.torn-{int(time.time())}")
        with _writing_to(aside), self._temporary() as tmp:
            aside.write_bytes(torn)
            tmp.write_bytes(raw[: len(raw) - len(torn)])
            os.replace(tmp, self.journal_path)
        warnings.warn(
            f"{self.journal_path}: last line was cut off mid-write (a killed run); "
            f"moved its {len(torn)} bytes to {aside}",
            stacklevel=2,
        )


def _json_default(value):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in a results row")
