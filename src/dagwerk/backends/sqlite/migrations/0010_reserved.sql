-- Placeholder for schema version 10, which another branch defines; delete
-- this file when that branch's migration 0010 is merged.
SELECT 1;
