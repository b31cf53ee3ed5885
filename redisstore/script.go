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

// run runs the script by EVALSHA on keys with the given arguments (see
// bucket.lua) and returns its reply as go-redis read it. Errors are
// classified (see classify).
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

// Loading the script into a server that answered NOSCRIPT.
const (
	// evalAfter is the number of NOSCRIPT answers to one decision after
	// which the store sends the script itself with EVAL: servers that keep
	// losing the script (SCRIPT FLUSH in a loop) or a command routed to
	// another node than the one loaded (a slot moving) still get their
	// decision.
	evalAfter = 3
	// loadTimeout bounds a SCRIPT LOAD, which runs under no caller's
	// deadline: the callers waiting for it stop at their own.
	loadTimeout = 5 * time.Second
)

// eval sends args, an EVALSHA, and when the server answers NOSCRIPT (it
// lost its script cache: a restart, a failover, SCRIPT FLUSH) has the
// script loaded once for all the callers that met it on that server, then
// sends the EVALSHA again. NOSCRIPT means the script did not run, so this
// is not a retry of a decision.
func (s *Store) eval(ctx context.Context, args []any) (decisionCmd, error) {
	for noscripts := 1; ; noscripts++ {
		sent := s.loader.done.Load()
		cmd, err := s.send(ctx, args)
		if err == nil || !isNoScript(err) {
			return cmd, err
		}
		if noscripts == evalAfter {
			s.loader.loads.Add(1)
			args = slices.Clone(args)
			args[0], args[1] = "eval", script
			return s.send(ctx, args)
		}
		if err := s.load(ctx, args[argKeys].(string), sent); err != nil {
			return cmd, err
		}
	}
}

// isNoScript reports whether err says the server does not have the script.
func isNoScript(err error) bool {
	return errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")
}

// loader loads the script into servers that lost it, once per server for
// all the callers that meet NOSCRIPT there at the same time.
type loader struct {
	done  atomic.Uint64 // loads completed, on any server
	loads atomic.Uint64 // times the script was sent in full: SCRIPT LOAD or EVAL

	mu      sync.Mutex
	flights map[string]*flight // by server address
}

// flight is one SCRIPT LOAD in progress; err is set when done is closed.
type flight struct {
	done chan struct{}
	err  error
}

// load makes sure the server of key has the script, for a command sent
// when s.loader.done read sent and answered NOSCRIPT. If a load completed
// since, the server had the script before the caller sends again (unless it
// lost it again, which the next NOSCRIPT tells). Otherwise the caller joins
// the load in progress on that server, or starts one, and waits for it or
// for ctx.
func (s *Store) load(ctx context.Context, key string, sent uint64) error {
	srv, addr, err := s.server(ctx, key)
	if err != nil {
		return err
	}
	l := &s.loader
	l.mu.Lock()
	if l.done.Load() != sent {
		l.mu.Unlock()
		return nil
	}
	f := l.flights[addr]
	if f == nil {
		f = &flight{done: make(chan struct{})}
		if l.flights == nil {
			l.flights = make(map[string]*flight)
		}
		l.flights[addr] = f
		// The load serves every caller waiting for it, so it runs under
		// none of their deadlines, with the leader's values for tracing.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), loadTimeout)
		go func() {
			defer cancel()
			l.loads.Add(1)
			cmd := redis.NewStringCmd(lctx, "script", "load", script)
			err := srv.Process(lctx, cmd)
			if err == nil && cmd.Val() != scriptSHA {
				err = scriptErrorf("SCRIPT LOAD answered digest %q, want %q", cmd.Val(), scriptSHA)
			}
			l.mu.Lock()
			if err == nil {
				l.done.Add(1)
			}
			f.err = err
			delete(l.flights, addr)
			l.mu.Unlock()
			close(f.done)
		}()
	}
	l.mu.Unlock()
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// server returns a client of the server that holds key and its address
// (empty for a client of one server): the Cluster master of its slot, the
// Ring shard of its key, or the client itself.
func (s *Store) server(ctx context.Context, key string) (Client, string, error) {
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		n, err := c.MasterForKey(ctx, key)
		if err != nil {
			return nil, "", err
		}
		return n, n.Options().Addr, nil
	case *redis.Ring:
		n, err := c.GetShardClientForKey(key)
		if err != nil {
			return nil, "", err
		}
		return n, n.Options().Addr, nil
	}
	return s.client, "", nil
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
