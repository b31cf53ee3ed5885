\set k1 random(1, 1000000000000)
\set k2 random(1, 1000000000000)
\set k3 random(1, 1000000000000)
\set k4 random(1, 1000000000000)
\startpipeline
SELECT o_status, o_remaining FROM px.t_take('bench', int8send(:k1), 1, 1099511627776, 1073741824, 1000000, 16777216, 15625, 0, NULL, 0, NULL);
SELECT o_status, o_remaining FROM px.t_take('bench', int8send(:k2), 1, 1099511627776, 1073741824, 1000000, 16777216, 15625, 0, NULL, 0, NULL);
SELECT o_status, o_remaining FROM px.t_take('bench', int8send(:k3), 1, 1099511627776, 1073741824, 1000000, 16777216, 15625, 0, NULL, 0, NULL);
SELECT o_status, o_remaining FROM px.t_take('bench', int8send(:k4), 1, 1099511627776, 1073741824, 1000000, 16777216, 15625, 0, NULL, 0, NULL);
\endpipeline
