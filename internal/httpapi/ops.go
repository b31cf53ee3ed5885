package httpapi

import (
	"context"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice/internal/limitcore"
	"github.com/sluicehq/sluice/internal/service"
)

// The operations beyond take and peek:
//
//	POST /v1/drain   {"policy","key","cost"}               → a decision with "taken"
//	POST /v1/refund  {"policy","key","cost","request_id"}  → a decision with "taken" (negative)
//	POST /v1/reset   {"policy","key"}                      → 204
//
// A drain takes what is there up to the cost, which may exceed the
// capacity; "allowed" says whether all of it was there. A refund gives
// tokens back, never above the capacity; with the request ID of an allowed
// take it undoes that take once (a second refund answers "replayed": true
// and gives nothing; an ID the store does not remember is 409).

func (h *Handler) drain(w http.ResponseWriter, r *http.Request) {
	h.operate(w, r, h.core.Drain)
}

func (h *Handler) refund(w http.ResponseWriter, r *http.Request) {
	h.operate(w, r, h.core.Refund)
}

// operate answers a drain or a refund.
func (h *Handler) operate(w http.ResponseWriter, r *http.Request, op func(ctx context.Context, r service.Request) (service.Result, error)) {
	var req decisionRequest
	if !h.decode(w, r, h.maxBody, &req) {
		return
	}
	sr, field, err := serviceRequest(req, true)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, problem{Title: "invalid request", Detail: err.Error(), Field: field})
		return
	}
	res, err := op(r.Context(), sr)
	h.answer(w, r, res, err, true)
}

// resetRequest is the body of /v1/reset.
type resetRequest struct {
	Policy string `json:"policy"`
	Key    string `json:"key"`
}

func (h *Handler) reset(w http.ResponseWriter, r *http.Request) {
	var req resetRequest
	if !h.decode(w, r, h.maxBody, &req) {
		return
	}
	// The same checks of policy and key as a take's.
	if _, field, err := serviceRequest(decisionRequest{Policy: req.Policy, Key: req.Key}, false); err != nil {
		writeProblem(w, http.StatusBadRequest, problem{Title: "invalid request", Detail: err.Error(), Field: field})
		return
	}
	if _, err := h.core.Reset(r.Context(), req.Policy, req.Key); err != nil {
		status, p := h.errorProblem(r, err)
		writeProblem(w, status, p)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// appendResult appends the JSON of res: the decision (appendDecision),
// "taken" when taken is true (a drain or a refund), and, for a policy of
// several limits, "limits": each limit's own decision, in the policy's
// order, with the store's name of its buckets.
//
//	"limits":[{"bucket":"login","limit":"5 5/s","allowed":true,"remaining":4,
//	  "retry_after_ms":0,"reset_after_ms":200}, ...]
func appendResult(b []byte, res service.Result, names *nameCache, taken bool) []byte {
	b = appendDecision(b, res, names.names(res.Policy.Name, res.Decision.Limit))
	if !taken && len(res.Parts) == 0 {
		return b
	}
	b = b[:len(b)-1] // reopen the object
	if taken {
		b = append(b, `,"taken":`...)
		b = strconv.AppendInt(b, res.Taken, 10)
	}
	if len(res.Parts) > 0 {
		b = append(b, `,"limits":[`...)
		for i, d := range res.Parts {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"bucket":`...)
			b = appendString(b, res.Policy.Bucket(i))
			b = append(b, `,"limit":`...)
			b = appendString(b, d.Limit.String())
			b = append(b, `,"allowed":`...)
			b = strconv.AppendBool(b, d.Allowed)
			b = append(b, `,"remaining":`...)
			b = strconv.AppendInt(b, d.Remaining, 10)
			b = append(b, `,"retry_after_ms":`...)
			b = appendMillis(b, d.RetryAfter)
			b = append(b, `,"reset_after_ms":`...)
			b = appendMillis(b, d.ResetAfter)
			if taken {
				b = append(b, `,"taken":`...)
				b = strconv.AppendInt(b, d.Taken, 10)
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// setPartsFields sets the RateLimit-Policy and RateLimit fields of a
// policy of several limits: one list item per limit, named by its bucket,
// and Retry-After from the limit that denied.
func setPartsFields(h http.Header, res service.Result) {
	var retryAfter int64
	if !res.Allowed && res.Denied >= 0 {
		if s, ok := limitcore.RetryAfterSeconds(res.Parts[res.Denied].RetryAfter); ok {
			retryAfter = s
			h.Set("Retry-After", strconv.FormatInt(s, 10))
		}
	}
	var pol, lim []byte
	for i, d := range res.Parts {
		if i > 0 {
			pol, lim = append(pol, ", "...), append(lim, ", "...)
		}
		quoted := limitcore.QuoteString(res.Policy.Bucket(i))
		pol = limitcore.AppendPolicyItem(pol, quoted, d.Limit)
		lim = limitcore.AppendLimitItem(lim, quoted, d, d.Limit, retryAfter)
	}
	h.Set("RateLimit-Policy", string(pol))
	h.Set("RateLimit", string(lim))
}
