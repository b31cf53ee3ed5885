// Package httpapi is the HTTP JSON API of the Sluice service: it decodes a
// request, asks the service core, and encodes the decision. It decides
// nothing itself.
//
//	POST /v1/take        {"policy","key","cost","request_id"} → a decision
//	POST /v1/peek        {"policy","key","cost"}              → a decision, nothing taken
//	POST /v1/take:batch  {"requests":[...]}                   → {"results":[...]}, in order
//	POST /v1/drain, /v1/refund, /v1/reset                     → see ops.go
//	GET  /v1/status      the config version and the policies
//	GET  /healthz        the process is up
//	GET  /readyz         the config is loaded and the store answers
//
// Every decision is answered 200, allowed or denied, with the IETF
// RateLimit-Policy and RateLimit fields; a degraded denial (the store could
// not be asked and the failure mode denies) is 503 with a problem body, never
// 429: an outage is not a quota. Bad input is 400 with an
// application/problem+json body naming the field, an unknown policy 404, a
// request ID reused with another cost 409, a body over the limit 413, and a
// missing or wrong bearer token 401.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/service"
)

// Defaults of the zero Options.
const (
	DefaultMaxBodyBytes = 64 << 10
	DefaultMaxBatch     = 1000
)

// Options configure a Handler. The zero value of each field means its
// documented default.
type Options struct {
	// Tokens are the accepted bearer tokens; none means no authentication.
	// They are compared in constant time and never logged.
	Tokens []string
	// MaxBodyBytes bounds a request body (a batch may be MaxBatch times
	// larger). Default DefaultMaxBodyBytes (64 KiB).
	MaxBodyBytes int64
	// MaxBatch bounds the requests of one batch. Default DefaultMaxBatch.
	MaxBatch int
	// Ready reports whether the service can decide (config loaded, store
	// reachable); /readyz answers 503 with its error. Nil: always ready.
	Ready func(ctx context.Context) error
	// Logger receives one line per request that failed for a reason other
	// than the client's input (store errors). Default: discard.
	Logger *slog.Logger
}

// Handler serves the HTTP JSON API. Create one with New.
type Handler struct {
	core     *service.Core
	tokens   config.Bearer
	maxBody  int64
	maxBatch int
	ready    func(context.Context) error
	log      *slog.Logger
	mux      *http.ServeMux
	names    nameCache
}

// New returns a Handler for core. The error wraps sluice.ErrInvalidOption.
func New(core *service.Core, o Options) (*Handler, error) {
	if core == nil {
		return nil, fmt.Errorf("%w: core is nil", sluice.ErrInvalidOption)
	}
	h := &Handler{core: core, maxBody: o.MaxBodyBytes, maxBatch: o.MaxBatch, ready: o.Ready, log: o.Logger}
	switch {
	case h.maxBody == 0:
		h.maxBody = DefaultMaxBodyBytes
	case h.maxBody < 0:
		return nil, fmt.Errorf("%w: MaxBodyBytes %d is negative", sluice.ErrInvalidOption, h.maxBody)
	}
	switch {
	case h.maxBatch == 0:
		h.maxBatch = DefaultMaxBatch
	case h.maxBatch < 0:
		return nil, fmt.Errorf("%w: MaxBatch %d is negative", sluice.ErrInvalidOption, h.maxBatch)
	}
	var err error
	if h.tokens, err = config.NewBearer(o.Tokens); err != nil {
		return nil, err
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	routes := []struct {
		method, path string
		handler      http.HandlerFunc
	}{
		{"POST", "/v1/take", h.auth(h.take)},
		{"POST", "/v1/peek", h.auth(h.peek)},
		{"POST", "/v1/take:batch", h.auth(h.batch)},
		{"POST", "/v1/drain", h.auth(h.drain)},
		{"POST", "/v1/refund", h.auth(h.refund)},
		{"POST", "/v1/reset", h.auth(h.reset)},
		{"GET", "/v1/status", h.auth(h.status)},
		{"GET", "/healthz", func(w http.ResponseWriter, r *http.Request) { writeText(w, http.StatusOK, "ok\n") }},
		{"GET", "/readyz", h.readyz},
	}
	mux := http.NewServeMux()
	methods := make(map[string]string, len(routes))
	for _, rt := range routes {
		mux.HandleFunc(rt.method+" "+rt.path, rt.handler)
		methods[rt.path] = rt.method
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if m, ok := methods[r.URL.Path]; ok {
			w.Header().Set("Allow", m)
			writeProblem(w, http.StatusMethodNotAllowed, problem{Title: "method not allowed", Detail: fmt.Sprintf("%s takes %s, not %s", r.URL.Path, m, r.Method)})
			return
		}
		writeProblem(w, http.StatusNotFound, problem{Title: "no such endpoint", Detail: fmt.Sprintf("%s %s is not an endpoint of this API", r.Method, r.URL.Path)})
	})
	h.mux = mux
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// auth wraps next with the bearer-token check, when tokens are configured.
func (h *Handler) auth(next http.HandlerFunc) http.HandlerFunc {
	if !h.tokens.Enabled() {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.tokens.Authorized(r.Header.Get("Authorization")) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
			writeProblem(w, http.StatusUnauthorized, problem{Title: "missing or wrong bearer token"})
			return
		}
		next(w, r)
	}
}

