package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// The outage test of this file runs two instances of sluice serve on a
// private redis-server of its own (internal/redistest), drives 64 clients
// over both, kills Redis for 3 s under that load and starts it again on the
// same port. The private server keeps nothing on disk: the restarted one
// has lost every bucket, and the key starts full again (a missing bucket
// is a full one). So the exact count is that of the restarted server: the
// load drains the key after the restart, and Redis allows the capacity and
// no more. (Before the kill, some hundred takes into the key, Redis has
// allowed no more than the capacity either; that two instances drain one
// key exactly is TestServeManyInstancesOneQuota.) A store call cut short
// may have charged the bucket all the same, its reply lost: the allowed
// takes may fall short of the capacity by the store calls that failed from
// a third into the outage on, never by more.

// outcome is one take as a client saw it. The times are since the start of
// the load, on the monotonic clock.
type outcome struct {
	instance       int
	sent, received time.Duration
	status         int
	allowed        bool
	degraded       bool // a 200's degraded field
	problem        string
	retryAfter     string
	rateLimit      bool // a RateLimit field was sent
	err            error
}

// storeDecided reports whether o is a decision Redis made: a 200 that is
// not degraded.
func (o outcome) storeDecided() bool { return o.err == nil && o.status == 200 && !o.degraded }

func (o outcome) String() string {
	if o.err != nil {
		return fmt.Sprintf("instance %d, sent at %v, answered at %v: %v", o.instance, o.sent, o.received, o.err)
	}
	head := fmt.Sprintf("instance %d, sent at %v, answered at %v: %d", o.instance, o.sent.Round(time.Microsecond), o.received.Round(time.Microsecond), o.status)
	if o.status == 200 {
		return fmt.Sprintf("%s allowed=%v degraded=%v RateLimit=%v", head, o.allowed, o.degraded, o.rateLimit)
	}
	return fmt.Sprintf("%s problem=%q Retry-After=%q RateLimit=%v", head, o.problem, o.retryAfter, o.rateLimit)
}

// TestServeOutage: Redis killed for 3 s under the load of 64 clients over
// two instances. Every answer during the outage is the failure mode's and
// says it is degraded (fail closed: a 503 of problem type
// temporary-reduced-capacity, never a 429 and never allowed; fail open: a
// 200 allowed and degraded); no answer claims to be Redis's while Redis is
// down; both instances decide in Redis again within the breaker's probe
// interval (and a slack) of its return, and the guard's metrics saw it all;
// and the restarted Redis allows the capacity, no more (and no less than
// the store calls that failed around the restart can explain).
func TestServeOutage(t *testing.T) {
	for _, mode := range []string{"closed", "open"} {
		t.Run(mode, func(t *testing.T) { testOutage(t, mode) })
	}
}

