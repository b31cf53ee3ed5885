package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/faultproxy"
	"github.com/sluicehq/sluice/pgstore"
	"github.com/sluicehq/sluice/sluicetest"
)

// TestSharedTransactionsSerial floods five keys from 48 callers of two
// stores that share one table (two processes), each store sending at most
// one transaction at a time, so that most takes go in shared transactions
// holding several keys, named in every order. The clock is frozen, so
// nothing refills, and the decisions must be those of some serial order:
// per key, the levels that the allowed takes found form the chain
// capacity, capacity - c1, ... down to what Peek finds at the end, every
// denial found one of those levels, and each decision is the model's at
// the level it found. A cycle of row locks between two transactions would
// fail takes with a deadlock (40P01), and a lost or doubled take would
// break the chain. A quarter of the takes carry one of eight request IDs
// (each with a cost of its own): a request ID's first allowed take must be
// its only one, and every later take of it a replay of that decision.
func TestSharedTransactionsSerial(t *testing.T) {
	const (
		callers, takes = 48, 40
		capacity       = 300
	)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	o := pgstore.Options{
		Now:              func() time.Time { return now },
		Batch:            8,
		Transactions:     1,
		StatementTimeout: time.Minute,
		LockTimeout:      time.Minute,
	}
	s1, table := newStoreTable(t, o)
	o.Table = table
	s2, err := pgstore.New(t.Context(), testPool, pgstore.Options{Schema: testSchema, Table: table, Now: o.Now, Batch: 8, Transactions: 1,
		StatementTimeout: time.Minute, LockTimeout: time.Minute, SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	stores := []*pgstore.Store{s1, s2}
	l := sluice.Limit{Capacity: capacity, Rate: sluice.PerSecond(1)}
	keys := []string{"a", "b", "c", "d", "e"}
	type taken struct {
		cost int64
		id   string
		d    sluice.Decision
	}
	var (
		mu   sync.Mutex
		got  = map[string][]taken{}
		errs []error
		wg   sync.WaitGroup
	)
	for w := range callers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			s := stores[w%2]
			for range takes {
				key, cost := keys[rng.IntN(len(keys))], rng.Int64N(4)+1
				r := sluice.Request{Policy: testPolicy, Key: key, Cost: cost, Limit: l}
				if rng.IntN(4) == 0 { // a request ID of its own cost
					j := rng.IntN(8)
					r.RequestID, r.Cost = fmt.Sprintf("id-%d", j), int64(j%4+1)
				}
				d, err := s.Take(context.Background(), r)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					got[key] = append(got[key], taken{r.Cost, r.RequestID, d})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d takes failed, the first: %v", len(errs), errs[0])
	}
	var shared uint64
	for _, s := range stores {
		shared += s.Stats().SharedTakes
	}
	if shared < callers*takes/4 {
		t.Fatalf("%d of %d takes went in shared transactions; want most, or the test proves little", shared, callers*takes)
	}
	t.Logf("%d of %d takes in shared transactions", shared, callers*takes)

	replays := 0
	for _, key := range keys {
		levels := map[int64]bool{}
		var allowed []taken
		// A request ID's first allowed take is remembered: every later
		// take of it is a replay of that decision, and charges nothing.
		first := map[string]sluice.Decision{}
		for _, x := range got[key] {
			if x.id != "" && x.d.Allowed && !x.d.Replayed {
				if _, ok := first[x.id]; ok {
					t.Fatalf("key %q: request ID %q was allowed twice", key, x.id)
				}
				first[x.id] = x.d
			}
		}
		for _, x := range got[key] {
			if x.d.Replayed {
				d := x.d
				d.Replayed = false
				if f, ok := first[x.id]; !ok || d != f {
					t.Fatalf("key %q: a replay of request ID %q = %+v; its allowed take decided %+v", key, x.id, x.d, f)
				}
				replays++
				continue
			}
			level := x.d.Remaining
			if x.d.Allowed {
				level += x.cost
				allowed = append(allowed, x)
			}
			levels[level] = true
			// The model's decision at that level, at the frozen time.
			m := sluicetest.NewModel(time.Microsecond, sluice.KeepTokens, time.Minute)
			at := now.UnixMicro()
			if level < capacity {
				if _, err := m.Take(at, sluice.Request{Policy: testPolicy, Key: key, Cost: capacity - level, Limit: l}); err != nil {
					t.Fatal(err)
				}
			}
			want, err := m.Take(at, sluice.Request{Policy: testPolicy, Key: key, Cost: x.cost, Limit: l})
			if err != nil {
				t.Fatal(err)
			}
			if x.d != want {
				t.Fatalf("key %q: take of %d = %+v; the model at level %d decides %+v", key, x.cost, x.d, level, want)
			}
		}
		slices.SortFunc(allowed, func(x, y taken) int { return int(y.d.Remaining - x.d.Remaining) })
		level := int64(capacity)
		chain := map[int64]bool{level: true}
		for _, x := range allowed {
			if x.d.Remaining+x.cost != level {
				t.Fatalf("key %q: an allowed take of %d left %d, but the level before it was %d: takes were lost, doubled or seen twice", key, x.cost, x.d.Remaining, level)
			}
			level = x.d.Remaining
			chain[level] = true
		}
		for l := range levels {
			if !chain[l] {
				t.Fatalf("key %q: a take found level %d, which no serial order of the allowed takes passes through", key, l)
			}
		}
		d, err := s1.Peek(context.Background(), sluice.Request{Policy: testPolicy, Key: key, Cost: 1, Limit: l})
		if err != nil || d.Remaining != level {
			t.Fatalf("Peek(%q) = %+v, %v; want %d remaining after the allowed takes", key, d, err, level)
		}
	}
	if replays == 0 {
		t.Fatal("no take was a replay of a request ID: the test proves little")
	}
	t.Logf("%d replays", replays)
}

// TestSharedTransactionRollback: a take whose call fails in a shared
// transaction (here at the lock timeout, its bucket held by another
// session) fails; the other takes of the transaction, rolled back with
// it, are sent again and charged once.
func TestSharedTransactionRollback(t *testing.T) {
	ctx := context.Background()
	s, table := newStoreTable(t, pgstore.Options{Transactions: 1, StatementTimeout: time.Minute, LockTimeout: 2 * time.Second})
	take := func(key string) (sluice.Decision, error) {
		return s.Take(ctx, sluice.Request{Policy: testPolicy, Key: key, Cost: 1, Limit: testLimit})
	}
	if _, err := take("held"); err != nil {
		t.Fatal(err)
	}
	lockRow(t, table, "held")
	type result struct {
		d   sluice.Decision
		err error
	}
	first := make(chan result, 1)
	go func() { // in flight alone: the others queue behind it
		d, err := take("held")
		first <- result{d, err}
	}()
	waitForLockWait(t, table)
	keys := []string{"b", "held", "a"}
	results := make([]result, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() { results[i].d, results[i].err = take(k) })
	}
	waitQueued(t, s, len(keys))
	wg.Wait()
	if r := <-first; !errors.Is(r.err, sluice.ErrUnavailable) {
		t.Fatalf("take of the held bucket = %+v, %v; want a lock timeout (ErrUnavailable)", r.d, r.err)
	}
	for i, k := range keys {
		r := results[i]
		if k == "held" {
			if !errors.Is(r.err, sluice.ErrUnavailable) {
				t.Errorf("queued take of the held bucket = %+v, %v; want a lock timeout (ErrUnavailable)", r.d, r.err)
			}
			continue
		}
		if r.err != nil || !r.d.Allowed || r.d.Remaining != testLimit.Capacity-1 {
			t.Errorf("take of %q, in a transaction with the held bucket = %+v, %v; want allowed, %d remaining", k, r.d, r.err, testLimit.Capacity-1)
		}
		d, err := s.Peek(ctx, sluice.Request{Policy: testPolicy, Key: k, Cost: 1, Limit: testLimit})
		if err != nil || d.Remaining != testLimit.Capacity-1 {
			t.Errorf("Peek(%q) = %+v, %v; want %d remaining: charged once", k, d, err, testLimit.Capacity-1)
		}
	}
	st := s.Stats()
	if st.LockTimeouts != 2 || st.SharedTransactions < 2 || st.SharedTakes < 5 {
		t.Errorf("Stats() = %+v; want 2 lock timeouts, and the three queued takes in a shared transaction, then the two rolled back in another", st)
	}
}

// TestSharedTransactionWithdrawn: a queued take whose context ends returns
// at once, and is never sent.
func TestSharedTransactionWithdrawn(t *testing.T) {
	ctx := context.Background()
	s, table := newStoreTable(t, pgstore.Options{Transactions: 1, StatementTimeout: time.Minute, LockTimeout: time.Minute})
	r := sluice.Request{Policy: testPolicy, Key: "held", Cost: 1, Limit: testLimit}
	if _, err := s.Take(ctx, r); err != nil {
		t.Fatal(err)
	}
	tx := lockRow(t, table, "held")
	first := make(chan error, 1)
	go func() {
		_, err := s.Take(ctx, r)
		first <- err
	}()
	waitForLockWait(t, table)
	// Behind it: a take that stays, and one whose context ends first.
	x := sluice.Request{Policy: testPolicy, Key: "x", Cost: 1, Limit: testLimit}
	stays := make(chan error, 1)
	go func() {
		_, err := s.Take(ctx, x)
		stays <- err
	}()
	waitQueued(t, s, 1)
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	w := sluice.Request{Policy: testPolicy, Key: "w", Cost: 1, Limit: testLimit}
	d, err := s.Take(wctx, w)
	if elapsed := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || elapsed > 5*time.Second {
		t.Fatalf("queued Take with a 100ms deadline = %+v, %v after %v; want context.DeadlineExceeded at its deadline", d, err, elapsed)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatalf("take of the held bucket: %v", err)
	}
	if err := <-stays; err != nil {
		t.Fatalf("queued take of %q: %v", x.Key, err)
	}
	if d, err := s.Peek(ctx, w); err != nil || d.Remaining != testLimit.Capacity {
		t.Fatalf("Peek(%q) = %+v, %v; want a full bucket: the withdrawn take was sent", w.Key, d, err)
	}
	if d, err := s.Peek(ctx, x); err != nil || d.Remaining != testLimit.Capacity-1 {
		t.Fatalf("Peek(%q) = %+v, %v; want %d remaining", x.Key, d, err, testLimit.Capacity-1)
	}
	if st := s.Stats(); st.SharedTakes != 0 {
		t.Fatalf("Stats() = %+v; want no shared takes: the one take left was sent alone", st)
	}
}

// TestSharedTransactionHeldRow: while another session holds a bucket's
// row, takes of it keep coming and fail at the lock timeout, and takes of
// other buckets are decided within a few lock timeouts, however many takes
// of the held bucket shared their transactions: the takes of the bucket
// whose call failed fail together, and the others are sent again by
// themselves, not with the takes queued since.
func TestSharedTransactionHeldRow(t *testing.T) {
	const lockTimeout = 200 * time.Millisecond
	ctx := context.Background()
	s, table := newStoreTable(t, pgstore.Options{Transactions: 1, StatementTimeout: time.Minute, LockTimeout: lockTimeout})
	held := sluice.Request{Policy: testPolicy, Key: "held", Cost: 1, Limit: testLimit}
	if _, err := s.Take(ctx, held); err != nil {
		t.Fatal(err)
	}
	tx := lockRow(t, table, "held")
	stop := make(chan struct{})
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		heldErrs []error
	)
	for range 6 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := s.Take(ctx, held)
				mu.Lock()
				heldErrs = append(heldErrs, err)
				mu.Unlock()
			}
		})
	}
	waitForLockWait(t, table)
	for i := range 5 {
		// Without the retry by themselves, a take that shared a
		// transaction with one of the held bucket would be rolled back
		// again and again while takes of it keep coming.
		fctx, cancel := context.WithTimeout(ctx, 25*lockTimeout)
		start := time.Now()
		d, err := s.Take(fctx, sluice.Request{Policy: testPolicy, Key: "free", Cost: 1, Limit: testLimit})
		cancel()
		if err != nil || !d.Allowed {
			t.Errorf("take %d of a free bucket while another is held = %+v, %v after %v; want allowed within a few lock timeouts (%v)", i, d, err, time.Since(start), lockTimeout)
		}
	}
	close(stop)
	wg.Wait()
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for _, err := range heldErrs {
		if !errors.Is(err, sluice.ErrUnavailable) {
			t.Fatalf("a take of the held bucket returned %v; want a lock timeout (ErrUnavailable)", err)
		}
	}
	if st := s.Stats(); st.SharedTakes == 0 {
		t.Fatalf("Stats() = %+v; want shared takes, or the test proves little", st)
	}
}

