-- dagwerk PostgreSQL schema, version 17: a run that ends notifies.
--
-- A client waiting for a run (Engine.wait) reads its status again when a
-- run of its schema ends instead of only every poll interval: the update
-- that makes a run's status terminal notifies channel dagwerk_runs with the
-- schema as payload, delivered at commit.

CREATE FUNCTION dagwerk_notify_run_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dagwerk_runs', TG_TABLE_SCHEMA);
    RETURN NULL;
END;
$$;
CREATE TRIGGER dagwerk_runs_ended
    AFTER UPDATE OF status ON dagwerk_runs
    FOR EACH ROW WHEN (
        OLD.status IS DISTINCT FROM NEW.status
        AND NEW.status IN ('completed', 'failed', 'crashed', 'cancelled')
    )
    EXECUTE FUNCTION dagwerk_notify_run_end();
