-- dagwerk PostgreSQL schema, version 16: inserts wake idle workers only for
-- rows they could claim.
--
-- A launch that claims its child for the launching worker inserts the
-- delivery already leased (lease_owner set). Waking the other idle workers
-- for it costs each of them an empty lease attempt, so the insert trigger
-- notifies only when the statement inserted at least one unleased row. It
-- stays a statement trigger, reading the inserted rows from a transition
-- table, so a 1,000-row launch still sends one notification. A leased row
-- whose lease expires is found by the workers' slow poll, as an expired
-- lease always is.

CREATE FUNCTION dagwerk_notify_claimable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted_rows WHERE lease_owner IS NULL) THEN
        PERFORM pg_notify('dagwerk_work', TG_TABLE_SCHEMA);
    END IF;
    RETURN NULL;
END;
$$;
DROP TRIGGER dagwerk_deliveries_inserted ON dagwerk_deliveries;
CREATE TRIGGER dagwerk_deliveries_inserted
    AFTER INSERT ON dagwerk_deliveries
    REFERENCING NEW TABLE AS inserted_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dagwerk_notify_claimable();
