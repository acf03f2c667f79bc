import pandas as pd
import pytest

from collect.store import CorruptResultsError, ResultStore


def _row(i: int, status: str = "ok") -> dict:
    return {"measurement_id": f"m{i}", "status": status, "iter_time_s": 0.1 * i, "peak_mem_bytes_per_rank": [i, i]}


def test_append_load_compact_roundtrip(tmp_path):
    store = ResultStore(tmp_path / "s.parquet")
    for i in range(3):
        store.append(_row(i))
    assert len(store.load()) == 3 and not store.parquet_path.exists()
    store.compact()
    assert store.parquet_path.exists() and store.journal_path.read_text() == ""
    store.append(_row(3, status="error"))
    df = store.load()
    assert list(df.measurement_id) == ["m0", "m1", "m2", "m3"]
    assert store.done_ids() == {"m0", "m1", "m2"}  # errors are retried on resume


def test_row_in_both_files_is_read_once(tmp_path):
    """A crash between the Parquet rename and the journal truncation leaves duplicates."""
    store = ResultStore(tmp_path / "s.parquet")
    store.append(_row(0))
    pd.DataFrame([_row(0)]).to_parquet(store.parquet_path)
    assert len(store.load()) == 1


def test_torn_last_line_is_set_aside_not_dropped(tmp_path):
    store = ResultStore(tmp_path / "s.parquet")
    store.append(_row(0))
    with open(store.journal_path, "a") as f:
        f.write('{"measurement_id": "m1", "sta')  # killed mid-write
    with pytest.warns(UserWarning, match="cut off mid-write"):
        df = store.load()
    assert list(df.measurement_id) == ["m0"]
    (aside,) = tmp_path.glob("s.journal.jsonl.torn-*")
    assert aside.read_text() == '{"measurement_id": "m1", "sta'
    store.append(_row(2))  # the journal is whole again
    assert list(store.load().measurement_id) == ["m0", "m2"]


def test_malformed_middle_line_is_reported_with_path_and_line(tmp_path):
    store = ResultStore(tmp_path / "s.parquet")
    store.append(_row(0))
    with open(store.journal_path, "a") as f:
        f.write("not json\n")
    store.append(_row(2))
    before = store.journal_path.read_bytes()
    with pytest.raises(CorruptResultsError, match=r"s\.journal\.jsonl:2: malformed row"):
        store.load()
    assert store.journal_path.read_bytes() == before  # nothing overwritten


def test_corrupt_parquet_is_reported_and_left_alone(tmp_path):
    store = ResultStore(tmp_path / "s.parquet")
    store.parquet_path.write_bytes(b"PAR1 truncated garbage")
    with pytest.raises(CorruptResultsError, match=r"s\.parquet: unreadable Parquet"):
        store.done_ids()
    assert store.parquet_path.read_bytes() == b"PAR1 truncated garbage"
