\set k random(1, 1000000000000)
\startpipeline
INSERT INTO px.t AS b (policy, key, tokens, frac, stamp, capacity, rate_tokens, period_us, full_at) SELECT 'p', int8send(:k), 9, 0, n.now, 10, 1, 1000000, CASE WHEN 1000000::bigint IS NULL OR n.now >= 9223372036854775807 - 1000000::bigint THEN NULL ELSE n.now + 1000000::bigint END FROM (SELECT coalesce(NULL::bigint, px.t_clock()) AS now) AS n WHERE NOT EXISTS (SELECT FROM px.t AS e WHERE e.policy = 'p' AND e.key = int8send(:k)) AND current_setting('transaction_isolation') = 'read committed' ON CONFLICT (policy, key) DO NOTHING RETURNING stamp;
UPDATE px.t AS b SET stamp = f.floor_us, full_at = CASE WHEN 1000000::bigint IS NULL OR f.floor_us >= 9223372036854775807 - 1000000::bigint THEN NULL ELSE f.floor_us + 1000000::bigint END FROM px.t_floor AS f WHERE b.policy = 'p' AND b.key = int8send(:k) AND b.xmin = xid(pg_current_xact_id_if_assigned()) AND f.floor_us > b.stamp RETURNING b.stamp;
\endpipeline
