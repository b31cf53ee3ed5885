\set k random(1, 1000000000000)
INSERT INTO px.up AS c (key, n) VALUES (int8send(1::bigint), 1) ON CONFLICT (key) DO UPDATE SET n = c.n + 1 RETURNING n;
