"""Schedules, tick records and idempotency keys of the in-memory store (the
reference for :class:`~dagwerk.store.ScheduleStore` and
:class:`~dagwerk.store.IdempotentSubmitStore`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any

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

from ._gated import GatedMixin
from ._runs import RunsMixin


@dataclass(frozen=True, slots=True)
class HeldKey:
    """An idempotency key's run, and until when the key names it."""

    fingerprint: str
    run_id: str
    expires_at: float


def _check_definition(definition: object) -> ScheduleDefinition:
    if not isinstance(definition, ScheduleDefinition):
        raise InvalidStoreValueError("definition must be a ScheduleDefinition", field="definition")
    return definition


def _check_limit(limit: object) -> int:
    if type(limit) is not int or not 1 <= limit <= MAX_FIRES_LISTED:
        raise InvalidStoreValueError(
            f"limit must be an int from 1 to {MAX_FIRES_LISTED}",
            field="limit",
            limit=MAX_FIRES_LISTED,
        )
    return limit


class SchedulesMixin(RunsMixin, GatedMixin):
    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self._schedules: dict[str, ScheduleRecord] = {}
        # schedule_id -> tick -> fire
        self._fires: dict[str, dict[int, ScheduleFire]] = {}
        self._run_fires: dict[str, ScheduleFire] = {}
        self._keys: dict[str, HeldKey] = {}

    def put_schedule(
        self, definition: ScheduleDefinition, *, replace: bool
    ) -> ScheduleRecord | None:
        _check_definition(definition)
        with self._lock:
            now = float(self._clock())
            found = self._schedules.get(definition.name)
            if found is not None:
                if not replace:
                    return None
                record = _replaced(found, definition, now)
            else:
                record = ScheduleRecord(
                    schedule_id=uuid.uuid4().hex,
                    definition=definition,
                    paused=False,
                    cursor=now,
                    created_at=now,
                    updated_at=now,
                )
                self._fires[record.schedule_id] = {}
            self._schedules[definition.name] = record
            return record

    def get_schedule(self, name: str) -> ScheduleRecord | None:
        with self._lock:
            return self._schedules.get(name)

    def list_schedules(self) -> list[ScheduleRecord]:
        with self._lock:
            return [self._schedules[name] for name in sorted(self._schedules)]

    def set_schedule_paused(self, name: str, paused: bool) -> ScheduleRecord | None:
        if not isinstance(paused, bool):
            raise InvalidStoreValueError("paused must be a bool", field="paused")
        with self._lock:
            found = self._schedules.get(name)
            if found is None or found.paused is paused:
                return found
            now = float(self._clock())
            cursor = found.cursor if paused else max(found.cursor, now)
            record = replace(found, paused=paused, cursor=cursor, updated_at=now)
            self._schedules[name] = record
            return record

    def delete_schedule(self, name: str) -> bool:
        with self._lock:
            found = self._schedules.pop(name, None)
            if found is None:
                return False
            for fire in self._fires.pop(found.schedule_id, {}).values():
                if fire.run_id is not None:
                    self._run_fires.pop(fire.run_id, None)
            return True

    def _schedule_by_id(self, schedule_id: str) -> ScheduleRecord | None:
        for record in self._schedules.values():
            if record.schedule_id == schedule_id:
                return record
        return None

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
        if run is not None:
            check_new_run(run)
        with self._lock:
            record = self._schedule_by_id(schedule_id)
            if record is None:
                return ScheduleFireResult(False, None)
            fires = self._fires[schedule_id]
            if tick in fires:
                return ScheduleFireResult(False, fires[tick])
            if run is not None and not self._create_new_run(run):
                raise InvalidStoreValueError(f"run {run.run_id!r} exists", field="run_id")
            fire = ScheduleFire(
                schedule_id=schedule_id,
                schedule_name=record.name,
                tick=tick,
                run_id=None if run is None else run.run_id,
                source=kind,
                fired_at=float(self._clock()),
            )
            fires[tick] = fire
            if fire.run_id is not None:
                self._run_fires[fire.run_id] = fire
            if advance_cursor and record.cursor < tick:
                self._schedules[record.name] = replace(record, cursor=float(tick))
            return ScheduleFireResult(True, fire)

    def _create_new_run(self, run: NewRun) -> bool:
        # The lock is re-entrant: create_run joins this call's transaction,
        # and validates before it writes.
        return self.create_run(
            run.run_id,
            list(run.nodes),
            run_input=run.run_input,
            failure_policy=run.failure_policy,
            pipeline=run.pipeline,
        )

    def advance_schedule_cursor(self, schedule_id: str, tick: float) -> bool:
        with self._lock:
            record = self._schedule_by_id(schedule_id)
            if record is None or not record.cursor < tick:
                return False
            self._schedules[record.name] = replace(record, cursor=float(tick))
            return True

    def list_schedule_fires(
        self,
        schedule_id: str,
        *,
        limit: int = 50,
        source: FireSource | str | None = None,
        since: int | None = None,
        until: int | None = None,
    ) -> list[ScheduleFire]:
        _check_limit(limit)
        kind = None if source is None else FireSource(source)
        with self._lock:
            fires = self._fires.get(schedule_id, {})
            found = [
                fire
                for tick, fire in sorted(fires.items(), reverse=True)
                if (kind is None or fire.source is kind)
                and (since is None or tick >= since)
                and (until is None or tick <= until)
            ]
            return found[:limit]

    def get_run_fire(self, run_id: str) -> ScheduleFire | None:
        with self._lock:
            return self._run_fires.get(run_id)

    def get_lease(self, name: str) -> NamedLease | None:
        with self._lock:
            current = self._leases.get(name)
            if current is None or current[1] <= float(self._clock()):
                return None
            return NamedLease(name, current[0], current[1])

    # --- idempotent submits ----------------------------------------------------------

    def create_run_once(
        self, key: str, fingerprint: str, run: NewRun, *, retention: float
    ) -> IdempotentRun:
        seconds = check_idempotency_key(key, fingerprint, retention)
        check_new_run(run)
        with self._lock:
            now = float(self._clock())
            held = self._keys.get(key)
            if held is not None and held.expires_at > now:
                return IdempotentRun(held.run_id, False, held.fingerprint)
            if not self._create_new_run(run):
                raise InvalidStoreValueError(f"run {run.run_id!r} exists", field="run_id")
            self._keys[key] = HeldKey(fingerprint, run.run_id, now + seconds)
            return IdempotentRun(run.run_id, True, fingerprint)

    def purge_idempotency_keys(self, limit: int = 1_000) -> int:
        if type(limit) is not int or limit < 1:
            raise InvalidStoreValueError("limit must be an int >= 1", field="limit")
        with self._lock:
            now = float(self._clock())
            expired = [key for key, held in self._keys.items() if held.expires_at <= now][:limit]
            for key in expired:
                del self._keys[key]
            return len(expired)


def _replaced(found: ScheduleRecord, definition: ScheduleDefinition, now: float) -> ScheduleRecord:
    return replace(found, definition=definition, updated_at=now)
