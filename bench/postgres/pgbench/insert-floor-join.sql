\set k random(1, 1000000000000)
\startpipeline
INSERT INTO px.t AS b (policy, key, tokens, frac, stamp, capacity, rate_tokens, period_us, full_at) SELECT 'p', int8send(:k), 9, 0, n.now, 10, 1, 1000000, CASE WHEN 1000000::bigint IS NULL OR n.now >= 9223372036854775807 - 1000000::bigint THEN NULL ELSE n.now + 1000000::bigint END FROM (SELECT m.now, set_config('sluice_pgstore.stamp', m.now::text, true) AS stamp FROM (SELECT coalesce(NULL::bigint, px.t_clock()) AS now) AS m) AS n WHERE n.stamp IS NOT NULL AND NOT EXISTS (SELECT FROM px.t AS e WHERE e.policy = 'p' AND e.key = int8send(:k)) AND current_setting('transaction_isolation') = 'read committed' ON CONFLICT (policy, key) DO NOTHING RETURNING stamp;
SELECT int8(concat('sluice pgstore: a new bucket stamped before the sweep floor ', f.floor_us)) FROM px.t AS b, px.t_floor AS f WHERE b.policy = 'p' AND b.key = int8send(:k) AND b.xmin = xid(pg_current_xact_id_if_assigned()) AND f.floor_us > b.stamp;
\endpipeline
