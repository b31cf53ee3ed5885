package redisstore

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// script is the decision script; its SHA-1 digest names it for EVALSHA.
//
//go:embed bucket.lua
var script string

// scriptSHA is the SHA-1 digest of script, in hex.
var scriptSHA = func() string {
	sum := sha1.Sum([]byte(script))
	return hex.EncodeToString(sum[:])
}()

// decisionCmd is an EVALSHA or EVAL that go-redis must never send twice on
// its own: if the reply is lost after the script ran, a second run would
// charge the bucket again. NOSCRIPT, which means the script did not run, is
// handled by Store.eval.
type decisionCmd struct{ *redis.Cmd }

// NoRetry tells go-redis not to retry the command.
func (decisionCmd) NoRetry() bool { return true }

// run runs the script by EVALSHA on keys with the arguments of a take or
// a peek (see bucket.lua) and returns its reply as go-redis read it.
// Errors are classified (see classify).
func (s *Store) run(ctx context.Context, keys []string, op string, now any, pl plan, cost, idTTL int64) ([]any, error) {
	args := make([]any, 0, 3+len(keys)+5)
	args = append(args, "evalsha", scriptSHA, len(keys))
	for _, k := range keys {
		args = append(args, k)
	}
	args = append(args, op, now, s.spec(pl), cost)
	if idTTL > 0 {
		args = append(args, idTTL)
	}
	return s.exec(ctx, args)
}

// call runs the script by EVALSHA on keys with the arguments args (ARGV,
// the operation first) and returns its reply as go-redis read it. Errors
// are classified (see classify).
func (s *Store) call(ctx context.Context, keys []string, args ...any) ([]any, error) {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, "evalsha", scriptSHA, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	return s.exec(ctx, append(a, args...))
}

// exec sends args, an EVALSHA of the script, and returns its reply.
func (s *Store) exec(ctx context.Context, args []any) ([]any, error) {
	cmd, err := s.eval(ctx, args)
	if err != nil {
		return nil, classify(ctx, err)
	}
	reply, err := cmd.Slice()
	if err != nil {
		return nil, scriptErrorf("reply: %w", err)
	}
	return reply, nil
}

// evalAfter is the number of NOSCRIPT answers to one decision after which
// the store sends the script with it (EVAL) whatever other callers do:
// servers that keep losing the script (SCRIPT FLUSH in a loop), or a
// command routed to another node than the one loaded (a slot moving),
// still get their decision. A NOSCRIPT that follows a load no server
// answered (the EVAL's connection broke, as right after a restart) is not
// counted: the server did not lose the script again, it was never sent.
const evalAfter = 3

// eval sends args, an EVALSHA. When the server answers NOSCRIPT (it lost
// its script cache: a restart, a failover, SCRIPT FLUSH), the first caller
// to meet it on that server sends its decision again with EVAL, which runs
// the script and caches it there; the others that meet NOSCRIPT on that
// server meanwhile wait for that call (or their own context), then send
// their EVALSHA again. So a server that lost the script is sent it once,
// however many callers find out at the same time. NOSCRIPT means the
// script did not run, so none of this is a retry of a decision.
func (s *Store) eval(ctx context.Context, args []any) (decisionCmd, error) {
	noscripts := 0
	for {
		sent := s.loader.seq.Load()
		cmd, err := s.send(ctx, args)
		if err == nil || !isNoScript(err) {
			return cmd, err
		}
		noscripts++
		f, lead := s.loader.join(s.serverAddr(ctx, args[argKeys].(string)), sent)
		if lead || noscripts == evalAfter {
			cmd, err = s.sendEval(ctx, args)
			if lead {
				s.loader.finish(f, err == nil || isReply(err))
			}
			return cmd, err
		}
		if f != nil {
			select {
			case <-f.done:
			case <-ctx.Done():
				return cmd, ctx.Err()
			}
			if !f.answered {
				// The load failed unanswered: the next NOSCRIPT is the
				// same loss, not a new one. The next caller to meet it
				// with no load in flight leads another.
				noscripts--
			}
		}
	}
}

// sendEval sends args with EVAL, the script in full, and counts it in
// Stats().ScriptLoads if the server answered.
func (s *Store) sendEval(ctx context.Context, args []any) (decisionCmd, error) {
	args = slices.Clone(args)
	args[0], args[1] = "eval", script
	cmd, err := s.send(ctx, args)
	if err == nil || isReply(err) {
		s.loader.loads.Add(1)
	}
	return cmd, err
}

