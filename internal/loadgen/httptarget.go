package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
)

// reducedCapacity is the problem type of the service's answer to a
// degraded denial (docs/service.md): a decision, not an error.
const reducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"

// maxAnswerBytes bounds the answer to one take; a batch's is that times
// its size.
const maxAnswerBytes = 64 << 10

// httpTarget sends POST /v1/take, or /v1/take:batch, over net/http: one
// keep-alive connection per request slot at most. Only one attempt is made
// of each request (net/http retries no POST), so that every take the
// service counts is one the generator counts.
type httpTarget struct {
	base   string // scheme://host:port, no trailing slash
	url    string // of the take or batch
	policy []byte // JSON string
	prefix []byte // `{"policy":P,"key":"`
	batch  int
	header http.Header // shared, never written after Open
	client *http.Client
	tr     *http.Transport
}

func openHTTP(ctx context.Context, c TargetConfig) (Target, error) {
	u, err := url.Parse(c.URL)
	if err != nil || u.Host == "" || u.Hostname() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("%w: target %q: want http://HOST:PORT or https://HOST:PORT, without a path", sluice.ErrInvalidOption, redact(c.URL))
	}
	if err := checkHost(ctx, c.URL, u.Hostname(), c.AllowRemote); err != nil {
		return nil, err
	}
	policy, _ := json.Marshal(c.Policy) // a string: cannot fail
	t := &httpTarget{
		base:   u.Scheme + "://" + u.Host,
		policy: policy,
		batch:  c.Batch,
		header: http.Header{"Content-Type": {"application/json"}},
	}
	t.prefix = append(append([]byte(`{"policy":`), policy...), `,"key":`...)
	t.url = t.base + "/v1/take"
	if c.Batch > 1 {
		t.url = t.base + "/v1/take:batch"
	}
	if c.Token != "" {
		t.header.Set("Authorization", "Bearer "+c.Token)
	}
	t.tr = &http.Transport{
		Proxy:               nil, // the load goes to the host named, never through a proxy
		DialContext:         checkedDial(c.URL, c.AllowRemote, c.Timeout),
		MaxIdleConns:        c.Slots,
		MaxIdleConnsPerHost: c.Slots,
		MaxConnsPerHost:     c.Slots,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
		TLSHandshakeTimeout: c.Timeout,
	}
	t.client = &http.Client{
		Transport: t.tr,
		// A redirect would send the load elsewhere: it is an answer.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return t, nil
}

func (t *httpTarget) Describe() string {
	return fmt.Sprintf("POST %s, policy %s", t.url, t.policy)
}

func (t *httpTarget) Close() error {
	t.tr.CloseIdleConnections()
	return nil
}

// post sends body to url and returns the status and the answer's body,
// read up to limit bytes.
func (t *httpTarget) post(ctx context.Context, url string, body []byte, answer *bytes.Buffer, limit int64) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header = t.header
	resp, err := t.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	answer.Reset()
	if _, err := answer.ReadFrom(io.LimitReader(resp.Body, limit)); err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

// appendTake appends the JSON of one take.
func (t *httpTarget) appendTake(b []byte, it Item) []byte {
	b = append(b, t.prefix...)
	b = appendJSONString(b, it.Key)
	b = append(b, `,"cost":`...)
	b = strconv.AppendInt(b, it.Cost, 10)
	return append(b, '}')
}

// appendJSONString appends s as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	safe := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			safe = false
			break
		}
	}
	if safe {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	q, _ := json.Marshal(s) // a string: cannot fail
	return append(b, q...)
}

func (t *httpTarget) Check(ctx context.Context, key string, cost int64) error {
	body := t.appendTake(nil, Item{Key: key, Cost: cost})
	var answer bytes.Buffer
	status, err := t.post(ctx, t.base+"/v1/peek", body, &answer, maxAnswerBytes)
	if err != nil {
		return fmt.Errorf("cannot reach the service at %s: %w", t.base, err)
	}
	if status == http.StatusOK {
		var d struct {
			Allowed *bool `json:"allowed"`
		}
		if json.Unmarshal(answer.Bytes(), &d) != nil || d.Allowed == nil {
			return fmt.Errorf("%s answered POST /v1/peek with %.200q, not a decision: is it a sluice service?", t.base, answer.Bytes())
		}
		return nil
	}
	p := readProblem(answer.Bytes())
	switch {
	case status == http.StatusNotFound && p.Field == "policy":
		return fmt.Errorf("the service at %s has no policy %s (GET /v1/status lists its policies)", t.base, t.policy)
	case status == http.StatusUnauthorized && t.header.Get("Authorization") == "":
		return fmt.Errorf("the service at %s requires a bearer token: name the environment variable holding it with -token-env", t.base)
	case status == http.StatusUnauthorized:
		return fmt.Errorf("the service at %s refused the bearer token", t.base)
	case status == http.StatusServiceUnavailable && p.Type == reducedCapacity:
		return nil // a degraded decision: the service answers
	}
	return fmt.Errorf("the service at %s answered a peek of policy %s with %d: %s", t.base, t.policy, status, p.text(answer.Bytes()))
}

