"""The bounded on-disk spool: FIFO, reopening, the size cap, and setting entries aside."""

from __future__ import annotations

from pathlib import Path

from service.collectors.spool import Spool


def test_spool_is_fifo_and_survives_reopening(tmp_path: Path):
    path = tmp_path / "spool.sqlite"
    s = Spool(path, max_bytes=10_000)
    for i in range(3):
        s.push(f"batch-{i}".encode(), now=100.0 + i)
    s.close()
    s = Spool(path, max_bytes=10_000)
    assert s.depth == 3
    due = s.due(now=200.0, limit=10)
    assert [e.body for e in due] == [b"batch-0", b"batch-1", b"batch-2"]
    assert [e.created_at for e in due] == [100.0, 101.0, 102.0]
    s.remove(e.id for e in due)
    assert s.depth == 0 and s.bytes == 0


def test_spool_at_its_cap_drops_the_oldest_and_counts(tmp_path: Path):
    s = Spool(tmp_path / "spool.sqlite", max_bytes=1000)
    dropped = sum(s.push(bytes([i]) * 100, now=0.0) for i in range(15))
    assert dropped == 5 and s.dropped_total == 5
    assert s.depth == 10 and s.bytes == 1000
    first = s.due(now=0.0, limit=1)
    assert first and first[0].body == bytes([5]) * 100
    assert s.push(b"x" * 5000, now=0.0) == 1  # larger than the whole spool: dropped, counted
    assert s.depth == 10


def test_an_entry_set_aside_lets_newer_ones_go_first_and_comes_back(tmp_path: Path):
    s = Spool(tmp_path / "spool.sqlite")
    for i in range(3):
        s.push(bytes([i]), now=10.0 * i)
    head = s.due(now=30.0, limit=1)[0]
    s.note_server_errors([head.id], 3, not_before=100.0)
    assert [e.body for e in s.due(now=30.0, limit=10)] == [b"\x01", b"\x02"]
    again = s.due(now=100.0, limit=10)
    assert [(e.body, e.server_errors) for e in again] == [(b"\x00", 3), (b"\x01", 0), (b"\x02", 0)]
    s.close()
    reopened = Spool(tmp_path / "spool.sqlite")  # the set-aside state is on disk too
    assert [e.body for e in reopened.due(now=30.0, limit=10)] == [b"\x01", b"\x02"]


def test_a_spool_written_by_an_older_agent_gains_the_new_columns(tmp_path: Path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE batches (id INTEGER PRIMARY KEY AUTOINCREMENT,"
            " created_at REAL NOT NULL, size INTEGER NOT NULL, body BLOB NOT NULL)"
        )
        db.execute("INSERT INTO batches (created_at, size, body) VALUES (1.0, 3, x'616263')")
    s = Spool(path)
    assert [(e.body, e.server_errors) for e in s.due(now=2.0, limit=5)] == [(b"abc", 0)]


def test_polls_join_into_one_batch_without_parsing_even_with_tricky_text():
    import json

    from service.collectors.batch import join_polls, poll_json

    def poll(k: int, procs: int) -> dict:  # type: ignore[type-arg]
        return {
            "node": {"hostname": "n", "labels": {"samples": f'],"processes":[{k}', "x": "[]}"}},
            "gpus": [{"uuid": f"GPU-{k}"}],
            "samples": [{"gpu_uuid": "GPU-0", "ts": f"t{k}", "metrics": {"gpu_util": 0.5}}],
            "processes": [{"pid": k * 10 + i, "job_id": ',"samples":['} for i in range(procs)],
        }

    polls = [poll(1, 2), poll(2, 0), poll(3, 1)]
    joined = json.loads(join_polls([poll_json(p) for p in polls]))
    assert joined["node"] == polls[-1]["node"] and joined["gpus"] == polls[-1]["gpus"]
    assert [s["ts"] for s in joined["samples"]] == ["t1", "t2", "t3"]
    assert [p["pid"] for p in joined["processes"]] == [10, 11, 30]
    empty = [poll(4, 0) | {"samples": []}, poll(5, 0)]
    assert len(json.loads(join_polls([poll_json(p) for p in empty]))["samples"]) == 1
