package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// statusCommand runs "sluice status": the config version and the policies
// of a running service, in words or (-json) as the service's JSON.
var statusHelp = help{
	usage: "sluice status [-server URL] [-token-env VAR] [-json]",
	about: `Prints the config version and the policies of a running service, from its
GET /v1/status; reads nothing but the token's environment variable.`,
	example: "sluice status -server http://127.0.0.1:8080",
	exit:    "0 answered; 2 no answer (unreachable or failing service, wrong token)",
}

func statusCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	quiet(fs)
	server := fs.String("server", "http://127.0.0.1:8080", "the base URL of the service's HTTP API")
	tokenEnv := fs.String("token-env", "", "the environment variable holding the bearer token, if the service requires one")
	asJSON := fs.Bool("json", false, "print the service's JSON answer instead of a list")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for the answer")
	if err := fs.Parse(args); err != nil {
		return statusHelp.parseErr(err, "status", fs, stdout)
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("status takes no arguments, got %q", fs.Args())
	}
	if *timeout <= 0 {
		return fmt.Errorf("-timeout %v must be positive", *timeout)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(*server, "/")+"/v1/status", nil)
	if err != nil {
		return fmt.Errorf("-server %q: %w", *server, err)
	}
	if *tokenEnv != "" {
		v, ok := os.LookupEnv(*tokenEnv)
		if !ok || v == "" {
			return fmt.Errorf("-token-env: the variable %s is not set", *tokenEnv)
		}
		req.Header.Set("Authorization", "Bearer "+v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("asking %s: %w", *server, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("reading the answer of %s: %w", *server, err)
	}
	if resp.StatusCode != http.StatusOK {
		var p struct{ Title, Detail string }
		json.Unmarshal(raw, &p) //nolint:errcheck // an empty title then
		return fmt.Errorf("the service answered %s: %s", resp.Status, strings.TrimSuffix(p.Title+": "+p.Detail, ": "))
	}
	if *asJSON {
		_, err := stdout.Write(raw)
		return err
	}
	var st struct {
		Version  string `json:"version"`
		Policies []struct {
			Name   string   `json:"name"`
			Limit  string   `json:"limit"`
			Limits []string `json:"limits"`
			Shadow bool     `json:"shadow"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("the status of %s is not what this sluice reads: %w", *server, err)
	}
	fmt.Fprintf(stdout, "config version %s, %d %s:\n", st.Version, len(st.Policies), plural(len(st.Policies), "policy", "policies"))
	for _, p := range st.Policies {
		shadow := ""
		if p.Shadow {
			shadow = " (shadow)"
		}
		limit := p.Limit
		if len(p.Limits) > 1 {
			limit = strings.Join(p.Limits, " and ") + ", decided together"
		}
		fmt.Fprintf(stdout, "  %s: %s%s\n", p.Name, limit, shadow)
	}
	return nil
}
