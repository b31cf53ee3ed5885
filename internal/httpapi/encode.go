package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/limitcore"
	"github.com/sluicehq/sluice/internal/service"
)

// A decision is written as this JSON object, members in this order (the
// tests hold it equal to encoding/json's output for the same struct):
//
//	{"allowed":true,"remaining":1,"retry_after_ms":0,"reset_after_ms":30000,
//	 "never":false,"policy":"api","limit":"2 2/m","replayed":false,
//	 "degraded":false}
//
// retry_after_ms is the wait in milliseconds, rounded up, and null with
// never true when waiting cannot help; reset_after_ms is the wait until
// full, rounded up, and null if the bucket never refills. "shadow_denied":
// true is added when a shadow policy allowed a denial.
//
// A batch is {"results":[...]}, each result a decision or {"error":
// problem}.

// appendDecision appends the JSON of res, whose policy and limit members
// are names (see nameCache).
func appendDecision(b []byte, res service.Result, names []byte) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, res.Allowed)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, res.Remaining, 10)
	b = append(b, `,"retry_after_ms":`...)
	b = appendMillis(b, res.RetryAfter)
	b = append(b, `,"reset_after_ms":`...)
	b = appendMillis(b, res.ResetAfter)
	b = append(b, `,"never":`...)
	b = strconv.AppendBool(b, res.RetryAfter == sluice.Never)
	b = append(b, ',')
	b = append(b, names...)
	b = append(b, `,"replayed":`...)
	b = strconv.AppendBool(b, res.Replayed)
	b = append(b, `,"degraded":`...)
	b = strconv.AppendBool(b, res.Degraded)
	if res.ShadowDenied {
		b = append(b, `,"shadow_denied":true`...)
	}
	return append(b, '}')
}

// appendMillis appends d in whole milliseconds rounded up, or null for
// sluice.Never.
func appendMillis(b []byte, d time.Duration) []byte {
	if d == sluice.Never {
		return append(b, "null"...)
	}
	return strconv.AppendInt(b, ceilMillis(d), 10)
}

// ceilMillis returns d in whole milliseconds, rounded up: a wait is never
// reported shorter than it is.
func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d-1)/time.Millisecond) + 1
}

// appendProblemItem appends a batch result that is the problem p.
func appendProblemItem(b []byte, p problem) []byte {
	if p.Type == "" {
		p.Type = "about:blank"
	}
	pb, err := json.Marshal(p)
	if err != nil { // only strings and ints: cannot happen
		pb = []byte(`{"type":"about:blank"}`)
	}
	b = append(b, `{"error":`...)
	b = append(b, pb...)
	return append(b, '}')
}

// maxNames bounds the (policy, limit) pairs a nameCache holds. The pairs
// come from the config (and from guard's local limits), not from requests,
// so it is reached only after very many reloads; past it the names are
// built for each decision.
const maxNames = 1024

// nameKey is a policy and the limit a decision of it was made under.
type nameKey struct {
	policy string
	limit  sluice.Limit
}

// nameCache holds for each (policy, limit) the "policy" and "limit"
// members of its decisions, `"policy":"api","limit":"2 2/m"`, so that the
// name is not quoted and the limit not formatted again for every decision.
type nameCache struct {
	c limitcore.Cache[nameKey, []byte]
}

// names returns the members for policy and l. The slice must not be
// changed.
func (c *nameCache) names(policy string, l sluice.Limit) []byte {
	return c.c.Get(nameKey{policy, l}, maxNames, func() []byte { return appendNames(nil, policy, l) })
}

func appendNames(b []byte, policy string, l sluice.Limit) []byte {
	b = append(b, `"policy":`...)
	b = appendString(b, policy)
	b = append(b, `,"limit":`...)
	return appendString(b, l.String())
}

// appendString appends s as encoding/json writes a string.
func appendString(b []byte, s string) []byte {
	q, err := json.Marshal(s)
	if err != nil { // a string always encodes
		return append(b, `""`...)
	}
	return append(b, q...)
}

// bufPool holds the buffers of request and answer bodies.
var bufPool = sync.Pool{New: func() any { return new([]byte) }}

// maxPooled bounds the buffers kept in bufPool: a rare large batch does not
// keep its memory.
const maxPooled = 1 << 20

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) > maxPooled {
		return
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}

// contentTypeJSON is the Content-Type of every JSON answer, shared: the
// server only reads it.
var contentTypeJSON = []string{"application/json"}

// writeBody answers status with body, a JSON value and its newline.
func writeBody(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h["Content-Type"] = contentTypeJSON
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck // the client is gone; nothing to do
}
