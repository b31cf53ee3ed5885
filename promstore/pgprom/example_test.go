package pgprom_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/promstore"
	"github.com/sluicehq/sluice/promstore/pgprom"
)

// A PostgreSQL store's counters in the program's own registry, read at
// every scrape. Neither pgxpool.New, pgstore.New nor Register talks to the
// database.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/app")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	ps, err := pgstore.New(ctx, pool, pgstore.Options{})
	if err != nil {
		panic(err)
	}
	defer ps.Close()

	reg := prometheus.NewRegistry() // with promstore.New(ps, reg, ...) for the decisions
	if err := pgprom.Register(reg, promstore.Options{}, ps.Stats); err != nil {
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
	// sluice_pgstore_conversions_total 0
	// sluice_pgstore_insert_first_misses_total 0
	// sluice_pgstore_insert_first_total 0
	// sluice_pgstore_lock_timeouts_total 0
	// sluice_pgstore_lock_wait_seconds_total 0
	// sluice_pgstore_lock_waits_total 0
	// sluice_pgstore_shared_takes_total 0
	// sluice_pgstore_shared_transactions_total 0
	// sluice_pgstore_sweep_errors_total 0
	// sluice_pgstore_swept_buckets_total 0
	// sluice_pgstore_swept_request_ids_total 0
}
