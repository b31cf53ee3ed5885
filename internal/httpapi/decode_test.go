package httpapi

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// scanBody runs the scanner on body as decode does, into a new value of
// the kind batch says.
func scanBody(body string, batch bool) (any, bool) {
	s := scanner{b: []byte(body)}
	if batch {
		var v batchRequest
		return &v, s.batch(&v) && s.end()
	}
	var v decisionRequest
	return &v, s.request(&v) && s.end()
}

// strictBody runs encoding/json on body as decode does.
func strictBody(body string, batch bool) (any, error) {
	var v any = new(decisionRequest)
	if batch {
		v = new(batchRequest)
	}
	return v, decodeStrict([]byte(body), v)
}

// checkAgrees fails if the scanner accepts body and encoding/json does not,
// or parses it to another value.
func checkAgrees(t *testing.T, body string, batch bool) (scanned bool) {
	t.Helper()
	got, ok := scanBody(body, batch)
	if !ok {
		return false
	}
	want, err := strictBody(body, batch)
	if err != nil {
		t.Fatalf("scanner accepts %q, encoding/json refuses it: %v", body, err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("scanner parses %q unlike encoding/json (-want +got):\n%s", body, diff)
	}
	return true
}

// bodies are request bodies the scanner must read as encoding/json does
// (fast true), or leave to it (fast false).
var bodies = []struct {
	body  string
	batch bool
	fast  bool
}{
	{`{"policy":"api","key":"k"}`, false, true},
	{`{"policy":"api","key":"k","cost":2,"request_id":"r-1"}`, false, true},
	{" \t\r\n{ \"key\" : \"k\" ,\n \"policy\":\"api\" } \n", false, true},
	{`{"cost":0}`, false, true},
	{`{"cost":123456789012345678}`, false, true},
	{`{}`, false, true},
	{`{"policy":"","key":""}`, false, true},
	{`{"key":"a b~!#$%&'()*+,-./:;<=>?@[]^_{|}` + "`" + `"}`, false, true},
	{`{"requests":[{"policy":"api","key":"k"},{"policy":"api","key":"j","cost":3}]}`, true, true},
	{`{"requests":[]}`, true, true},
	{` { "requests" : [ { } , {"key":"k"} ] } `, true, true},

	{`{"policy":"a","policy":"b"}`, false, false}, // encoding/json keeps the last
	{`{"Policy":"a"}`, false, false},              // matched case-insensitively
	{`{"POLICY":"a","KEY":"k"}`, false, false},
	{`{"policy":null}`, false, false},
	{`{"cost":null}`, false, false},
	{`{"cost":01}`, false, false},
	{`{"cost":-1}`, false, false},
	{`{"cost":-0}`, false, false},
	{`{"cost":1.0}`, false, false},
	{`{"cost":1e2}`, false, false},
	{`{"cost":1E2}`, false, false},
	{`{"cost":1234567890123456789}`, false, false},
	{`{"cost":9223372036854775808}`, false, false},
	{`{"cost":"1"}`, false, false},
	{`{"key":"\u006b"}`, false, false},
	{`{"key":"\"quoted\""}`, false, false},
	{`{"key":"é"}`, false, false},
	{"{\"key\":\"\xff\"}", false, false},
	{"{\"key\":\"tab\there\"}", false, false},
	{`{"key":"k",}`, false, false},
	{`{"key":"k"`, false, false},
	{`{"key":"k"} {}`, false, false},
	{`{"key":"k"}x`, false, false},
	{`{"keys":"k"}`, false, false},
	{`{"":"k"}`, false, false},
	{`[]`, false, false},
	{`null`, false, false},
	{``, false, false},
	{`{"requests":null}`, true, false},
	{`{"requests":[{"policy":"api"},]}`, true, false},
	{`{"requests":[],"requests":[]}`, true, false},
	{`{"requests":[{"policy":"a","policy":"b"}]}`, true, false},
	{`{"requests":[{"Key":"k"}]}`, true, false},
	{`{}`, true, false},
	{`{"requests":[]} []`, true, false},
}

func TestScanner(t *testing.T) {
	for _, tt := range bodies {
		if scanned := checkAgrees(t, tt.body, tt.batch); scanned != tt.fast {
			t.Errorf("scanner on %q (batch %v): accepted %v, want %v", tt.body, tt.batch, scanned, tt.fast)
		}
	}
	// What the load generator (bench/http) and sluice take send.
	var items []string
	for range 100 {
		items = append(items, `{"policy":"bench","key":"k1234"}`)
	}
	if !checkAgrees(t, `{"requests":[`+strings.Join(items, ",")+`]}`, true) {
		t.Errorf("scanner leaves a batch of 100 to encoding/json")
	}
	if !checkAgrees(t, `{"cost":1,"key":"k","policy":"api","request_id":""}`, false) {
		t.Errorf("scanner leaves the body of sluice take to encoding/json")
	}
}

// FuzzScanner: whatever the scanner accepts, encoding/json accepts and
// parses to the same request.
func FuzzScanner(f *testing.F) {
	for _, tt := range bodies {
		f.Add(tt.body, tt.batch)
	}
	f.Fuzz(func(t *testing.T, body string, batch bool) {
		checkAgrees(t, body, batch)
	})
}
