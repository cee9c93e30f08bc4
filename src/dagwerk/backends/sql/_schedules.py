"""Schedules, tick records and idempotency keys of the SQL store
(:class:`~dagwerk.store.ScheduleStore`, :class:`~dagwerk.store.IdempotentSubmitStore`).

A tick's record and its run are written in one write transaction; the
primary key of ``dagwerk_schedule_fires`` refuses a second record of the
tick, and the transaction then writes nothing.
"""

from __future__ import annotations

import uuid

from dagwerk.scheduling.definitions import FireSource, ScheduleDefinition
from dagwerk.store import InvalidStoreValueError
from dagwerk.store_schedules import (
    MAX_FIRES_LISTED,
    IdempotentRun,
    NamedLease,
    NewRun,
    ScheduleFire,
    ScheduleFireResult,
    ScheduleRecord,
    check_fire_request,
    check_idempotency_key,
    check_new_run,
)

from ._runs import RunsMixin
from .gateway import Row, Tx


class _RunExists(Exception):
    """Rolls back a write whose new run's ID is taken."""


def _record(row: Row) -> ScheduleRecord:
    return ScheduleRecord(
        schedule_id=row["schedule_id"],
        definition=ScheduleDefinition.from_json(row["definition"]),
        paused=bool(row["paused"]),
        cursor=float(row["tick_cursor"]),
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
    )


def _fire(row: Row) -> ScheduleFire:
    return ScheduleFire(
        schedule_id=row["schedule_id"],
        schedule_name=row["schedule_name"],
        tick=int(row["tick"]),
        run_id=row["run_id"],
        source=FireSource(row["source"]),
        fired_at=float(row["fired_at"]),
    )


def _check_definition(definition: object) -> ScheduleDefinition:
    if not isinstance(definition, ScheduleDefinition):
        raise InvalidStoreValueError("definition must be a ScheduleDefinition", field="definition")
    return definition


