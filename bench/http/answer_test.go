package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// wantOutcomes reads a batch answer with encoding/json.
func wantOutcomes(t *testing.T, answer string) []outcome {
	t.Helper()
	var b struct {
		Results []struct {
			Allowed *bool `json:"allowed"`
			Error   *struct {
				Status int `json:"status"`
			} `json:"error"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(answer), &b); err != nil {
		t.Fatalf("encoding/json refuses %q: %v", answer, err)
	}
	var out []outcome
	for _, r := range b.Results {
		switch {
		case r.Error != nil:
			out = append(out, outcome{status: r.Error.Status})
		case r.Allowed != nil:
			out = append(out, outcome{decided: true, allowed: *r.Allowed})
		default:
			t.Fatalf("result without a decision in %q", answer)
		}
	}
	return out
}

func TestReadBatch(t *testing.T) {
	decision := `{"allowed":%s,"remaining":1,"retry_after_ms":null,"reset_after_ms":30000,"never":true,"policy":"a\"}b","limit":"2 2/m","replayed":false,"degraded":false}`
	allowed, denied := strings.Replace(decision, "%s", "true", 1), strings.Replace(decision, "%s", "false", 1)
	problem := `{"error":{"type":"about:blank","title":"x \\ [y]","status":404,"detail":"{\"a\":1}","field":"policy"}}`
	for _, answer := range []string{
		`{"results":[` + allowed + `,` + problem + `,` + denied + `]}` + "\n",
		` { "results" : [ ` + denied + ` ] , "extra" : [1, -2.5e3, {"x": [true, false, null]}] } `,
		`{"results":[]}`,
		`{"results":[{"remaining":-1,"allowed":true,"shadow_denied":true}]}`,
	} {
		got, err := readBatch([]byte(answer), nil)
		if err != nil {
			t.Errorf("readBatch(%q): %v", answer, err)
			continue
		}
		want := wantOutcomes(t, answer)
		if len(got) != len(want) {
			t.Errorf("readBatch(%q) = %+v, want %+v", answer, got, want)
			continue
		}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("readBatch(%q) = %+v, want %+v", answer, got, want)
			}
		}
	}
	for _, answer := range []string{
		``, `[]`, `{}`, `{"results":null}`, `{"results":[{}]}`, `{"results":[{"allowed":1}]}`,
		`{"results":[{"error":{}}]}`, `{"results":[{"allowed":true}`, `{"results":[{"allowed":true}]} x`,
		`{"results":[{"allowed":true,}]}`, `{"results":[{"allowed":true}],}`, "{\"results\":[{\"allowed\":true,\"p\":\"a\x01\"}]}",
		`{"results":[{"allowed":true,"p":-}]}`, `{"results":[{"allowed":true,"p":nul}]}`,
		`{"results":[{"allowed":true,"p":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}]}`,
	} {
		if got, err := readBatch([]byte(answer), nil); err == nil {
			t.Errorf("readBatch(%q) = %+v, want an error", answer, got)
		}
	}
}

func TestReadDecision(t *testing.T) {
	for answer, want := range map[string]outcome{
		`{"allowed":true,"remaining":99}` + "\n":       {decided: true, allowed: true},
		`{"remaining":0,"allowed":false,"never":true}`: {decided: true},
	} {
		if got, err := readDecision([]byte(answer)); err != nil || got != want {
			t.Errorf("readDecision(%q) = %+v, %v; want %+v", answer, got, err, want)
		}
	}
	for _, answer := range []string{`{"remaining":0}`, `{"allowed":true} {}`, `{"allowed":"true"}`, `null`} {
		if got, err := readDecision([]byte(answer)); err == nil {
			t.Errorf("readDecision(%q) = %+v, want an error", answer, got)
		}
	}
}