// TestSharedTransactionOneBucketFails: when a call fails at the lock
// timeout, the other takes of its bucket in the transaction fail with it,
// at once, rather than each in a round of its own, one lock timeout after
// another; a take of another bucket in the transaction is then decided
// after one lock timeout, not after one per take of the held bucket.
func TestSharedTransactionOneBucketFails(t *testing.T) {
	const (
		lockTimeout = 500 * time.Millisecond
		held        = 4 // queued takes of the held bucket
	)
	ctx := context.Background()
	s, table := newStoreTable(t, pgstore.Options{Transactions: 1, StatementTimeout: time.Minute, LockTimeout: lockTimeout})
	take := func(key string) (sluice.Decision, error) {
		return s.Take(ctx, sluice.Request{Policy: testPolicy, Key: key, Cost: 1, Limit: testLimit})
	}
	if _, err := take("held"); err != nil {
		t.Fatal(err)
	}
	lockRow(t, table, "held")
	lone := make(chan error, 1)
	go func() { // in flight alone, for up to one lock timeout
		_, err := take("held")
		lone <- err
	}()
	waitForLockWait(t, table)
	errs := make(chan error, held)
	for range held {
		go func() {
			_, err := take("held")
			errs <- err
		}()
	}
	waitQueued(t, s, held)
	start := time.Now()
	d, err := take("free") // queued last, sent first: "free" < "held"
	elapsed := time.Since(start)
	if err != nil || !d.Allowed {
		t.Fatalf("take of a free bucket = %+v, %v; want allowed", d, err)
	}
	// The lone take's remaining wait and one lock timeout of the shared
	// transaction: about two lock timeouts, where failing the held takes
	// one per round would take one more for each, about five.
	if limit := 7 * lockTimeout / 2; elapsed > limit {
		t.Errorf("take of a free bucket behind %d takes of a held one took %v; want about two lock timeouts (%v), at most %v, not one more per held take", held, elapsed, 2*lockTimeout, limit)
	}
	if err := <-lone; !errors.Is(err, sluice.ErrUnavailable) {
		t.Fatalf("lone take of the held bucket: %v; want a lock timeout", err)
	}
	for range held {
		if err := <-errs; !errors.Is(err, sluice.ErrUnavailable) {
			t.Fatalf("queued take of the held bucket: %v; want a lock timeout", err)
		}
	}
	if st := s.Stats(); st.LockTimeouts != held+1 || st.SharedTransactions != 1 {
		t.Errorf("Stats() = %+v; want %d lock timeouts and one shared transaction (the free take sent again by itself)", st, held+1)
	}
}