class SchedulesMixin(RunsMixin):
    def put_schedule(
        self, definition: ScheduleDefinition, *, replace: bool
    ) -> ScheduleRecord | None:
        _check_definition(definition)
        params: dict[str, object] = {
            "schedule_id": uuid.uuid4().hex,
            "name": definition.name,
            "definition": definition.to_json(),
        }
        with self._gw.write() as tx:
            params["now"] = self._now()
            if tx.run("schedule_insert", params) != 1:
                if not replace:
                    return None
                tx.run("schedule_replace", params)
            row = tx.one("schedule_get", {"name": definition.name})
            assert row is not None
            return _record(row)

    def get_schedule(self, name: str) -> ScheduleRecord | None:
        if not isinstance(name, str):
            return None
        with self._gw.read() as tx:
            row = tx.one("schedule_get", {"name": name})
            return None if row is None else _record(row)

    def list_schedules(self) -> list[ScheduleRecord]:
        with self._gw.read() as tx:
            return [_record(row) for row in tx.all("schedule_list")]

    def set_schedule_paused(self, name: str, paused: bool) -> ScheduleRecord | None:
        if not isinstance(paused, bool):
            raise InvalidStoreValueError("paused must be a bool", field="paused")
        if not isinstance(name, str):
            return None
        with self._gw.write() as tx:
            params = {"name": name, "now": self._now()}
            if paused:
                tx.run("schedule_pause", params)
            else:
                tx.run("schedule_resume", params)
            row = tx.one("schedule_get", {"name": name})
            return None if row is None else _record(row)

    def delete_schedule(self, name: str) -> bool:
        if not isinstance(name, str):
            return False
        with self._gw.write() as tx:
            row = tx.one("schedule_get", {"name": name})
            if row is None:
                return False
            ids = {"schedule_id": row["schedule_id"]}
            tx.run("schedule_fires_delete", ids)
            return tx.run("schedule_delete", ids) == 1

    def fire_schedule_tick(
        self,
        schedule_id: str,
        tick: int,
        *,
        source: FireSource | str,
        run: NewRun | None,
        advance_cursor: bool,
    ) -> ScheduleFireResult:
        kind = check_fire_request(schedule_id, tick, source)
        rows = None
        if run is not None:
            check_new_run(run)
            rows = self.run_rows(
                run.run_id,
                list(run.nodes),
                run_input=run.run_input,
                failure_policy=run.failure_policy,
                pipeline=run.pipeline,
            )
        key = {"schedule_id": schedule_id, "tick": tick}
        try:
            with self._gw.write() as tx:
                schedule = tx.one("schedule_lock", {"schedule_id": schedule_id})
                if schedule is None:
                    return ScheduleFireResult(False, None)
                inserted = tx.run(
                    "schedule_fire_insert",
                    {
                        **key,
                        "schedule_name": schedule["name"],
                        "run_id": None if run is None else run.run_id,
                        "source": kind.value,
                        "now": self._now(),
                    },
                )
                if inserted != 1:
                    found = tx.one("schedule_fire_get", key)
                    assert found is not None
                    return ScheduleFireResult(False, _fire(found))
                if rows is not None and not self.insert_run(tx, rows):
                    raise _RunExists
                if advance_cursor:
                    tx.run("schedule_cursor_advance", key)
                fire = tx.one("schedule_fire_get", key)
                assert fire is not None
                return ScheduleFireResult(True, _fire(fire))
        except _RunExists:
            assert run is not None
            raise InvalidStoreValueError(f"run {run.run_id!r} exists", field="run_id") from None

    def advance_schedule_cursor(self, schedule_id: str, tick: float) -> bool:
        if not isinstance(schedule_id, str) or not isinstance(tick, int | float):
            return False
        with self._gw.write() as tx:
            return (
                tx.run("schedule_cursor_advance", {"schedule_id": schedule_id, "tick": tick}) == 1
            )

    def list_schedule_fires(
        self,
        schedule_id: str,
        *,
        limit: int = 50,
        source: FireSource | str | None = None,
        since: int | None = None,
        until: int | None = None,
    ) -> list[ScheduleFire]:
        if type(limit) is not int or not 1 <= limit <= MAX_FIRES_LISTED:
            raise InvalidStoreValueError(
                f"limit must be an int from 1 to {MAX_FIRES_LISTED}",
                field="limit",
                limit=MAX_FIRES_LISTED,
            )
        kind = None if source is None else FireSource(source).value
        params = {
            "schedule_id": schedule_id,
            "limit": limit,
            "source": kind,
            "since": since,
            "until": until,
        }
        with self._gw.read() as tx:
            return [_fire(row) for row in tx.all("schedule_fires_list", params)]

    def get_run_fire(self, run_id: str) -> ScheduleFire | None:
        if not isinstance(run_id, str):
            return None
        with self._gw.read() as tx:
            row = tx.one("schedule_run_fire", {"run_id": run_id})
            return None if row is None else _fire(row)

    def get_lease(self, name: str) -> NamedLease | None:
        if not isinstance(name, str):
            return None
        with self._gw.read() as tx:
            row = tx.one("lease_get", {"name": name, "now": self._now()})
            if row is None:
                return None
            return NamedLease(row["name"], row["holder"], float(row["expires_at"]))

    # --- idempotent submits ----------------------------------------------------------

    def create_run_once(
        self, key: str, fingerprint: str, run: NewRun, *, retention: float
    ) -> IdempotentRun:
        seconds = check_idempotency_key(key, fingerprint, retention)
        check_new_run(run)
        rows = self.run_rows(
            run.run_id,
            list(run.nodes),
            run_input=run.run_input,
            failure_policy=run.failure_policy,
            pipeline=run.pipeline,
        )
        try:
            with self._gw.write() as tx:
                now = self._now()
                tx.run("idempotency_expired_delete", {"key": key, "now": now})
                inserted = tx.run(
                    "idempotency_insert",
                    {
                        "key": key,
                        "fingerprint": fingerprint,
                        "run_id": run.run_id,
                        "now": now,
                        "expires": now + seconds,
                    },
                )
                if inserted != 1:
                    return self._held_key(tx, key)
                if not self.insert_run(tx, rows):
                    raise _RunExists
                return IdempotentRun(run.run_id, True, fingerprint)
        except _RunExists:
            raise InvalidStoreValueError(f"run {run.run_id!r} exists", field="run_id") from None

    def _held_key(self, tx: Tx, key: str) -> IdempotentRun:
        row = tx.one("idempotency_get", {"key": key})
        assert row is not None
        return IdempotentRun(row["run_id"], False, row["fingerprint"])

    def purge_idempotency_keys(self, limit: int = 1_000) -> int:
        if type(limit) is not int or limit < 1:
            raise InvalidStoreValueError("limit must be an int >= 1", field="limit")
        with self._gw.write() as tx:
            return tx.run("idempotency_purge", {"now": self._now(), "limit": limit})
