-- dagwerk PostgreSQL schema, version 9: when each attempt started and settled.
--
-- ``started_at`` is the store time an attempt was claimed (set RUNNING),
-- ``finished_at`` the time it settled (completed, failed, crashed,
-- cancelled, waiting, or replaced while unfinished); the task row holds its
-- current attempt's, each archived attempt its own. ``started_at`` is NULL
-- for an attempt never claimed, ``finished_at`` while the attempt is queued
-- or running; both are NULL for every attempt stored before this version.

ALTER TABLE dagwerk_tasks ADD COLUMN started_at DOUBLE PRECISION;
ALTER TABLE dagwerk_tasks ADD COLUMN finished_at DOUBLE PRECISION;
ALTER TABLE dagwerk_attempts ADD COLUMN started_at DOUBLE PRECISION;
ALTER TABLE dagwerk_attempts ADD COLUMN finished_at DOUBLE PRECISION;