// isNoScript reports whether err says the server does not have the script.
func isNoScript(err error) bool {
	return errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")
}

// isReply reports whether err is an error reply: the server answered.
func isReply(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply)
}

// loader has the script sent once to a server that lost it, for all the
// callers that find out at the same time.
type loader struct {
	seq   atomic.Uint64 // flights whose EVAL a server answered, on any server
	loads atomic.Uint64 // EVALs that a server answered

	mu       sync.Mutex
	flights  map[string]*flight // in progress, by server address
	loadedAt map[string]uint64  // by server address: seq after its last answered flight
}

// flight is the EVAL of one caller to a server that lost the script; done
// is closed when it is answered or has failed, and answered is set before
// (read it after done is closed).
type flight struct {
	addr     string
	done     chan struct{}
	answered bool
}

// join is called by a caller whose command, sent when l.seq read sent,
// met NOSCRIPT on the server at addr. If a flight on that server was
// answered since, the script was cached before the caller sends again, and
// join returns nil, false. Otherwise it returns the flight in progress on
// that server to wait for, or, if there is none, a new one that the caller
// leads (lead true): it sends its own decision with EVAL and then calls
// finish.
func (l *loader) join(addr string, sent uint64) (f *flight, lead bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.loadedAt[addr] > sent {
		return nil, false
	}
	if f := l.flights[addr]; f != nil {
		return f, false
	}
	if l.flights == nil {
		l.flights = make(map[string]*flight)
		l.loadedAt = make(map[string]uint64)
	}
	f = &flight{addr: addr, done: make(chan struct{})}
	l.flights[addr] = f
	return f, true
}

// finish ends flight f; answered tells whether the server answered its
// EVAL, and so has the script.
func (l *loader) finish(f *flight, answered bool) {
	l.mu.Lock()
	if answered {
		l.loadedAt[f.addr] = l.seq.Add(1)
	}
	delete(l.flights, f.addr)
	l.mu.Unlock()
	f.answered = answered
	close(f.done)
}

// serverAddr returns the address of the server that holds key: the
// Cluster master of its slot, the Ring shard of its key, or "" for a
// client of one server (or one the store cannot look into).
func (s *Store) serverAddr(ctx context.Context, key string) string {
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		if n, err := c.MasterForKey(ctx, key); err == nil {
			return n.Options().Addr
		}
	case *redis.Ring:
		if n, err := c.GetShardClientForKey(key); err == nil {
			return n.Options().Addr
		}
	}
	return ""
}

// Resending a command that Redis refused without running it.
// The pauses add up to about a second; the caller's context can cut them
// short.
const (
	maxResends  = 24
	firstResend = time.Millisecond
	maxResend   = 50 * time.Millisecond
)

// send sends a script command, and sends it again, up to maxResends times
// with a doubling pause, while Redis answers with an error that says it did
// not run it (see refusedUnrun) and ctx allows: a resend of such a command
// cannot charge twice. Every other outcome is returned at once.
func (s *Store) send(ctx context.Context, args []any) (decisionCmd, error) {
	pause := firstResend
	for resends := 0; ; resends++ {
		cmd := decisionCmd{redis.NewCmd(ctx, args...)}
		err := s.process(ctx, cmd)
		if err == nil || resends == maxResends || !refusedUnrun(err) {
			return cmd, err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return cmd, err
		case <-t.C:
		}
		pause = min(2*pause, maxResend)
	}
}

// refusedUnrun reports whether err is an error reply with which Redis
// refuses a command before running it: another script is running past
// busy-reply-threshold (BUSY), the server is loading its data (LOADING), a
// slot is migrating under a multi-key command (TRYAGAIN), the cluster or
// the master is down (CLUSTERDOWN, MASTERDOWN).
func refusedUnrun(err error) bool {
	for _, p := range []string{"BUSY ", "LOADING ", "TRYAGAIN ", "CLUSTERDOWN ", "MASTERDOWN "} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// process sends cmd on its own, or in the next pipeline when batching.
func (s *Store) process(ctx context.Context, cmd decisionCmd) error {
	if s.batch != nil {
		return s.batch.process(ctx, cmd)
	}
	return s.client.Process(ctx, cmd)
}
