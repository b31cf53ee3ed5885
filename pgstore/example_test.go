package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/pgstore"
)

func Example() {
	ctx := context.Background()
	o := pgstore.Options{Schema: "sluice_example"}
	pc, err := pgxpool.ParseConfig(os.Getenv("SLUICE_POSTGRES_URL"))
	if err != nil {
		log.Fatal(err)
	}
	// Each new connection is readied for decisions before it serves.
	if pc.AfterConnect, err = pgstore.AfterConnect(o); err != nil {
		log.Fatal(err)
	}
	// The pool is the store's own: its sessions carry the timeouts, so
	// that no statement setting them precedes a decision.
	if err := pgstore.SessionTimeouts(pc, o); err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgstore.New(ctx, pool, o)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	// Once per deployment (idempotent): tables, indexes and functions.
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	limit := sluice.Limit{Capacity: 5, Rate: sluice.Per(1, time.Minute)}
	for range 2 {
		d, err := store.Take(ctx, sluice.Request{Policy: "export", Key: "user-42", Cost: 3, Limit: limit})
		if errors.Is(err, sluice.ErrUnavailable) {
			// No decision: the database is down or timed out. Apply a
			// failure policy; this is not a denial.
			log.Print(err)
			continue
		}
		if err != nil {
			// A bad parameter, or a deployment mistake such as a schema
			// that was never migrated (sluice.ErrMisconfigured): no
			// failure policy should decide in the store's place.
			log.Fatal(err)
		}
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter.Round(time.Second))
	}
	// Output:
	// true 2 0s
	// false 2 1m0s
}
