package httplimit

import (
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice"
)

func TestCanonicalNames(t *testing.T) {
	for name, want := range map[string]string{HeaderRateLimitPolicy: "Ratelimit-Policy", HeaderRateLimit: "Ratelimit"} {
		if got := http.CanonicalHeaderKey(name); got != want {
			t.Errorf("CanonicalHeaderKey(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestSetFields(t *testing.T) {
	l := sluice.Limit{Capacity: 10, Rate: sluice.PerSecond(1)}
	tests := []struct {
		name string
		d    sluice.Decision
		want http.Header
	}{
		{"allowed", sluice.Decision{Allowed: true, Remaining: 7, ResetAfter: 3 * time.Second, Limit: l}, http.Header{
			"Ratelimit-Policy": {`"api";q=10;w=10`},
			"Ratelimit":        {`"api";r=7;t=1`},
		}},
		{"denied", sluice.Decision{Remaining: 0, RetryAfter: 1500 * time.Millisecond, ResetAfter: 10 * time.Second, Limit: l}, http.Header{
			"Ratelimit-Policy": {`"api";q=10;w=10`},
			"Ratelimit":        {`"api";r=0;t=1`},
			"Retry-After":      {"2"},
		}},
		{"never", sluice.Decision{RetryAfter: sluice.Never, ResetAfter: sluice.Never, Limit: sluice.Limit{Capacity: 1, Rate: sluice.Per(0, time.Second)}}, http.Header{
			"Ratelimit-Policy": {`"api";q=1`},
			"Ratelimit":        {`"api";r=0`},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			SetFields(h, "api", tt.d)
			if diff := cmp.Diff(tt.want, h); diff != "" {
				t.Errorf("SetFields(%+v) (-want +got):\n%s", tt.d, diff)
			}
		})
	}
}
