-- The bare upsert's table (upsert.sql). The store's tables come from
-- sluice migrate (sluice.yaml).
CREATE TABLE IF NOT EXISTS px.up (key bytea PRIMARY KEY, n bigint NOT NULL);
