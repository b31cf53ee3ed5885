package redisstore

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
)

// replyLen is the number of values of one decision in a script reply.
const replyLen = 5

// Kinds of decision reply (see bucket.lua).
const (
	kindOK        = "ok"       // decided
	kindConverted = "conv"     // decided, after converting a bucket stored under another limit
	kindReplay    = "replay"   // a request ID's remembered decision
	kindConflict  = "conflict" // a request ID remembered with other parameters
	kindForeign   = "foreign"  // "takes" only: this take's bucket holds a value Sluice did not write
	kindUnknown   = "unknown"  // "refund" only: the request ID is not remembered
)

// decision reads one decision of a script reply: the kind ("ok", "conv"
// or "replay"), then allowed (0 or 1), remaining, and the waits in
// microseconds (-1 for never). It reports whether the take converted its
// bucket. Any other shape is a *ScriptError.
func decision(reply []any, l sluice.Limit) (d sluice.Decision, converted bool, err error) {
	if len(reply) == replyLen {
		kind, _ := reply[0].(string)
		allowed, ok1 := reply[1].(int64)
		remaining, ok2 := reply[2].(int64)
		retry, ok3 := wait(reply[3])
		reset, ok4 := wait(reply[4])
		if (kind == kindOK || kind == kindConverted || kind == kindReplay) && ok1 && (allowed == 0 || allowed == 1) && ok2 && remaining >= 0 && ok3 && ok4 {
			return sluice.Decision{
				Allowed:    allowed == 1,
				Remaining:  remaining,
				RetryAfter: retry,
				ResetAfter: reset,
				Limit:      l,
				Replayed:   kind == kindReplay,
			}, kind == kindConverted, nil
		}
	}
	return sluice.Decision{}, false, scriptErrorf("reply %q is not a decision", reply)
}

// movedDecision reads the reply of a drain or a refund: a decision, then
// the tokens taken or given back, an integer of at least 0. Any other shape
// is a *ScriptError.
func movedDecision(reply []any, l sluice.Limit) (d sluice.Decision, moved int64, converted bool, err error) {
	if len(reply) == replyLen+1 {
		moved, ok := reply[replyLen].(int64)
		d, converted, err := decision(reply[:replyLen], l)
		if err == nil && ok && moved >= 0 {
			return d, moved, converted, nil
		}
	}
	return sluice.Decision{}, 0, false, scriptErrorf("reply %q is not a decision and the tokens moved", reply)
}

// wait reads a wait in microseconds: an integer, -1 for never, or, for a
// wait of 2^53µs or more (which a double cannot hold exactly), its decimal
// digits. A wait longer than a time.Duration is sluice.Never.
func wait(v any) (time.Duration, bool) {
	var us int64
	switch v := v.(type) {
	case int64:
		us = v
	case string:
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || len(v) == 0 || v[0] == '0' {
			return 0, false
		}
		if n > math.MaxInt64/uint64(time.Microsecond) {
			return sluice.Never, true
		}
		us = int64(n)
	default:
		return 0, false
	}
	switch {
	case us < -1:
		return 0, false
	case us == -1 || us > math.MaxInt64/int64(time.Microsecond):
		return sluice.Never, true
	}
	return time.Duration(us) * time.Microsecond, true
}

// recordLimit formats the limit C, n, P µs of a "conflict" reply as
// sluice.Limit does, or as the numbers if they are not one.
func recordLimit(v []any) string {
	var n [3]int64
	for i := range n {
		s, _ := v[i].(string)
		x, err := strconv.ParseInt(s, 10, 64)
		if err != nil || x < 0 || x > math.MaxInt64/int64(time.Microsecond) {
			return fmt.Sprintf("\"%v %v/%vµs\"", v[0], v[1], v[2])
		}
		n[i] = x
	}
	return strconv.Quote(sluice.Limit{Capacity: n[0], Rate: sluice.Per(n[1], time.Duration(n[2])*time.Microsecond)}.String())
}

// conflict returns the error of a "conflict" reply to r: the request ID's
// first cost and limit (C, n, P µs), then r's.
func conflict(reply []any, r sluice.Request) error {
	return fmt.Errorf("%w: request ID %q for this policy and key was first used with cost %v and limit %s, now cost %d and limit %q",
		sluice.ErrRequestIDConflict, r.RequestID, reply[1], recordLimit(reply[2:]), r.Cost, r.Limit)
}