// TestSharedTransactionPanic: a take that panics (here in the pool's
// tracer) and is recovered by its caller still ends its flight, so the
// store goes on sending takes.
func TestSharedTransactionPanic(t *testing.T) {
	cfg := testPool.Config().Copy()
	tr := &panicTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Not closed: the connection whose tracer panicked was never released,
	// and Close would wait for it.
	s, _ := newStoreOn(t, pool, pgstore.Options{Transactions: 1})
	r := sluice.Request{Policy: testPolicy, Key: "k", Cost: 1, Limit: testLimit}
	if _, err := s.Take(t.Context(), r); err != nil { // the schema check, before the tracer panics
		t.Fatal(err)
	}
	tr.armed.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the tracer's panic did not reach the caller")
			}
		}()
		s.Take(t.Context(), r)
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if d, err := s.Take(ctx, r); err != nil || !d.Allowed {
		t.Fatalf("Take after a recovered panic = %+v, %v; want allowed", d, err)
	}
}

// panicTracer panics once in a query's start, once armed.
type panicTracer struct{ armed atomic.Bool }

func (p *panicTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	if p.armed.CompareAndSwap(true, false) {
		panic("tracer")
	}
	return ctx
}

func (p *panicTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (p *panicTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	if p.armed.CompareAndSwap(true, false) {
		panic("tracer")
	}
	return ctx
}

func (p *panicTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (p *panicTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// lockRow locks the row of key in table in a transaction of another
// session, as a decision elsewhere would hold it, and returns that
// transaction; it is rolled back when t ends, if not before.
func lockRow(t *testing.T, table, key string) pgx.Tx {
	t.Helper()
	tx, err := testPool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	if _, err := tx.Exec(t.Context(), fmt.Sprintf("SELECT 1 FROM %s WHERE key = $1 FOR UPDATE", qualified(table)), []byte(key)); err != nil {
		t.Fatal(err)
	}
	return tx
}

// waitQueued returns once n takes of s wait for a shared transaction,
// and fails t if they do not within 10s.
func waitQueued(t *testing.T, s *pgstore.Store, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); pgstore.Queued(s) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d takes queued after 10s; want %d", pgstore.Queued(s), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBatchOptions: Batch and Transactions out of range are refused,
// naming the value.
func TestBatchOptions(t *testing.T) {
	for _, o := range []pgstore.Options{{Batch: -1}, {Batch: pgstore.MaxBatch + 1}, {Transactions: -1}} {
		if _, err := pgstore.New(t.Context(), testPool, o); !errors.Is(err, sluice.ErrInvalidOption) {
			t.Errorf("New(%+v) = %v; want ErrInvalidOption", o, err)
		}
	}
}

// TestSharedTransactionUnknownOutcome: a shared transaction that committed
// but whose reply was lost fails every take of it, and sends none again:
// each is charged once. The store talks to PostgreSQL through a proxy that
// drops the replies, then cuts the connection.
func TestSharedTransactionUnknownOutcome(t *testing.T) {
	ctx := context.Background()
	cfg := testPool.Config().Copy()
	px, err := faultproxy.New(net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	host, port, err := net.SplitHostPort(px.Addr())
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(p), nil
	cfg.MaxConns, cfg.MinConns = 4, 0
	// An idle connection is used as it is, and a statement is sent with its
	// batch, not prepared first: the replies of a ping or a prepare would
	// be dropped too.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, table := newStoreOn(t, pool, pgstore.Options{Transactions: 1, StatementTimeout: time.Minute, LockTimeout: time.Minute})
	// Less than a token refills while the test runs.
	l := sluice.Limit{Capacity: 10, Rate: sluice.Per(1, time.Hour)}
	take := func(ctx context.Context, key string) (sluice.Decision, error) {
		return s.Take(ctx, sluice.Request{Policy: testPolicy, Key: key, Cost: 1, Limit: l})
	}
	for _, k := range []string{"held", "a", "b"} {
		if _, err := take(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	// Idle connections for the shared transaction.
	var conns []*pgxpool.Conn
	for range 3 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}

	tx := lockRow(t, table, "held")
	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	lone := make(chan error, 1)
	go func() { // in flight alone: a and b queue behind it
		_, err := take(lctx, "held")
		lone <- err
	}()
	waitForLockWait(t, table)
	errs := make(chan error, 2)
	for _, k := range []string{"a", "b"} {
		go func() {
			_, err := take(ctx, k)
			errs <- err
		}()
	}
	waitQueued(t, s, 2)
	px.DropReplies(true)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	lcancel() // its reply is lost: its flight lands when the caller gives up
	select {
	case <-lone:
	case <-time.After(10 * time.Second):
		t.Fatal("the take whose reply was lost did not return within 10s of its context's end")
	}
	// The shared transaction of a and b commits; its reply is dropped.
	level := func(key string) int64 {
		var tokens int64
		if err := testPool.QueryRow(ctx, fmt.Sprintf("SELECT tokens FROM %s WHERE key = $1", qualified(table)), []byte(key)).Scan(&tokens); err != nil {
			t.Fatal(err)
		}
		return tokens
	}
	want := l.Capacity - 2
	for deadline := time.Now().Add(10 * time.Second); level("a") != want || level("b") != want; {
		if time.Now().After(deadline) {
			t.Fatalf("the takes of a and b did not commit within 10s: levels %d and %d", level("a"), level("b"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	px.DropReplies(false)
	px.Cut()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, sluice.ErrUnavailable) {
				t.Errorf("a take of a shared transaction whose reply was lost returned %v; want an error wrapping ErrUnavailable", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a take of a shared transaction whose connection was cut did not return within 10s")
		}
	}
	for _, k := range []string{"a", "b"} {
		if got := level(k); got != want {
			t.Errorf("bucket %q holds %d tokens; want %d: the lost take was sent again", k, got, want)
		}
	}
	if st := s.Stats(); st.SharedTakes != 2 {
		t.Errorf("Stats() = %+v; want the two takes in one shared transaction", st)
	}
}