func testOutage(t *testing.T, mode string) {
	const (
		clients = 64
		// Half the capacity of TestServeManyInstancesOneQuota: the key is
		// drained after the restart, and on a loaded machine (a load
		// average of 14) 1,000 takes made the test last 20 s and more.
		capacity = 500
		outage   = 3 * time.Second
		// A generous deadline for a loaded machine (under a load average
		// of 12, calls to a healthy Redis passed 250ms, and now and then
		// 1s): with Redis up no call reaches it, so every answer is Redis's
		// but during the outage. A killed Redis refuses connections, which
		// fail at once whatever the deadline (TestOutageRefusedDial).
		timeout = 2 * time.Second
		probe   = 500 * time.Millisecond
		// The slack of recovery: the probe's own call (a new connection,
		// the script loaded again into the new server) on a loaded
		// machine.
		recoverySlack = 500 * time.Millisecond
		// The waits for the load give up then: each subtest ends within
		// 5 s + 3 s + 6 s, the restart and the start of its servers.
		warmWithin  = 5 * time.Second
		drainWithin = 6 * time.Second
		// No take may take this long: a hang (the client gives up at 5s).
		maxLatency = 4 * time.Second
	)
	srv := redistest.Private(t)
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	text := fmt.Sprintf(`listen:
  http: "127.0.0.1:0"
  admin: "127.0.0.1:0"
  grpc: "127.0.0.1:0"
store:
  type: redis
  redis:
    url: "redis://%s/0"
guard:
  timeout: %v
  failure_mode: %s
  breaker:
    consecutive_failures: 5
    probe_interval: %v
policies:
  api:
    limit: "%d 0/s"
`, srv.Addr(), timeout, mode, probe, capacity)
	if err := writeFile(path, text); err != nil {
		t.Fatal(err)
	}
	servers := []*server{startServe(t, "-config", path, "-watch=false"), startServe(t, "-config", path, "-watch=false")}

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer client.CloseIdleConnections()
	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		results  = make([][]outcome, clients)
		killedAt atomic.Int64 // since start; math.MaxInt64 until the kill
		// Live counts of Redis's decisions, before the kill and after, and
		// of the other answers.
		allowedBefore, deniedBefore, allowedAfter, deniedAfter atomic.Int64
		others                                                 atomic.Int64
		lastOther                                              atomic.Pointer[outcome]
		recovered                                              [2]atomic.Bool
	)
	killedAt.Store(math.MaxInt64)
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			i := c % len(servers)
			for !stop.Load() {
				o := takeTimed(client, servers[i].api, start)
				o.instance = i
				results[c] = append(results[c], o)
				if !o.storeDecided() {
					others.Add(1)
					lastOther.Store(&o)
					continue
				}
				after := int64(o.sent) >= killedAt.Load()
				switch {
				case !after && o.allowed:
					allowedBefore.Add(1)
				case !after:
					deniedBefore.Add(1)
				case o.allowed:
					allowedAfter.Add(1)
					recovered[i].Store(true)
				default:
					deniedAfter.Add(1)
					recovered[i].Store(true)
				}
			}
		})
	}
	stopped := false
	stopLoad := func() {
		if !stopped {
			stopped = true
			stop.Store(true)
			wg.Wait()
		}
	}
	defer stopLoad()
	waitLoad := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !cond() {
			if time.Now().After(deadline) {
				last := "none"
				if o := lastOther.Load(); o != nil {
					last = o.String()
				}
				t.Fatalf("not within %v: %s (allowed %d and denied %d by Redis before the kill, %d and %d after; %d other answers, the last: %s)", d, what,
					allowedBefore.Load(), deniedBefore.Load(), allowedAfter.Load(), deniedAfter.Load(), others.Load(), last)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// Under way: each client has had answers from Redis.
	waitLoad("the load under way", warmWithin, func() bool { return allowedBefore.Load()+deniedBefore.Load() >= 2*clients })
	killStart := time.Since(start)
	srv.Kill() // returns once the process is gone: nothing answers after
	killed := time.Since(start)
	killedAt.Store(int64(killed))
	time.Sleep(time.Until(start.Add(killed + outage/3)))
	// A third into the outage: each breaker is open (or probing), and the
	// failed store calls are counted. Those that fail from then on bound
	// the charges whose reply was lost after the restart. Both instances
	// are read at once, so that the outage does not last longer while a
	// loaded machine serves the metrics.
	var (
		mid          [2]string
		midErr       [2]error
		scrape       sync.WaitGroup
		failedBefore [2]float64
	)
	for i, s := range servers {
		scrape.Go(func() { mid[i], midErr[i] = scrapeMetrics(s) })
	}
	scrape.Wait()
	for i := range servers {
		if midErr[i] != nil {
			t.Fatalf("instance %d: %v", i, midErr[i])
		}
		if got := metricSum(mid[i], "sluice_breaker_state", `state="closed"`); got != 0 {
			t.Errorf("instance %d, %v into the outage: sluice_breaker_state{state=\"closed\"} = %v, want 0 (open or half-open)", i, outage/3, got)
		}
		failedBefore[i] = metricSum(mid[i], "sluice_store_errors_total", `op="take"`)
		if failedBefore[i] == 0 {
			t.Errorf("instance %d: sluice_store_errors_total is 0 %v into an outage under load, want its failed store calls", i, outage/3)
		}
	}
	time.Sleep(time.Until(start.Add(killed + outage)))
	restart := time.Since(start) // nothing answers before
	srv.Restart(t)
	ready := time.Since(start) // the new server answers a PING
	// Both instances deciding in Redis again, and the new key drained:
	// with no refill, one denial means it is empty.
	waitLoad("both instances deciding in Redis again, the new key drained", drainWithin, func() bool {
		return recovered[0].Load() && recovered[1].Load() && deniedAfter.Load() >= clients &&
			time.Since(start) > ready+probe+recoverySlack+100*time.Millisecond
	})
	stopLoad()

	var all []outcome
	for _, r := range results {
		all = append(all, r...)
	}
	var (
		broken   int
		failures []string // the first few
		fail     = func(why string, o outcome) {
			if broken++; broken <= 10 {
				failures = append(failures, why+": "+o.String())
			}
		}
		inOutage    [2]int           // answers to takes sent after the kill, received before the restart
		firstStore  [2]time.Duration // when each instance first gave Redis's answer after the kill
		storeBefore int              // allowed by the killed Redis
		storeAfter  int              // allowed by the restarted one
		latency     time.Duration
	)
	firstStore[0], firstStore[1] = math.MaxInt64, math.MaxInt64
	for _, o := range all {
		if o.err != nil {
			fail("take failed", o)
			continue
		}
		latency = max(latency, o.received-o.sent)
		if o.received-o.sent > maxLatency {
			fail(fmt.Sprintf("took longer than %v", maxLatency), o)
		}
		// The shape of every answer, whenever it came.
		switch {
		case o.status == 429:
			fail("a 429: an outage or a quota denial dressed as one", o)
		case o.status == 200 && o.degraded && mode == "closed":
			fail("a degraded 200 while failing closed: a degraded denial is a 503, and fail-closed allows nothing", o)
		case o.status == 200 && o.degraded && (!o.allowed || o.rateLimit):
			fail("a degraded 200 while failing open must be allowed, without a RateLimit field", o)
		case o.status == 503 && mode == "open":
			fail("a 503 while failing open", o)
		case o.status == 503 && (o.problem != reducedCapacity || o.retryAfter != "1" || o.rateLimit):
			fail("a 503 that is not a degraded denial (problem type temporary-reduced-capacity, Retry-After the probe interval rounded up, no RateLimit field)", o)
		case o.status != 200 && o.status != 503:
			fail("an answer that is neither a decision nor a degraded denial", o)
		}
		// The outage is [killed, restart): from the moment the killed
		// process is gone (Kill returns once it is reaped, its sockets
		// closed) to the moment the new one is started. A take sent in it
		// reached the guard after Redis was gone, and one answered in it
		// was not decided by the new server: no take both sent and
		// answered in it can have Redis's answer. Takes in flight at the
		// kill (sent before killed) may have been decided by Redis just
		// before it died, and are only held to the shape above, as are
		// takes sent during the outage and answered after the restart
		// (by the new server, or by the failure mode).
		degraded := !o.storeDecided()
		switch {
		case o.received < killStart:
			// Redis was up all along: every answer is its own.
			if degraded {
				fail("a degraded answer before the kill", o)
			}
		case o.sent >= killed && o.received < restart:
			inOutage[o.instance]++
			if !degraded {
				fail("an answer from Redis while Redis was down", o)
			}
		}
		if o.sent >= killed && !degraded {
			firstStore[o.instance] = min(firstStore[o.instance], o.received)
		}
		switch {
		case degraded || !o.allowed:
		case o.sent >= killed:
			// Sent when the killed server was gone: the new one decided.
			storeAfter++
		case o.received < restart:
			// Answered before the new server was started: the killed one.
			storeBefore++
		default:
			fail("allowed by Redis but in flight through the whole outage: which server decided it cannot be told", o)
		}
	}
	// Recovered: once an instance decides in Redis again, it goes on doing
	// so (a take sent after that answer is not degraded), and it does so
	// within the probe interval and the slack of Redis answering again
	// (every take sent later is Redis's answer, whenever it arrived).
	recoveredBy := ready + probe + recoverySlack
	var late [2]int
	for _, o := range all {
		if o.err != nil {
			continue
		}
		if o.sent > recoveredBy {
			late[o.instance]++
		}
		switch {
		case o.storeDecided():
		case o.sent > firstStore[o.instance]:
			fail("degraded after the instance had recovered", o)
		case o.sent > recoveredBy:
			fail(fmt.Sprintf("degraded %v after Redis answered again, beyond the probe interval %v and %v", o.sent-ready, probe, recoverySlack), o)
		}
	}
	for i := range servers {
		if inOutage[i] < 50 {
			t.Errorf("instance %d answered %d takes sent and answered during the outage, want at least 50: the outage was not under load", i, inOutage[i])
		}
		if late[i] == 0 {
			t.Errorf("instance %d answered no take sent %v after Redis answered again: nothing shows it recovered", i, recoveredBy-ready)
		}
	}
	// Every degraded answer was counted as one, on the instance that gave
	// it; the breakers are closed again; the store calls that failed from
	// a third into the outage on bound the charges whose reply was lost.
	lost := 0.0
	for i, s := range servers {
		var want [2]float64 // degraded allowed, degraded denied
		for _, o := range all {
			if o.instance == i && o.err == nil && !o.storeDecided() {
				if o.status == 200 {
					want[0]++
				} else {
					want[1]++
				}
			}
		}
		m, err := scrapeMetrics(s)
		if err != nil {
			t.Fatalf("instance %d: %v", i, err)
		}
		for j, result := range []string{"degraded_allowed", "degraded_denied"} {
			if got := metricSum(m, "sluice_decisions_total", `op="take"`, `result="`+result+`"`); got != want[j] {
				t.Errorf("instance %d: sluice_decisions_total{result=%q} = %v, want %v (its degraded answers)", i, result, got, want[j])
			}
		}
		if got := metricSum(m, "sluice_degraded_total", `failure_mode="`+mode+`"`); got != want[0]+want[1] {
			t.Errorf("instance %d: sluice_degraded_total{failure_mode=%q} = %v, want %v (its degraded answers)", i, mode, got, want[0]+want[1])
		}
		if got := metricSum(m, "sluice_breaker_state", `state="closed"`); got != 1 {
			t.Errorf("instance %d, recovered: sluice_breaker_state{state=\"closed\"} = %v, want 1", i, got)
		}
		lost += metricSum(m, "sluice_store_errors_total", `op="take"`) - failedBefore[i]
	}
	if storeBefore > capacity || storeAfter > capacity || float64(storeAfter) < capacity-lost {
		t.Errorf("Redis allowed %d takes before the kill and %d after the restart, want at most %d before and %d after, less at most %v (the store calls that failed from a third into the outage on): the restarted server starts the key full",
			storeBefore, storeAfter, capacity, capacity, lost)
	}
	if broken > 0 {
		t.Errorf("%d of %d answers broke the failure mode %q or the outage's rules; the first:\n%s", broken, len(all), mode, strings.Join(failures, "\n"))
	}
	if t.Failed() {
		t.Logf("breaker changes of instance 0:\n%s", breakerLines(servers[0].stderr.String()))
		t.Logf("breaker changes of instance 1:\n%s", breakerLines(servers[1].stderr.String()))
	}
	t.Logf("%d takes; killed at %v, restarted at %v, answering at %v; %d and %d answers during the outage; in Redis again after %v and %v; longest take %v; %d allowed by Redis before, %d after (%v store calls failed from a third into the outage on)",
		len(all), killed.Round(time.Millisecond), restart.Round(time.Millisecond), ready.Round(time.Millisecond), inOutage[0], inOutage[1],
		(firstStore[0] - ready).Round(time.Millisecond), (firstStore[1] - ready).Round(time.Millisecond), latency.Round(time.Millisecond),
		storeBefore, storeAfter, lost)
}

// takeTimed takes one token of the key "shared" of the policy api.
func takeTimed(client *http.Client, api string, start time.Time) outcome {
	o := outcome{sent: time.Since(start)}
	resp, err := client.Post(api+"/v1/take", "application/json", strings.NewReader(`{"policy":"api","key":"shared"}`))
	if err != nil {
		o.err = err
		o.received = time.Since(start)
		return o
	}
	defer resp.Body.Close()
	o.status = resp.StatusCode
	o.retryAfter = resp.Header.Get("Retry-After")
	o.rateLimit = resp.Header.Get("RateLimit") != ""
	var body struct {
		Allowed  bool   `json:"allowed"`
		Degraded bool   `json:"degraded"`
		Type     string `json:"type"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		o.err = fmt.Errorf("%d answer: %w", resp.StatusCode, err)
	}
	o.allowed, o.degraded, o.problem = body.Allowed, body.Degraded, body.Type
	o.received = time.Since(start)
	return o
}

// scrapeMetrics returns the metrics of s in the text exposition format.
func scrapeMetrics(s *server) (string, error) {
	resp, err := http.Get(s.admin + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != 200 {
		err = fmt.Errorf("GET /metrics = %d", resp.StatusCode)
	}
	return string(b), err
}

// metricSum returns the sum of the series of the metric name, in a
// Prometheus text exposition, whose labels include every one of labels
// (each written name="value"); 0 if there is none.
func metricSum(text, name string, labels ...string) float64 {
	sum := 0.0
	for line := range strings.SplitSeq(text, "\n") {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		set, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		match := true
		for _, l := range labels {
			if !slices.Contains(strings.Split(set, ","), l) {
				match = false
			}
		}
		if v, err := strconv.ParseFloat(value, 64); match && err == nil {
			sum += v
		}
	}
	return sum
}

func breakerLines(log string) string {
	var out []string
	for line := range strings.SplitSeq(log, "\n") {
		if strings.Contains(line, "circuit breaker") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestOutageRefusedDial: while Redis refuses connections, a decision
// through the service's Redis client fails at once with the store's error,
// for each way of reaching Redis. go-redis's default dials five times,
// 100ms apart (a sentinel client until the deadline): each probe of the
// breaker then held for that long, recovery waited for the probe after it,
// and the failures were counted as timeouts.
func TestOutageRefusedDial(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now: a dial is refused
	const within = 250 * time.Millisecond
	for _, tc := range []struct {
		name  string
		redis config.RedisStore
	}{
		{"url", config.RedisStore{URL: config.NewURL("redis://" + addr + "/0")}},
		{"cluster", config.RedisStore{Cluster: []string{addr}}},
		{"sentinel", config.RedisStore{Sentinel: config.Sentinel{Master: "sluice", Addrs: []string{addr}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, err := redisClient(tc.redis)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			st, err := redisstore.New(client, redisstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			begin := time.Now()
			_, err = st.Take(ctx, sluice.Request{Policy: "api", Key: "k", Cost: 1, Limit: sluice.Limit{Capacity: 1, Rate: sluice.PerSecond(1)}})
			took := time.Since(begin)
			if !errors.Is(err, sluice.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || took > within {
				t.Fatalf("Take with Redis refusing connections = %v after %v, want the store's refusal within %v", err, took.Round(time.Millisecond), within)
			}
		})
	}
}
