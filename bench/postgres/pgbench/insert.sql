\set k random(1, 1000000000000)
INSERT INTO px.t AS b (policy, key, tokens, frac, stamp, capacity, rate_tokens, period_us, full_at) SELECT 'p', int8send(:k), 9, 0, n.now, 10, 1, 1000000, n.now + 1000000 FROM (SELECT coalesce(NULL::bigint, px.t_clock()) AS now) AS n WHERE current_setting('transaction_isolation') = 'read committed' ON CONFLICT (policy, key) DO NOTHING RETURNING stamp;
