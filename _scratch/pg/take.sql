\set k random(1, 1000000000000)
SELECT o_status, o_remaining FROM px.t_take('p', int8send(:k), 1, 10, 1, 1000000, 1, 1000000, 0, NULL, 0, NULL);