// decisionRequest is the body of /v1/take and /v1/peek, and one item of a
// batch.
type decisionRequest struct {
	Policy    string `json:"policy"`
	Key       string `json:"key"`
	Cost      *int64 `json:"cost"`
	RequestID string `json:"request_id"`
}

func (h *Handler) take(w http.ResponseWriter, r *http.Request) { h.decide(w, r, true) }

func (h *Handler) peek(w http.ResponseWriter, r *http.Request) { h.decide(w, r, false) }

// decide answers one take, or one peek if take is false.
func (h *Handler) decide(w http.ResponseWriter, r *http.Request, take bool) {
	var req decisionRequest
	if !h.decode(w, r, h.maxBody, &req) {
		return
	}
	sr, field, err := serviceRequest(req, take)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, problem{Title: "invalid request", Detail: err.Error(), Field: field})
		return
	}
	var res service.Result
	if take {
		res, err = h.core.Take(r.Context(), sr)
	} else {
		res, err = h.core.Peek(r.Context(), sr)
	}
	h.answer(w, r, res, err, false)
}

// batchRequest is the body of /v1/take:batch.
type batchRequest struct {
	Requests []decisionRequest `json:"requests"`
}

func (h *Handler) batch(w http.ResponseWriter, r *http.Request) {
	var req batchRequest
	if !h.decode(w, r, h.maxBody*int64(h.maxBatch), &req) {
		return
	}
	if n := len(req.Requests); n == 0 || n > h.maxBatch {
		writeProblem(w, http.StatusBadRequest, problem{Title: "invalid request", Field: "requests",
			Detail: fmt.Sprintf("a batch holds 1 to %d requests, got %d", h.maxBatch, n)})
		return
	}
	buf := getBuf()
	defer putBuf(buf)
	b := append((*buf)[:0], `{"results":[`...)
	for i, item := range req.Requests {
		if i > 0 {
			b = append(b, ',')
		}
		sr, field, err := serviceRequest(item, true)
		if err != nil {
			b = appendProblemItem(b, problem{Title: "invalid request", Status: http.StatusBadRequest, Detail: err.Error(), Field: fmt.Sprintf("requests[%d].%s", i, field)})
			continue
		}
		res, err := h.core.Take(r.Context(), sr)
		if err != nil {
			status, p := h.errorProblem(r, err)
			p.Status = status
			b = appendProblemItem(b, p)
			continue
		}
		b = appendResult(b, res, &h.names, false)
	}
	b = append(b, "]}\n"...)
	*buf = b
	writeBody(w, http.StatusOK, b)
}

