package sluice_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

func TestValidateAll(t *testing.T) {
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	ok := func(policy, key string, cost int64) sluice.Request {
		return sluice.Request{Policy: policy, Key: key, Cost: cost, Limit: l}
	}
	many := make([]sluice.Request, sluice.MaxParts+1)
	for i := range many {
		many[i] = ok("p", strings.Repeat("k", i+1), 1)
	}
	withID := ok("p", "b", 1)
	withID.RequestID = "r-1"
	cases := []struct {
		name string
		rs   []sluice.Request
		want error
		text string
	}{
		{"empty", nil, sluice.ErrInvalidMulti, "no buckets"},
		{"too many", many, sluice.ErrInvalidMulti, "17 buckets, more than 16"},
		{"duplicate", []sluice.Request{ok("p", "a", 1), ok("q", "a", 1), ok("p", "a", 2)}, sluice.ErrInvalidMulti, `buckets 0 and 2 are both policy "p" key "a"`},
		{"bad cost", []sluice.Request{ok("p", "a", 1), ok("p", "b", 11)}, sluice.ErrInvalidCost, "bucket 1: "},
		{"bad policy", []sluice.Request{ok("", "a", 1)}, sluice.ErrInvalidPolicy, "bucket 0: "},
		{"request ID", []sluice.Request{ok("p", "a", 1), withID}, sluice.ErrInvalidRequestID, "bucket 1: "},
	}
	for _, c := range cases {
		err := sluice.ValidateAll(c.rs)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.text) || !sluice.IsInvalid(err) {
			t.Errorf("%s: ValidateAll = %v, want %v containing %q", c.name, err, c.want, c.text)
		}
	}
	if err := sluice.ValidateAll(many[:sluice.MaxParts]); err != nil {
		t.Errorf("ValidateAll of %d distinct buckets = %v", sluice.MaxParts, err)
	}
	// The same key under two policies is two buckets.
	if err := sluice.ValidateAll([]sluice.Request{ok("p", "a", 1), ok("q", "a", 1)}); err != nil {
		t.Errorf("ValidateAll of one key under two policies = %v", err)
	}
}

func TestValidateDrain(t *testing.T) {
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	r := sluice.Request{Policy: "p", Key: "k", Cost: 1 << 40, Limit: l}
	if err := r.ValidateDrain(); err != nil {
		t.Errorf("a drain larger than the capacity: %v", err)
	}
	for _, c := range []struct {
		r    sluice.Request
		want error
	}{
		{sluice.Request{Policy: "p", Key: "k", Cost: 0, Limit: l}, sluice.ErrInvalidCost},
		{sluice.Request{Policy: "p", Key: "k", Cost: -5, Limit: l}, sluice.ErrInvalidCost},
		{sluice.Request{Policy: "p", Key: "k", Cost: 5, Limit: l, RequestID: "x"}, sluice.ErrInvalidRequestID},
		{sluice.Request{Policy: "p", Key: "k", Cost: 5}, sluice.ErrInvalidLimit},
		{sluice.Request{Policy: "p", Key: "", Cost: 5, Limit: l}, sluice.ErrInvalidKey},
	} {
		if err := c.r.ValidateDrain(); !errors.Is(err, c.want) {
			t.Errorf("ValidateDrain(%+v) = %v, want %v", c.r, err, c.want)
		}
	}
	over := sluice.Request{Policy: "p", Key: "k", Cost: 11, Limit: l}
	if err := over.ValidateRefund(); !errors.Is(err, sluice.ErrInvalidCost) {
		t.Errorf("a refund over the capacity: %v, want ErrInvalidCost", err)
	}
	if err := sluice.ValidateReset("p", ""); !errors.Is(err, sluice.ErrInvalidKey) {
		t.Errorf("ValidateReset with no key: %v", err)
	}
	if err := sluice.ValidateReset("a b", "k"); !errors.Is(err, sluice.ErrInvalidPolicy) {
		t.Errorf("ValidateReset with a bad policy: %v", err)
	}
}

func TestCombine(t *testing.T) {
	allow := sluice.Decision{Allowed: true}
	deny := func(w time.Duration) sluice.Decision { return sluice.Decision{RetryAfter: w} }
	for _, c := range []struct {
		parts  []sluice.Decision
		allow  bool
		denied int
		retry  time.Duration
	}{
		{[]sluice.Decision{allow, allow}, true, -1, 0},
		{[]sluice.Decision{allow, deny(time.Second)}, false, 1, time.Second},
		{[]sluice.Decision{deny(time.Second), deny(8 * time.Hour), allow}, false, 1, 8 * time.Hour},
		{[]sluice.Decision{deny(time.Second), deny(time.Second)}, false, 0, time.Second},
		{[]sluice.Decision{deny(0), deny(sluice.Never)}, false, 1, sluice.Never},
	} {
		md := sluice.MultiDecision{Parts: c.parts}
		md.Combine()
		if md.Allowed != c.allow || md.Denied != c.denied || md.RetryAfter != c.retry {
			t.Errorf("Combine(%+v) = %v %d %v, want %v %d %v", c.parts, md.Allowed, md.Denied, md.RetryAfter, c.allow, c.denied, c.retry)
		}
	}
}
