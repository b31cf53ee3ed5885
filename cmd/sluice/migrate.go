package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/pgstore"
)

// migrateCommand runs "sluice migrate -config FILE": it creates or upgrades
// the PostgreSQL schema of the config's store (pgstore's Migrate). serve
// never migrates: the role that serves decisions need not be allowed to
// create tables, and an upgrade of the schema is a step of a deployment, run
// once, not a side effect of every instance's start. Other stores need no
// migration; for them it says so and succeeds.
var migrateHelp = help{
	usage: "sluice migrate -config FILE",
	about: `Creates or upgrades the PostgreSQL schema of the config's store; other
stores need none. Reads the config file (and PGPASSWORD, as libpq does).`,
	example: "sluice migrate -config /etc/sluice/sluice.yaml",
	exit:    "0 migrated (or nothing to migrate); 2 a bad config or a failed migration",
}

func migrateCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	quiet(fs)
	path := fs.String("config", "", "the YAML config file of the service (docs/config.md)")
	if err := fs.Parse(args); err != nil {
		return migrateHelp.parseErr(err, "migrate", fs, stdout)
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("migrate takes no arguments, got %q", fs.Args())
	}
	if *path == "" {
		return fmt.Errorf("migrate needs -config: the file naming the store")
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	if cfg.Store.Type != config.StorePostgres {
		fmt.Fprintf(stdout, "sluice: the %s store needs no migration\n", cfg.Store.Type)
		return nil
	}
	rt := &runtime{cfg: cfg}
	defer rt.close()
	// No sweeper: the tables may not exist yet.
	st, _, err := openStore(ctx, cfg, rt, false)
	if err != nil {
		return err
	}
	if err := st.(*pgstore.Store).Migrate(ctx); err != nil {
		return fmt.Errorf("store.postgres: %w", err)
	}
	fmt.Fprintf(stdout, "sluice: schema %s of %s is at version %d, table %s\n",
		cfg.Store.Postgres.Schema, cfg.Store.Postgres.URL, pgstore.SchemaVersion, cfg.Store.Postgres.Table)
	return nil
}
