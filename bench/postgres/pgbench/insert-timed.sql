\set k random(1, 1000000000000)
\startpipeline
WITH n AS MATERIALIZED (SELECT coalesce(NULL::bigint, px.t_clock()) AS now, clock_timestamp() AS t0, current_setting('transaction_isolation') = 'read committed' AND NOT EXISTS (SELECT FROM px.t AS e WHERE e.policy = 'p' AND e.key = int8send(:k)) AS missing),
ins AS (INSERT INTO px.t AS b (policy, key, tokens, frac, stamp, capacity, rate_tokens, period_us, full_at) SELECT 'p', int8send(:k), 9, 0, n.now, 10, 1, 1000000, CASE WHEN 1000000::bigint IS NULL OR n.now >= 9223372036854775807 - 1000000 THEN NULL ELSE n.now + 1000000 END FROM n WHERE n.missing ON CONFLICT (policy, key) DO NOTHING RETURNING b.stamp)
SELECT (SELECT stamp FROM ins), CASE WHEN NOT n.missing OR EXISTS (SELECT FROM ins) THEN 0 ELSE greatest((extract(epoch FROM clock_timestamp() - n.t0) * 1000000)::bigint, 0) END FROM n;
UPDATE px.t AS b SET stamp = f.floor_us FROM px.t_floor AS f WHERE b.policy = 'p' AND b.key = int8send(:k) AND b.xmin = xid(pg_current_xact_id_if_assigned()) AND f.floor_us > b.stamp RETURNING b.stamp;
\endpipeline
