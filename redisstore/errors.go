package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
)

// ScriptError is an error raised by the decision script, or a reply of it
// the store could not read: Redis answered, but a key of the store holds a
// value that Sluice did not write (another application's value, another
// type: WRONGTYPE), the server's clock is outside the store's range, or
// something between the store and Redis changed the reply. The script
// checks everything before its first write, so it wrote nothing. It wraps
// sluice.ErrMisconfigured: a retry fails the same way, and a failure policy
// returns it rather than deciding in the store's place. Its ScriptError
// method lets metrics tell it apart without importing this package.
type ScriptError struct{ err error }

func (e *ScriptError) Error() string { return "redisstore: script: " + e.err.Error() }

// Unwrap returns sluice.ErrMisconfigured and the underlying error (a
// go-redis error reply, or what was wrong with the reply).
func (e *ScriptError) Unwrap() []error { return []error{sluice.ErrMisconfigured, e.err} }

// ScriptError marks the error as the script's.
func (*ScriptError) ScriptError() {}

// scriptErrorf returns a *ScriptError with the message format makes.
func scriptErrorf(format string, args ...any) *ScriptError {
	return &ScriptError{err: fmt.Errorf(format, args...)}
}

// Error replies by which Redis says it cannot serve now: loading its data,
// a replica or a cluster without a master for the slot, busy with another
// script, out of memory under noeviction, unable to persist, short of
// replicas, a slot in migration, too many clients. They are outages:
// sluice.ErrUnavailable.
var unavailableReplies = []string{
	"LOADING", "READONLY", "CLUSTERDOWN", "MASTERDOWN", "BUSY", "TRYAGAIN",
	"OOM", "MISCONF", "NOREPLICAS", "NOSCRIPT", "ERR max number of clients",
}

// Error replies that a retry meets again until the deployment changes:
// wrong credentials or a user without the right to run scripts, a server or
// proxy without EVALSHA, a standalone client talking to a Cluster node
// (MOVED, ASK), keys of several slots. They are sluice.ErrMisconfigured.
var misconfiguredReplies = []string{
	"NOAUTH", "WRONGPASS", "NOPERM", "ERR unknown command", "MOVED", "ASK", "CROSSSLOT",
}

// classify wraps err, a failure of a script call made under ctx, in the
// sentinel that says what failed:
//   - an error raised by the script, or a foreign value at a key
//     (WRONGTYPE): a *ScriptError, which wraps sluice.ErrMisconfigured;
//   - an error reply of misconfiguredReplies: sluice.ErrMisconfigured;
//   - everything else: Redis could not be asked or did not answer (a
//     connection refused or broken, a timeout, ctx ended, an error reply of
//     unavailableReplies or one this package does not know):
//     sluice.ErrUnavailable, with ctx's error if it ended.
//
// The error keeps err in its chain, so that its cause (a net.Error, a
// go-redis error reply) can still be told.
func classify(ctx context.Context, err error) error {
	var se *ScriptError
	if errors.As(err, &se) {
		return err
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		msg := reply.Error()
		switch {
		case strings.HasPrefix(msg, "ERR sluice:"), strings.HasPrefix(msg, "WRONGTYPE"):
			return &ScriptError{err: err}
		case hasPrefix(msg, unavailableReplies):
			return fmt.Errorf("%w: redisstore: %w", sluice.ErrUnavailable, err)
		case hasPrefix(msg, misconfiguredReplies):
			return fmt.Errorf("%w: redisstore: %w", sluice.ErrMisconfigured, err)
		case strings.Contains(msg, "user_script"):
			// Another error of Redis while running the script (Redis 7
			// ends them with "script: <sha>, on @user_script:<line>.";
			// Redis 6 writes "@user_script:<line>:" in them): a fault of
			// the script, which a retry meets again.
			return &ScriptError{err: err}
		}
		return fmt.Errorf("%w: redisstore: %w", sluice.ErrUnavailable, err)
	}
	cerr := ctx.Err()
	if dl, ok := ctx.Deadline(); ok && cerr == nil && !time.Now().Before(dl) {
		// go-redis sets a socket's deadline to the context's, so its
		// timeout may come before the context's own timer fires.
		cerr = context.DeadlineExceeded
	}
	if cerr != nil {
		if errors.Is(err, cerr) {
			return fmt.Errorf("%w: redisstore: %w", sluice.ErrUnavailable, err)
		}
		return fmt.Errorf("%w: redisstore: %w: %w", sluice.ErrUnavailable, cerr, err)
	}
	return fmt.Errorf("%w: redisstore: %w", sluice.ErrUnavailable, err)
}

// hasPrefix reports whether msg starts with one of prefixes followed by a
// space or nothing.
func hasPrefix(msg string, prefixes []string) bool {
	for _, p := range prefixes {
		if rest, ok := strings.CutPrefix(msg, p); ok && (rest == "" || rest[0] == ' ') {
			return true
		}
	}
	return false
}
