package main

import (
	"bytes"
	"math/rand/v2"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

func marshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decision is a Decision as the service writes one, every field set.
func decision(allowed bool) *sluicev1.Decision {
	return &sluicev1.Decision{Allowed: allowed, Remaining: 7, RetryAfter: durationpb.New(0), ResetAfter: durationpb.New(3e9),
		Policy: "bench", Limit: &sluicev1.Limit{Capacity: 100, RefillTokens: 10, RefillPeriod: durationpb.New(1e9), Text: "100 10/s"},
		Limits: []*sluicev1.LimitDecision{{Bucket: "bench", Allowed: allowed}}}
}

func TestReadDecision(t *testing.T) {
	for _, tt := range []struct {
		name    string
		b       []byte
		allowed bool
		ok      bool
	}{
		{"allowed", marshal(t, decision(true)), true, true},
		{"denied", marshal(t, decision(false)), false, true},
		{"empty", nil, false, false},
		{"no policy", marshal(t, &sluicev1.Decision{Allowed: true}), false, false},
		{"truncated", marshal(t, decision(true))[:20], false, false},
		{"allowed as bytes", protowire.AppendBytes(protowire.AppendTag(marshal(t, decision(true)), 1, protowire.BytesType), nil), false, false},
		{"a bad tag", []byte{0xff, 0xff, 0xff}, false, false},
	} {
		allowed, err := readDecision(tt.b)
		if (err == nil) != tt.ok || err == nil && allowed != tt.allowed {
			t.Errorf("%s: readDecision = %v, %v; want allowed %v, ok %v", tt.name, allowed, err, tt.allowed, tt.ok)
		}
	}
}

func TestReadBatch(t *testing.T) {
	resp := &sluicev1.TakeBatchResponse{}
	var want []outcome
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 50 {
		switch rng.IntN(3) {
		case 0:
			want = append(want, outcome{decided: true, allowed: true})
			resp.Results = append(resp.Results, &sluicev1.TakeBatchResult{Result: &sluicev1.TakeBatchResult_Decision{Decision: decision(true)}})
		case 1:
			want = append(want, outcome{decided: true})
			resp.Results = append(resp.Results, &sluicev1.TakeBatchResult{Result: &sluicev1.TakeBatchResult_Decision{Decision: decision(false)}})
		default:
			c := codes.Code(3 + i%12)
			want = append(want, outcome{code: c})
			resp.Results = append(resp.Results, &sluicev1.TakeBatchResult{Result: &sluicev1.TakeBatchResult_Error{Error: &spb.Status{Code: int32(c), Message: "m"}}})
		}
	}
	got, err := readBatch(marshal(t, resp), nil)
	if err != nil || len(got) != len(want) {
		t.Fatalf("readBatch: %d outcomes, %v; want %d", len(got), err, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("result %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	for _, tt := range []struct {
		name string
		b    []byte
	}{
		{"an empty result", marshal(t, &sluicev1.TakeBatchResponse{Results: []*sluicev1.TakeBatchResult{{}}})},
		{"an OK error", marshal(t, &sluicev1.TakeBatchResponse{Results: []*sluicev1.TakeBatchResult{{Result: &sluicev1.TakeBatchResult_Error{Error: &spb.Status{}}}}})},
		{"a decision without a policy", marshal(t, &sluicev1.TakeBatchResponse{Results: []*sluicev1.TakeBatchResult{{Result: &sluicev1.TakeBatchResult_Decision{Decision: &sluicev1.Decision{}}}}})},
		{"truncated", marshal(t, resp)[:30]},
	} {
		if _, err := readBatch(tt.b, nil); err == nil {
			t.Errorf("%s: readBatch accepted it", tt.name)
		}
	}
}

func TestReadEnvoy(t *testing.T) {
	limit := &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND}
	st := func(c rlsv3.RateLimitResponse_Code, l *rlsv3.RateLimitResponse_RateLimit) *rlsv3.RateLimitResponse_DescriptorStatus {
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: c, CurrentLimit: l, LimitRemaining: 4, DurationUntilReset: durationpb.New(1e8)}
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for _, tt := range []struct {
		name string
		resp *rlsv3.RateLimitResponse
		want envoyAnswer
	}{
		{"ok", &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, limit)}},
			envoyAnswer{overall: ok, statuses: 1, code: ok, matched: true}},
		{"over", &rlsv3.RateLimitResponse{OverallCode: over, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(over, limit)}},
			envoyAnswer{overall: over, statuses: 1, code: over, matched: true}},
		{"no rule", &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: ok}}},
			envoyAnswer{overall: ok, statuses: 1, code: ok}},
		{"two statuses", &rlsv3.RateLimitResponse{OverallCode: over, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: ok}, st(over, limit)}},
			envoyAnswer{overall: over, statuses: 2, code: ok}},
		{"unknown", &rlsv3.RateLimitResponse{}, envoyAnswer{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readEnvoy(marshal(t, tt.resp))
			if err != nil || got != tt.want {
				t.Fatalf("readEnvoy = %+v, %v; want %+v", got, err, tt.want)
			}
			// The generated message gives the same answer.
			if want := envoyAnswerOf(tt.resp); got != want {
				t.Errorf("readEnvoy = %+v, but the generated message gives %+v", got, want)
			}
		})
	}
	b := marshal(t, &rlsv3.RateLimitResponse{OverallCode: ok, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st(ok, limit)}})
	if _, err := readEnvoy(b[:len(b)-2]); err == nil {
		t.Errorf("readEnvoy accepted a truncated answer")
	}
}

// The raw client's batches are those of the generated messages, byte for
// byte.
func TestAppendItem(t *testing.T) {
	var batch []byte
	req := &sluicev1.TakeBatchRequest{}
	for i := range 3 {
		m := &sluicev1.TakeRequest{Policy: "bench", Key: keyName(i), Cost: int64(i)}
		batch = appendItem(batch, marshal(t, m))
		req.Requests = append(req.Requests, m)
	}
	if want := marshal(t, req); !bytes.Equal(batch, want) {
		t.Errorf("batch %x, want %x", batch, want)
	}
}
