package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// errDenied is returned by take for a denial: the command ran, and the
// answer was no. main exits 1 for it, without a message.
var errDenied = errors.New("denied")

// takeCommand runs "sluice take POLICY KEY": one take from a running
// service. It prints the decision, in words or (-json) as the service's
// JSON, and returns nil if the take was allowed, errDenied if it was
// denied, and another error if there was no decision.
var takeHelp = help{
	usage: "sluice take POLICY KEY [-cost N] [-request-id ID] [-server URL] [-token-env VAR] [-json]",
	about: `Takes from the bucket of (POLICY, KEY) of a running service (POST /v1/take)
and prints the decision in words, or with -json the service's answer. Reads
nothing but the token's environment variable.`,
	example: "sluice take default me -cost 2",
	exit:    "0 allowed, 1 denied, 2 no decision (bad input, unknown policy, service unreachable or failing)",
}

func takeCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("take", flag.ContinueOnError)
	quiet(fs)
	cost := fs.Int64("cost", 1, "the tokens to take, 1 to the policy's capacity")
	requestID := fs.String("request-id", "", "makes the take idempotent: a retry with the same ID is not charged again")
	server := fs.String("server", "http://127.0.0.1:8080", "the base URL of the service's HTTP API")
	tokenEnv := fs.String("token-env", "", "the environment variable holding the bearer token, if the service requires one")
	asJSON := fs.Bool("json", false, "print the service's JSON answer instead of a sentence")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for the answer")
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return takeHelp.parseErr(err, "take", fs, stdout)
	}
	if len(positional) != 2 {
		return fmt.Errorf("take takes a policy and a key, got %d arguments (sluice take -h)", len(positional))
	}
	if *timeout <= 0 {
		return fmt.Errorf("-timeout %v must be positive", *timeout)
	}
	token := ""
	if *tokenEnv != "" {
		v, ok := os.LookupEnv(*tokenEnv)
		if !ok || v == "" {
			return fmt.Errorf("-token-env: the variable %s is not set", *tokenEnv)
		}
		token = v
	}
	body, err := json.Marshal(map[string]any{
		"policy": positional[0], "key": positional[1], "cost": *cost, "request_id": *requestID,
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(*server, "/")+"/v1/take", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("-server %q: %w", *server, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
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
	return printTake(stdout, resp, raw, *asJSON)
}

// takeAnswer is what take reads of a decision or a problem.
type takeAnswer struct {
	Allowed      bool   `json:"allowed"`
	Remaining    int64  `json:"remaining"`
	RetryAfterMS *int64 `json:"retry_after_ms"`
	ResetAfterMS *int64 `json:"reset_after_ms"`
	Never        bool   `json:"never"`
	Policy       string `json:"policy"`
	Limit        string `json:"limit"`
	Replayed     bool   `json:"replayed"`
	Degraded     bool   `json:"degraded"`
	ShadowDenied bool   `json:"shadow_denied"`

	// A problem (RFC 9457).
	Type   string `json:"type"`
	Title  string `json:"title"`
	Detail string `json:"detail"`
}

const reducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"

func printTake(w io.Writer, resp *http.Response, raw []byte, asJSON bool) error {
	var a takeAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		return fmt.Errorf("the service answered %s with a body that is not JSON: %.200q", resp.Status, raw)
	}
	// A degraded denial is a decision (the store is down and the failure
	// mode denies): it is answered 503, and take reports it as a denial.
	degradedDenial := resp.StatusCode == http.StatusServiceUnavailable && a.Type == reducedCapacity
	if resp.StatusCode != http.StatusOK && !degradedDenial {
		if asJSON {
			w.Write(raw) //nolint:errcheck // nothing to do about stdout
		}
		msg := a.Title
		if a.Detail != "" {
			msg += ": " + a.Detail
		}
		if msg == "" {
			msg = "no reason given"
		}
		return fmt.Errorf("the service answered %s: %s", resp.Status, msg)
	}
	if asJSON {
		w.Write(raw) //nolint:errcheck // nothing to do about stdout
	} else {
		fmt.Fprintln(w, describeTake(a, degradedDenial, resp.Header.Get("Retry-After")))
	}
	if degradedDenial || !a.Allowed {
		return errDenied
	}
	return nil
}

// describeTake says a decision in one line.
func describeTake(a takeAnswer, degradedDenial bool, retryAfter string) string {
	if degradedDenial {
		s := "denied: the service cannot reach its store and denies while it is down"
		if retryAfter != "" {
			s += "; retry in " + retryAfter + "s"
		}
		return s
	}
	var b strings.Builder
	if a.Allowed {
		b.WriteString("allowed")
	} else {
		b.WriteString("denied")
	}
	fmt.Fprintf(&b, ": %d %s left of policy %s (%s)", a.Remaining, plural(int(min(a.Remaining, 2)), "token", "tokens"), a.Policy, a.Limit)
	switch {
	case !a.Allowed && a.Never:
		b.WriteString("; never allowed: the bucket does not refill")
	case !a.Allowed && a.RetryAfterMS != nil:
		fmt.Fprintf(&b, "; retry in %v", time.Duration(*a.RetryAfterMS)*time.Millisecond)
	}
	switch {
	case a.ResetAfterMS == nil:
		b.WriteString("; never refills")
	case *a.ResetAfterMS > 0:
		fmt.Fprintf(&b, "; full in %v", time.Duration(*a.ResetAfterMS)*time.Millisecond)
	}
	if a.Replayed {
		b.WriteString("; replayed: this request ID was already allowed and is not charged again")
	}
	if a.ShadowDenied {
		b.WriteString("; shadow policy: it would have denied")
	}
	if a.Degraded {
		b.WriteString("; degraded: decided without the store")
	}
	return b.String()
}

// parseInterspersed parses fs's flags wherever they are among args and
// returns the other arguments in order, so that "take api me -cost 3" and
// "take -cost 3 api me" mean the same. "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}
