package pgstore

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
)

// Takes in shared transactions.
//
// Each transaction that writes costs the database a commit: a WAL flush
// that the session waits for, and on a hot key, whose row lock is held
// until that flush is done, one flush per decision, one after another. So
// while Options.Transactions takes are in flight, later takes of the Store
// queue, and the first in-flight transaction to come back takes the queue
// (up to Options.Batch takes) as one transaction: a pipeline of take
// function calls, one per take, sent in one round trip and committed
// together. Each call is the one a take alone would send, and at READ
// COMMITTED each sees what the calls before it wrote, so every decision is
// the one the takes would get one after another; a hot key's takes share
// one row lock and one flush.
//
// The calls run in the order of (policy, key), the order in which
// multi-takes lock their rows, takes of one bucket in the order they came:
// two transactions lock the rows they share in the same order and cannot
// deadlock.
//
// A take that finds fewer than Options.Transactions in flight is sent at
// once, alone, as without batching (with the insert-first pair for a new
// key), so a lone caller waits for nothing. A queued take whose context
// ends is withdrawn, unsent. A shared transaction runs under none of its
// takes' contexts (each caller stops waiting at its own end); it is
// cancelled once all of them have ended.
//
// A shared transaction fails as a whole. When the database reports an
// error for one call, the transaction was rolled back: that take fails
// with the error, and so do the takes of its bucket in it (which would
// wait for the same lock, say); the others, which charged nothing, are
// sent again at once, by themselves, so that takes queued since cannot
// make them fail again. An error before anything ran fails every take, as
// it would each alone; any other failure (the connection lost, the
// commit's outcome unknown) fails every take of it, each charged at most
// once, as a take alone whose reply is lost.
type batcher struct {
	s       *Store
	max     int // the most takes in one transaction, >= 2
	flights int // the most transactions in flight before takes queue, >= 1

	mu     sync.Mutex
	queue  []*member // empty unless flying == flights
	flying int

	batches, batched atomic.Uint64
}

// member is one queued take; done is closed when d or err holds its
// outcome.
type member struct {
	ctx  context.Context
	r    sluice.Request
	p    bucket.Plan
	now  any // the take's time, read when it was called
	out  takeOut
	d    sluice.Decision
	err  error
	done chan struct{}
}

// take decides r, valid under plan p, at the time now (nowMicros): at
// once, alone, if fewer than b.flights takes are in flight, else in a
// shared transaction.
func (b *batcher) take(ctx context.Context, r sluice.Request, p bucket.Plan, now any) (sluice.Decision, error) {
	b.mu.Lock()
	if b.flying < b.flights { // so nothing is queued
		b.flying++
		b.mu.Unlock()
		defer b.land()
		return b.s.takeOne(ctx, r, p, now)
	}
	m := &member{ctx: ctx, r: r, p: p, now: now, done: make(chan struct{})}
	b.queue = append(b.queue, m)
	b.mu.Unlock()
	select {
	case <-m.done:
		return m.d, m.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	i := slices.Index(b.queue, m)
	if i >= 0 {
		b.queue = slices.Delete(b.queue, i, i+1)
	}
	b.mu.Unlock()
	if i < 0 { // sent: it may still have been decided
		select {
		case <-m.done:
			return m.d, m.err
		default:
		}
	}
	return sluice.Decision{}, ctx.Err()
}

// land ends a flight: it goes on with the queue if takes wait, else it is
// no longer in flight.
func (b *batcher) land() {
	b.mu.Lock()
	more := len(b.queue) > 0
	if !more {
		b.flying--
	}
	b.mu.Unlock()
	if more {
		go b.drain()
	}
}

// drain, a flight, sends the queue in transactions of at most b.max takes
// until it is empty.
func (b *batcher) drain() {
	for {
		b.mu.Lock()
		n := min(len(b.queue), b.max)
		if n == 0 {
			b.flying--
			b.mu.Unlock()
			return
		}
		ms := slices.Clone(b.queue[:n])
		b.queue = slices.Delete(b.queue, 0, n)
		b.mu.Unlock()
		for len(ms) > 0 {
			ms = b.send(ms)
		}
	}
}

// send decides the takes ms in one transaction and returns those to send
// again, at once and by themselves: rolled back for another take's error,
// not charged. It returns fewer takes than it was given.
func (b *batcher) send(ms []*member) (retry []*member) {
	ms = slices.DeleteFunc(ms, func(m *member) bool { // withdrawn: the caller has returned
		if err := m.ctx.Err(); err != nil {
			m.err = err
			close(m.done)
			return true
		}
		return false
	})
	switch len(ms) {
	case 0:
		return nil
	case 1:
		m := ms[0]
		m.d, m.err = b.s.takeOne(m.ctx, m.r, m.p, m.now)
		close(m.done)
		return nil
	}
	slices.SortStableFunc(ms, func(x, y *member) int {
		if c := strings.Compare(x.r.Policy, y.r.Policy); c != 0 {
			return c
		}
		return strings.Compare(x.r.Key, y.r.Key)
	})
	ctx, stop := shared(ms)
	defer stop()
	s := b.s
	batch := &pgx.Batch{}
	if s.prelude != "" {
		batch.Queue(s.prelude, s.timeouts...)
	}
	for _, m := range ms {
		batch.Queue(s.takeSQL, s.takeArgs(m.r, m.p, []byte(m.r.Key), m.now)...)
	}
	b.batches.Add(1)
	b.batched.Add(uint64(len(ms)))
	br := s.pool.SendBatch(ctx, batch)
	failed, err := -1, error(nil)
	if s.prelude != "" {
		_, err = br.Exec()
	}
	for i, m := range ms {
		if err != nil {
			break
		}
		if err = br.QueryRow().Scan(m.out.dst()...); err != nil {
			failed = i
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil && failed >= 0 && executed(err) {
		// The database refused a call, so the transaction was rolled back:
		// that take fails, and so do the takes of its bucket in it, which
		// would wait for the same lock, say, one after another; the
		// others charged nothing and are sent again, by themselves, so
		// that takes queued since cannot make them fail again.
		f := ms[failed].r
		for _, m := range ms {
			if m.r.Policy == f.Policy && m.r.Key == f.Key {
				m.err = s.decisionError("take", err)
				close(m.done)
			} else {
				retry = append(retry, m)
			}
		}
		return retry
	}
	for _, m := range ms {
		if err != nil {
			m.err = s.decisionError("take", err)
		} else {
			m.d, m.err = s.takeDecision(m.r, &m.out)
		}
		close(m.done)
	}
	return nil
}

// executed reports whether err, the error of one call of a shared
// transaction, is the database's answer to executing it, rather than a
// failure to connect, or to prepare the batch, before anything ran.
func executed(err error) bool {
	var (
		pe  *pgconn.PgError
		ce  *pgconn.ConnectError
		pre pgx.ErrPreprocessingBatch
	)
	return errors.As(err, &pe) && !errors.As(err, &ce) && !errors.As(err, &pre) && !pgconn.SafeToRetry(err)
}

// shared returns the context of a transaction of the takes ms: it carries
// the values of the context of ms[0] and ends once every take's context
// has ended.
// stop releases it.
func shared(ms []*member) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ms[0].ctx))
	left := atomic.Int64{}
	left.Store(int64(len(ms)))
	stops := make([]func() bool, len(ms))
	for i, m := range ms {
		stops[i] = context.AfterFunc(m.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, f := range stops {
			f()
		}
		cancel()
	}
}
