package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/envoyconf"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/redisstore"
)

var configHelp = help{
	usage: "sluice config check FILE",
	about: `Validates a sluice serve config file and prints what it would run: the
listeners, the store, the failure mode, each policy, each Envoy rule with
its token bucket, and warnings. Reads FILE and the envoyproxy/ratelimit
files its envoy.config names; it connects to nothing.`,
	example: "sluice config check /etc/sluice/sluice.yaml",
	exit:    "0 valid (warnings are printed, not failed); 2 not valid, every problem printed with its line",
}

// configCommand runs "sluice config check FILE".
func configCommand(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("config check", flag.ContinueOnError)
	quiet(fs)
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		return configHelp.parseErr(flag.ErrHelp, "config check", fs, stdout)
	}
	if len(args) == 0 || args[0] != "check" {
		return errors.New(`config: the only subcommand is "check": sluice config check FILE`)
	}
	if err := fs.Parse(args[1:]); err != nil {
		return configHelp.parseErr(err, "config check", fs, stdout)
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("config check takes one file, got %d arguments", fs.NArg())
	}
	cfg, err := config.Load(fs.Arg(0))
	if err != nil {
		for _, e := range config.Errors(err) {
			fmt.Fprintln(stderr, e)
		}
		if len(config.Errors(err)) == 0 {
			fmt.Fprintln(stderr, err)
		}
		return fmt.Errorf("%s is not a valid config", fs.Arg(0))
	}
	rules, err := loadEnvoy(&cfg)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return fmt.Errorf("%s is not a valid config", fs.Arg(0))
	}
	if _, err := policyTable(exactness(cfg.Store.Type), cfg, rules); err != nil {
		fmt.Fprintln(stderr, err)
		return fmt.Errorf("%s is not a valid config", fs.Arg(0))
	}
	if err := cfg.Describe(stdout); err != nil {
		return err
	}
	if rules != nil {
		describeRules(stdout, rules)
	}
	for _, w := range cfg.Warnings() {
		fmt.Fprintln(stdout, "warning:", w)
	}
	return nil
}

// exactness returns a store of the given type that can only check limits:
// the shared stores' CheckLimit reads none of the store's state, so an
// unconnected value answers for every instance.
func exactness(t config.StoreType) sluice.Store {
	switch t {
	case config.StoreRedis:
		return (*redisstore.Store)(nil)
	case config.StorePostgres:
		return (*pgstore.Store)(nil)
	}
	return nil
}

// describeRules writes each Envoy rule with its translation to a token
// bucket, then how the buckets behave unlike envoyproxy/ratelimit's
// windows.
func describeRules(w io.Writer, rules *envoyconf.Config) {
	rs := rules.Rules()
	fmt.Fprintf(w, "envoy rules: %d in %d %s\n", len(rs), len(rules.Domains()), plural(len(rules.Domains()), "domain", "domains"))
	for _, r := range rs {
		fmt.Fprintf(w, "  %s\n", r.Describe())
	}
	for _, warning := range rules.Warnings() {
		fmt.Fprintln(w, "warning:", warning)
	}
	fmt.Fprintln(w, "unlike envoyproxy/ratelimit:")
	for _, d := range envoyconf.Differences() {
		fmt.Fprintf(w, "  - %s\n", d)
	}
}
