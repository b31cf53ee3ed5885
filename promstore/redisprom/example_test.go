package redisprom_test

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/promstore"
	"github.com/sluicehq/sluice/promstore/redisprom"
	"github.com/sluicehq/sluice/redisstore"
)

// A Redis store's counters in the program's own registry, read at every
// scrape. Neither redisstore.New nor Register talks to Redis.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true, MaxRetries: -1})
	defer client.Close()
	rs, err := redisstore.New(client, redisstore.Options{})
	if err != nil {
		panic(err)
	}

	reg := prometheus.NewRegistry() // with promstore.New(rs, reg, ...) for the decisions
	if err := redisprom.Register(reg, promstore.Options{}, rs.Stats); err != nil {
		panic(err)
	}

	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		fmt.Println(mf.GetName(), mf.GetMetric()[0].GetCounter().GetValue())
	}
	// Output:
	// sluice_redisstore_conversions_total 0
	// sluice_redisstore_cross_slot_takes_total 0
	// sluice_redisstore_lost_refunds_total 0
	// sluice_redisstore_script_loads_total 0
}