// status answers the config version and the policies.
func (h *Handler) status(w http.ResponseWriter, r *http.Request) {
	t := h.core.Table()
	type policy struct {
		Name   string   `json:"name"`
		Limit  string   `json:"limit"`
		Limits []string `json:"limits,omitempty"` // a policy of several limits
		Shadow bool     `json:"shadow"`
	}
	out := struct {
		Version  string   `json:"version"`
		Policies []policy `json:"policies"`
	}{Version: t.Version(), Policies: []policy{}}
	for _, p := range t.Policies() {
		pol := policy{Name: p.Name, Limit: p.Limit.String(), Shadow: p.Shadow}
		if len(p.Limits) > 1 {
			for _, l := range p.Limits {
				pol.Limits = append(pol.Limits, l.String())
			}
		}
		out.Policies = append(out.Policies, pol)
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) readyz(w http.ResponseWriter, r *http.Request) {
	if h.ready != nil {
		if err := h.ready(r.Context()); err != nil {
			writeText(w, http.StatusServiceUnavailable, "not ready: "+err.Error()+"\n")
			return
		}
	}
	writeText(w, http.StatusOK, "ready\n")
}

// serviceRequest checks the fields the core cannot and builds its request:
// the cost is 1 when left out, and a peek takes no request ID. field names
// the field that was wrong.
func serviceRequest(req decisionRequest, take bool) (r service.Request, field string, err error) {
	switch {
	case req.Policy == "":
		return r, "policy", errors.New(`"policy" is missing: name the policy of the bucket`)
	case req.Key == "":
		return r, "key", errors.New(`"key" is missing or empty`)
	case !take && req.RequestID != "":
		return r, "request_id", errors.New(`a peek takes no "request_id": it consumes nothing`)
	}
	r = service.Request{Policy: req.Policy, Key: req.Key, Cost: 1, RequestID: req.RequestID}
	if req.Cost != nil {
		r.Cost = *req.Cost
	}
	return r, "", nil
}

// answer writes the decision or the error of one take, peek, drain or
// refund; taken adds the tokens taken (drain and refund).
func (h *Handler) answer(w http.ResponseWriter, r *http.Request, res service.Result, err error, taken bool) {
	if err != nil {
		status, p := h.errorProblem(r, err)
		writeProblem(w, status, p)
		return
	}
	setFields(w.Header(), res)
	if res.Degraded && !res.Allowed {
		if s, ok := retryAfterSeconds(res.RetryAfter); ok {
			w.Header().Set("Retry-After", strconv.FormatInt(s, 10))
		}
		writeProblem(w, http.StatusServiceUnavailable, problem{
			Type:   problemReducedCapacity,
			Title:  "the limiter cannot reach its store and denies while it is down",
			Policy: res.Policy.Name,
		})
		return
	}
	buf := getBuf()
	defer putBuf(buf)
	b := appendResult((*buf)[:0], res, &h.names, taken)
	b = append(b, '\n')
	*buf = b
	writeBody(w, http.StatusOK, b)
}

// errorProblem maps a core error to a status and a problem.
func (h *Handler) errorProblem(r *http.Request, err error) (int, problem) {
	p := problem{Title: "request failed", Detail: err.Error()}
	switch {
	case errors.Is(err, service.ErrUnknownPolicy):
		p.Title, p.Field = "unknown policy", "policy"
		return http.StatusNotFound, p
	case errors.Is(err, sluice.ErrRequestIDConflict):
		p.Title, p.Field = "request ID reused with another cost", "request_id"
		return http.StatusConflict, p
	case errors.Is(err, sluice.ErrUnknownRequestID):
		p.Title, p.Field = "no allowed take of this request ID is remembered", "request_id"
		return http.StatusConflict, p
	case errors.Is(err, sluice.ErrInvalidKey):
		p.Title, p.Field = "invalid key", "key"
		return http.StatusBadRequest, p
	case errors.Is(err, sluice.ErrInvalidCost):
		p.Title, p.Field = "invalid cost", "cost"
		return http.StatusBadRequest, p
	case errors.Is(err, sluice.ErrInvalidRequestID):
		p.Title, p.Field = "invalid request ID", "request_id"
		return http.StatusBadRequest, p
	case errors.Is(err, sluice.ErrInvalidPolicy):
		p.Title, p.Field = "invalid policy name", "policy"
		return http.StatusBadRequest, p
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		p.Title = "the request ended before a decision"
		return http.StatusServiceUnavailable, p
	case errors.Is(err, sluice.ErrTooManyKeys):
		p.Title = "the store holds its maximum number of keys and refuses new ones"
		h.log.Warn("decision failed", "path", r.URL.Path, "error", err)
		return http.StatusServiceUnavailable, p
	case sluice.IsUnavailable(err):
		p.Title = "the limiter's store is unavailable"
		h.log.Warn("decision failed", "path", r.URL.Path, "error", err)
		return http.StatusServiceUnavailable, p
	}
	// ErrMisconfigured, ErrInvalidLimit from a store, or anything else: a
	// fault of the deployment, not of the request.
	p.Title = "the limiter failed"
	h.log.Error("decision failed", "path", r.URL.Path, "error", err)
	return http.StatusInternalServerError, p
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, http.StatusInternalServerError, problem{Title: "encoding the answer failed"})
		return
	}
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck // the client is gone; nothing to do
}

func writeText(w http.ResponseWriter, status int, text string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(text)))
	w.WriteHeader(status)
	io.WriteString(w, text) //nolint:errcheck // the client is gone
}
