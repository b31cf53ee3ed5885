package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/service"
)

// problemReducedCapacity is the problem type of a 503 answer to a degraded
// denial (the IETF RateLimit draft's "temporary-reduced-capacity").
const problemReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"

// problem is an RFC 9457 problem details object. Field names the request
// field that was wrong, when one was.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Field  string `json:"field,omitempty"`
	Policy string `json:"policy,omitempty"`
}

// writeProblem answers with status and p as application/problem+json.
func writeProblem(w http.ResponseWriter, status int, p problem) {
	if p.Type == "" {
		p.Type = "about:blank"
	}
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

// retryAfterSeconds returns d rounded up to whole seconds, at least 1, and
// false when there is no wait to name (zero, or Never).
func retryAfterSeconds(d time.Duration) (int64, bool) {
	if d <= 0 || d == sluice.Never {
		return 0, false
	}
	return int64((d-1)/time.Second) + 1, true
}

// setFields sets the RateLimit-Policy and RateLimit fields (and Retry-After
// for a denial) of a result.
func setFields(h http.Header, res service.Result) {
	if res.Degraded {
		// A failure mode decided: the store's remaining tokens are not
		// known, so no RateLimit field would be true.
		return
	}
	if len(res.Parts) > 0 {
		setPartsFields(h, res)
		return
	}
	httplimit.SetFields(h, res.Policy.Name, res.Decision)
}
