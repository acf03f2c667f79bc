import os
import threading

import pandas as pd
import pytest

from collect.store import CorruptResultsError, ResultStore, StoreBusyError, StoreWriteError


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


@pytest.mark.parametrize(
    "line, rule",
    [
        (b"123", "a JSON int, not an object"),
        (b'{"foo": 1}', "no 'measurement_id' string"),
        (b'{"measurement_id": "m9", "status": "fine"}', "'status' is 'fine'"),
        (b"\xff\xfe\x00garbage", "malformed row"),
        (b"[" * 100_000, "malformed row"),
    ],
)
def test_a_journal_line_that_is_not_a_row_is_refused_naming_file_line_and_rule(tmp_path, line, rule):
    store = ResultStore(tmp_path / "s.parquet")
    store.append(_row(0))
    with open(store.journal_path, "ab") as f:
        f.write(line + b"\n")
    before = store.journal_path.read_bytes()
    with pytest.raises(CorruptResultsError, match=rf"s\.journal\.jsonl:2: .*{rule}"):
        store.load()
    assert store.journal_path.read_bytes() == before and not store.parquet_path.exists()


def test_a_parquet_file_without_the_key_columns_is_refused(tmp_path):
    store = ResultStore(tmp_path / "s.parquet")
    pd.DataFrame({"x": [1, 2]}).to_parquet(store.parquet_path)
    with pytest.raises(CorruptResultsError, match="no measurement_id, status column"):
        store.load()


def test_a_second_writer_is_refused_while_the_first_holds_the_store(tmp_path):
    first, second = ResultStore(tmp_path / "s.parquet"), ResultStore(tmp_path / "s.parquet")
    with first.writing():
        with pytest.raises(StoreBusyError, match=f"being written by pid {os.getpid()}"):
            with second.writing():
                pass
    with second.writing():  # free again once the first let go
        second.append(_row(0))


def test_concurrent_compactions_share_no_temporary_file(tmp_path):
    """Two handles on one store compacting at once (what two writers did) lose nothing and never collide."""
    stores = [ResultStore(tmp_path / "s.parquet") for _ in range(2)]
    errors = []

    def work(store, offset):
        try:
            for i in range(25):
                store.append(_row(offset + i))
                store.compact()
        except Exception as exc:  # noqa: BLE001 - collected and asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s, 100 * k)) for k, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert not list(tmp_path.glob("*.tmp"))
    assert sorted(stores[0].load()["measurement_id"]) == sorted(f"m{k}" for k in [*range(25), *range(100, 125)])


def test_a_full_disk_is_one_error_naming_the_path_and_keeps_what_was_stored(tmp_path):
    store = ResultStore(tmp_path / "s.parquet")
    store.append(_row(0))
    store.compact()
    store.journal_path.unlink()
    store.journal_path.symlink_to("/dev/full")  # every write: ENOSPC
    with pytest.raises(StoreWriteError, match=r"cannot write .*s\.journal\.jsonl: No space left on device"):
        store.append(_row(1))
    assert list(pd.read_parquet(store.parquet_path).measurement_id) == ["m0"]


@pytest.mark.parametrize(
    "change, rule",
    [
        ({"iter_time_s": "fast"}, "'iter_time_s' is 'fast', not a number or null"),
        ({"dp": "two"}, "'dp' is 'two', not a number or null"),
        ({"sequence_parallel": "no"}, "'sequence_parallel' is 'no', not true, false or null"),
        ({"peak_mem_bytes_per_rank": [1, "x"]}, "'peak_mem_bytes_per_rank' is \\[1, 'x'\\], not a list of numbers"),
        ({"host": {"name": "a"}}, "'host' is \\{'name': 'a'\\}, not a string or null"),
        ({"anything": 10**30}, r"'anything' is 10+, not a string, number, .* \(integers within 64 bits\)"),
        ({"iter_time_s": "x" * 100_000}, r"'iter_time_s' is 'x+\.\.\. \(100002 chars\), not a number"),
    ],
)
def test_a_journal_value_of_the_wrong_kind_is_refused_before_compaction(tmp_path, change, rule):
    store = ResultStore(tmp_path / "s.parquet")
    store.append(_row(0))
    store.append({**_row(1), **change})
    before = store.journal_path.read_bytes()
    with pytest.raises(CorruptResultsError, match=rf"s\.journal\.jsonl:2: not a results row \({rule}"):
        store.compact()
    assert store.journal_path.read_bytes() == before and not store.parquet_path.exists()


def test_rows_disagreeing_on_an_unknown_column_are_refused_by_the_compaction(tmp_path):
    store = ResultStore(tmp_path / "s.parquet")
    store.append({**_row(0), "note": 1.5})
    store.append({**_row(1), "note": "late"})
    before = store.journal_path.read_bytes()
    with pytest.raises(CorruptResultsError, match=r"s\.journal\.jsonl: its rows cannot be stored.*column note"):
        store.compact()
    assert store.journal_path.read_bytes() == before and not store.parquet_path.exists()
    assert not list(tmp_path.glob("*.tmp"))


def test_compacted_files_are_readable_by_the_other_users_of_a_shared_folder(tmp_path):
    store = ResultStore(tmp_path / "s.parquet")
    store.append(_row(0))
    store.compact()
    assert store.parquet_path.stat().st_mode & 0o777 == 0o644
    with open(store.journal_path, "a") as f:
        f.write('{"measurement_id": "m1", "sta')  # a torn line: the journal is rewritten without it
    with pytest.warns(UserWarning, match="cut off mid-write"):
        store.load()
    assert store.journal_path.stat().st_mode & 0o777 == 0o644
