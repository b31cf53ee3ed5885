SELECT o_status, o_remaining FROM px.t_take('bench', int8send(2::bigint), 1, 1099511627776, 1073741824, 1000000, 16777216, 15625, 0, NULL, 0, NULL);
