\set k random(1, 1000000000000)
\startpipeline
INSERT INTO px.t AS b (policy, key, tokens, frac, stamp, capacity, rate_tokens, period_us, full_at) SELECT 'p', int8send(:k), 9, 0, n.now, 10, 1, 1000000, n.now + 1000000 FROM (SELECT coalesce(NULL::bigint, px.t_clock()) AS now) n WHERE current_setting('transaction_isolation') = 'read committed' ON CONFLICT (policy, key) DO NOTHING RETURNING stamp;
WITH fix AS (UPDATE px.t AS b SET stamp = f.floor_us FROM px.t_floor AS f WHERE b.policy = 'p' AND b.key = int8send(:k) AND b.xmin = xid(pg_current_xact_id_if_assigned()) AND f.floor_us > b.stamp RETURNING b.stamp) SELECT t.o_status, t.o_remaining, (SELECT stamp FROM fix) FROM (SELECT) AS one LEFT JOIN LATERAL (SELECT * FROM px.t_take('p', int8send(:k), 1, 10, 1, 1000000, 1, 1000000, 0, NULL, 0, NULL) WHERE NOT EXISTS (SELECT FROM px.t AS b WHERE b.policy = 'p' AND b.key = int8send(:k) AND b.xmin = xid(pg_current_xact_id_if_assigned()))) AS t ON true;
\endpipeline
