package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/service"
)

// adminConfig answers GET /config on the admin listener: the config in
// use as config check describes it (URLs' passwords redacted, tokens never
// in it), after the last reload. Settings that change only at a restart are
// shown as the process started with them.
func (rt *runtime) adminConfig(w http.ResponseWriter, r *http.Request) {
	rt.mu.Lock()
	cfg := rt.cfg
	rt.mu.Unlock()
	var b bytes.Buffer
	fmt.Fprintf(&b, "# version %s, from %s\n", cfg.Version, describeSource(rt.path))
	if err := cfg.Describe(&b); err != nil {
		http.Error(w, "describing the config failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write(b.Bytes()) //nolint:errcheck // the client is gone
}

// adminPeek answers GET /peek?policy=P&key=K[&cost=N] on the admin
// listener: whether a take of cost (default 1) from the bucket would be
// allowed now, and the bucket's level, without taking or creating
// anything.
func (rt *runtime) adminPeek(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	req := service.Request{Policy: q.Get("policy"), Key: q.Get("key"), Cost: 1}
	if req.Policy == "" || req.Key == "" {
		adminError(w, http.StatusBadRequest, "give the bucket as ?policy=P&key=K (and &cost=N, default 1)")
		return
	}
	if c := q.Get("cost"); c != "" {
		n, err := strconv.ParseInt(c, 10, 64)
		if err != nil {
			adminError(w, http.StatusBadRequest, fmt.Sprintf("cost %q is not a whole number", c))
			return
		}
		req.Cost = n
	}
	res, err := rt.core.Peek(r.Context(), req)
	if err != nil {
		adminFailure(w, err)
		return
	}
	ms := func(d time.Duration) *int64 {
		if d == sluice.Never {
			return nil
		}
		v := ceilMillis(d)
		return &v
	}
	out := struct {
		Allowed      bool   `json:"allowed"`
		Remaining    int64  `json:"remaining"`
		RetryAfterMS *int64 `json:"retry_after_ms"`
		ResetAfterMS *int64 `json:"reset_after_ms"`
		Never        bool   `json:"never"`
		Policy       string `json:"policy"`
		Limit        string `json:"limit"`
		Degraded     bool   `json:"degraded"`
	}{
		Allowed: res.Allowed, Remaining: res.Remaining,
		RetryAfterMS: ms(res.RetryAfter), ResetAfterMS: ms(res.ResetAfter), Never: res.RetryAfter == sluice.Never,
		Policy: res.Policy.Name, Limit: res.Decision.Limit.String(), Degraded: res.Degraded,
	}
	body, _ := json.Marshal(out) //nolint:errcheck // plain fields
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(body, '\n')) //nolint:errcheck // the client is gone
}

// adminReset answers POST /reset?policy=P&key=K on the admin listener:
// the bucket of K under each of P's limits is full again, as if never
// used ("unlock an account", an operator's correction). It answers 204.
func (rt *runtime) adminReset(w http.ResponseWriter, r *http.Request, log *slog.Logger) {
	q := r.URL.Query()
	policy, key := q.Get("policy"), q.Get("key")
	if policy == "" || key == "" {
		adminError(w, http.StatusBadRequest, "give the bucket as ?policy=P&key=K")
		return
	}
	p, err := rt.core.Reset(r.Context(), policy, key)
	if err != nil {
		adminFailure(w, err)
		return
	}
	log.Info("admin reset", "policy", p.Name, "limits", len(p.Limits))
	w.WriteHeader(http.StatusNoContent)
}

// adminFailure answers an admin request the core could not serve.
func adminFailure(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, service.ErrUnknownPolicy):
		status = http.StatusNotFound
	case sluice.IsInvalid(err):
		status = http.StatusBadRequest
	case sluice.IsUnavailable(err):
		status = http.StatusServiceUnavailable
	}
	adminError(w, status, err.Error())
}

func adminError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	fmt.Fprintln(w, msg)
}

// ceilMillis returns d in whole milliseconds, rounded up, as the API does.
func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d-1)/time.Millisecond) + 1
}