// problem is what the generator reads of an RFC 9457 problem.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Field  string `json:"field"`
}

func readProblem(b []byte) problem {
	var p problem
	json.Unmarshal(b, &p) //nolint:errcheck // a body that is not a problem leaves it empty
	return p
}

// text says the problem in words, or quotes the body it is not.
func (p problem) text(body []byte) string {
	switch {
	case p.Title != "" && p.Detail != "":
		return p.Title + ": " + p.Detail
	case p.Title != "":
		return p.Title
	}
	return strconv.Quote(truncate(string(body), 200))
}

// decision is what the generator reads of a decision or a batch item.
type decision struct {
	Allowed      *bool    `json:"allowed"`
	Degraded     bool     `json:"degraded"`
	ShadowDenied bool     `json:"shadow_denied"`
	Error        *problem `json:"error"`
}

func (d *decision) result(status int) Result {
	switch {
	case d.Error != nil && d.Error.Type == reducedCapacity:
		return Result{Outcome: Denied, Degraded: true}
	case d.Error != nil:
		return fail("http "+strconv.Itoa(d.Error.Status), d.Error.text(nil))
	case d.Allowed == nil:
		return fail("bad answer", "a batch item is neither a decision nor an error")
	case *d.Allowed:
		return Result{Outcome: Allowed, Degraded: d.Degraded, ShadowDenied: d.ShadowDenied}
	}
	return Result{Outcome: Denied, Degraded: d.Degraded}
}

type httpSender struct {
	t      *httpTarget
	body   []byte
	answer bytes.Buffer
	batch  struct {
		Results []decision `json:"results"`
	}
}

func (t *httpTarget) Sender(int) Sender { return &httpSender{t: t} }

func (s *httpSender) Send(ctx context.Context, items []Item, out []Result) time.Time {
	t := s.t
	// A new body each time: net/http may still hold the last one's
	// reader after the answer is in.
	b := make([]byte, 0, len(s.body))
	if len(items) == 1 && t.batch == 1 {
		b = t.appendTake(b, items[0])
	} else {
		b = append(b, `{"requests":[`...)
		for i, it := range items {
			if i > 0 {
				b = append(b, ',')
			}
			b = t.appendTake(b, it)
		}
		b = append(b, "]}"...)
	}
	s.body = b
	status, err := t.post(ctx, t.url, b, &s.answer, int64(maxAnswerBytes*len(items)))
	answered := time.Now()
	if err != nil {
		setAll(out, fail(errorKind(err), err.Error()))
		return answered
	}
	body := s.answer.Bytes()
	if status != http.StatusOK {
		p := readProblem(body)
		if status == http.StatusServiceUnavailable && p.Type == reducedCapacity {
			setAll(out, Result{Outcome: Denied, Degraded: true})
			return answered
		}
		setAll(out, fail("http "+strconv.Itoa(status), p.text(body)))
		return answered
	}
	if t.batch == 1 {
		var d decision
		if err := json.Unmarshal(body, &d); err != nil || d.Allowed == nil {
			out[0] = fail("bad answer", fmt.Sprintf("%.200q is not a decision", body))
			return answered
		}
		out[0] = d.result(status)
		return answered
	}
	s.batch.Results = s.batch.Results[:0]
	if err := json.Unmarshal(body, &s.batch); err != nil || len(s.batch.Results) != len(items) {
		setAll(out, fail("bad answer", fmt.Sprintf("%.200q is not %d results", body, len(items))))
		return answered
	}
	for i := range s.batch.Results {
		out[i] = s.batch.Results[i].result(status)
		s.batch.Results[i] = decision{}
	}
	return answered
}

func setAll(out []Result, r Result) {
	for i := range out {
		out[i] = r
	}
}
