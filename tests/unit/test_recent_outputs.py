"""The outputs a SQL store committed lately (``backends/sql/_recent.py``):
kept within a byte budget, answered only whole, and used by the worker so a
claimed task's inputs are not read again."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from dagwerk.backends.sql._recent import ENTRY_BYTES, RecentOutputs
from dagwerk.backends.sqlite import SqliteStore
from dagwerk.backends.sqlite import gateway as sqlite_gateway
from dagwerk.engine import Engine
from dagwerk.testing.helpers import chain


def _row(output_id: str, data: str = "{}", run_id: str = "r") -> dict[str, object]:
    return {"run_id": run_id, "output_id": output_id, "fields": "{}", "data": data}


def _add(recent: RecentOutputs, rows: list[dict[str, object]]) -> None:
    recent.add(recent.keepable(rows))


def test_whole_answers_only() -> None:
    recent = RecentOutputs()
    _add(recent, [_row("a"), _row("b", '{"x":1}')])
    assert recent.get("r", ["b", "a"]) == {"b": ("{}", '{"x":1}'), "a": ("{}", "{}")}
    assert recent.get("r", ["a", "c"]) is None  # one missing: the caller reads all
    assert recent.get("other", ["a"]) is None
    assert recent.get("r", []) == {}


def test_the_oldest_go_first_beyond_the_budget() -> None:
    each = 2 + 8 + 1 + ENTRY_BYTES  # fields, data, ID and the objects
    recent = RecentOutputs(max_bytes=4 * each, max_output_bytes=each)
    for name in "abcde":
        _add(recent, [_row(name, "x" * 8)])
    assert recent.size == 4 * each and len(recent) == 4
    assert recent.get("r", ["a"]) is None
    assert recent.get("r", ["b", "e"]) is not None
    # A repeat replaces its entry without counting twice.
    _add(recent, [_row("e", "x" * 8)])
    assert recent.size == 4 * each and len(recent) == 4


def test_a_batch_larger_than_the_budget_keeps_only_its_newest_outputs() -> None:
    each = 2 + 8 + 2 + ENTRY_BYTES
    recent = RecentOutputs(max_bytes=3 * each, max_output_bytes=each)
    rows = [_row(f"o{n}", "x" * 8) for n in range(10)]
    kept = recent.keepable(rows)
    # Taken before the commit: only what would stay, not the whole batch.
    assert [key[1] for key, _ in kept] == ["o7", "o8", "o9"]
    recent.add(kept)
    assert recent.get("r", ["o7", "o8", "o9"]) is not None
    assert recent.get("r", ["o6"]) is None


def test_large_or_malformed_outputs_are_not_kept() -> None:
    recent = RecentOutputs(max_bytes=10_000, max_output_bytes=ENTRY_BYTES + 20)
    _add(recent, [_row("big", "x" * 30), {"run_id": "r", "output_id": "odd", "fields": None}])
    _add(recent, [{"run_id": "r", "output_id": "n", "fields": "{}", "data": None}])
    assert len(recent) == 0 and recent.size == 0


def test_after_commit_outside_a_unit_says_nothing_is_pending(tmp_path: Path) -> None:
    with SqliteStore(str(tmp_path / "db.sqlite")) as store:
        gateway = store._sqlite
        assert gateway.after_commit(lambda: None) is False
        ran: list[str] = []
        with store.unit_of_work():
            # Before the unit's first write nothing is pending either.
            assert gateway.after_commit(lambda: ran.append("early")) is False
            with gateway.write() as tx:
                tx._conn.execute("CREATE TABLE scratch (a)")
            assert gateway.after_commit(lambda: ran.append("late")) is True
            assert ran == []
        assert ran == ["late"]


def test_an_action_that_raises_after_the_commit_does_not_undo_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with SqliteStore(str(tmp_path / "db.sqlite")) as store:
        gateway = store._sqlite
        ran: list[str] = []

        def broken() -> None:
            raise RuntimeError("cache full of bees")

        with store.unit_of_work():
            assert store.create_run("r1", chain(1))
            assert gateway.after_commit(broken)
            assert gateway.after_commit(lambda: ran.append("next"))
        assert ran == ["next"]
        assert store.get_run_status("r1") is not None
        assert "after a unit of work's commit failed" in caplog.text


def test_a_worker_reads_no_inputs_it_committed_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts: Counter[str] = Counter()
    execute = sqlite_gateway._Tx._execute

    def counted(self: sqlite_gateway._Tx, name: str, params: object) -> object:
        counts[name] += 1
        return execute(self, name, params)  # type: ignore[arg-type]

    monkeypatch.setattr(sqlite_gateway._Tx, "_execute", counted)
    engine = Engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    seen: list[object] = []
    for name in ("n0", "n1", "n2", "n3"):

        def step(inputs: object, ctx: object, name: str = name) -> list[dict[str, object]]:
            seen.append(inputs)
            return [{"from": name}]

        engine.plugin(name)(step)
    run_id = engine.submit(chain(4))
    worker = engine.worker(concurrency=1)
    assert worker.run_until_idle() >= 0
    assert str(engine.store.get_run_status(run_id)) == "completed"
    # Three children, each fed by its parent's output: none read it back.
    assert counts["outputs_resolve"] == 0, counts
    assert len(seen) == 4
    engine.close()
