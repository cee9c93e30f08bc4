-- Placeholder for schema version 11, which another branch defines; delete
-- this file when that branch's migration 0011 is merged.
SELECT 1;
