package httplimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice/internal/limitcore"
)

// Problem types of draft-ietf-httpapi-ratelimit-headers-11, section 5, used
// as the "type" of the application/problem+json bodies (RFC 9457).
const (
	// ProblemQuotaExceeded is the type of a 429 answer: the request
	// exceeds the quota of the policies in "violated-policies".
	ProblemQuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	// ProblemReducedCapacity is the type of a 503 answer to a degraded
	// denial: the limiter runs on a temporarily reduced capacity.
	ProblemReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
)

// problem is an RFC 9457 problem details object.
type problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail,omitempty"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

// writeProblem answers with status and p as application/problem+json.
func writeProblem(w http.ResponseWriter, status int, p problem) {
	p.Status = status
	body, err := json.Marshal(p)
	if err != nil { // only strings and ints: cannot happen
		body = []byte(`{"type":"about:blank"}`)
	}
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck // the client is gone; nothing to do
}

// DefaultErrorHandler answers a request the middleware could not decide
// with a problem body of type "about:blank" and the status for err:
//
//   - 400 Bad Request: ErrNoKey, sluice.ErrInvalidKey (the key is too
//     long), sluice.ErrInvalidRequestID (the request ID header is too
//     long); the detail is err's message.
//   - 422 Unprocessable Content: sluice.ErrRequestIDConflict (a request ID
//     reused with another cost or limit).
//   - 503 Service Unavailable: ErrStore; the request was not allowed.
//   - 500 Internal Server Error: anything else, such as
//     sluice.ErrInvalidCost from Options.Cost or sluice.ErrInvalidLimit
//     from Options.LimitFunc, or their own errors.
//
// The detail of a 5xx answer does not include err, which may name
// internal addresses: log it in an ErrorHandler of your own that then calls
// DefaultErrorHandler.
func DefaultErrorHandler(w http.ResponseWriter, r *http.Request, err error) {
	status := errorStatus(err)
	p := problem{Type: "about:blank", Title: http.StatusText(status)}
	switch {
	case status < 500:
		p.Detail = err.Error()
	case status == http.StatusServiceUnavailable:
		p.Detail = "the rate limiter could not decide this request"
	default:
		p.Detail = "the rate limiter is misconfigured"
	}
	writeProblem(w, status, p)
}

func errorStatus(err error) int {
	switch limitcore.Classify(err, ErrNoKey, ErrStore) {
	case limitcore.BadRequest:
		return http.StatusBadRequest
	case limitcore.Conflict:
		return http.StatusUnprocessableEntity
	case limitcore.Unavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// DefaultDeniedHandler answers a denied request with a problem body (the
// fields are already set by the middleware):
//
//   - 429 Too Many Requests, type ProblemQuotaExceeded, for a quota
//     denial. "violated-policies" names every limit whose bucket could not
//     cover the cost; the detail gives the cost and what remains in the
//     limit that denied, and says when waiting will not help.
//   - 503 Service Unavailable, type ProblemReducedCapacity, for a denial
//     made by a failure policy (d.Degraded): the client did not exceed
//     its quota, the limiter lost its store.
func DefaultDeniedHandler(w http.ResponseWriter, r *http.Request, d Decision) {
	var violated []string
	for i, p := range d.Parts {
		if !p.Allowed && i < len(d.Requests) {
			violated = append(violated, d.Requests[i].Policy)
		}
	}
	if len(violated) == 0 { // a store that did not say which
		for _, req := range d.Requests {
			violated = append(violated, req.Policy)
		}
	}
	if d.Degraded {
		writeProblem(w, http.StatusServiceUnavailable, problem{
			Type:             ProblemReducedCapacity,
			Title:            "Temporarily reduced capacity",
			Detail:           "the rate limiter is degraded and cannot admit this request now",
			ViolatedPolicies: violated,
		})
		return
	}
	var detail string
	if i := d.Denied; i >= 0 && i < len(d.Parts) && i < len(d.Requests) {
		req, p := d.Requests[i], d.Parts[i]
		detail = fmt.Sprintf("the request costs %d and %d of %d remain", req.Cost, max(p.Remaining, 0), req.Limit.Capacity)
		if len(d.Requests) > 1 {
			detail += fmt.Sprintf(" in %q", req.Policy)
		}
	}
	if _, ok := limitcore.RetryAfterSeconds(d.RetryAfter); !ok {
		detail += "; waiting will not help"
	}
	writeProblem(w, http.StatusTooManyRequests, problem{
		Type:             ProblemQuotaExceeded,
		Title:            "Quota exceeded",
		Detail:           detail,
		ViolatedPolicies: violated,
	})
}
