package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Pipeliner is what a Store with Options.Batch above 1 needs of its client
// besides Client: go-redis pipelines. *redis.Client, *redis.ClusterClient,
// *redis.Ring and every redis.UniversalClient satisfy it.
type Pipeliner interface {
	Client
	Pipeline() redis.Pipeliner
}

// batcher sends the commands of concurrent callers together, in pipelines
// of at most max commands, with one send in flight at a time (group
// commit): a caller that finds nothing in flight sends its own command at
// once, under its own context, as without batching; while it waits for the
// reply, later callers queue up for the next pipeline, which a goroutine of
// the batcher sends. A lone caller pays one round trip, as without
// batching; many callers share round trips, and Redis reads, runs and
// answers them back to back.
//
// Every command of a pipeline is a decisionCmd, which go-redis does not
// retry: a pipeline whose reply is lost fails all its commands once.
type batcher struct {
	client Pipeliner
	max    int
	anyKey bool // takes of different buckets may share a script call

	mu      sync.Mutex
	queue   []*pending // empty unless running
	running bool       // a command or a pipeline is in flight, or about to be

	pipelines atomic.Uint64 // pipelines sent
	shared    atomic.Uint64 // takes sent in the script call of another
}

// pending is one caller's command in the queue; done is closed when its
// reply (or error) is in cmd.
type pending struct {
	cmd  decisionCmd
	done chan struct{}
}

// process sends cmd in the next pipeline and waits for its reply, or for
// ctx to end. A command still queued when ctx ends is withdrawn, unsent; one
// already sent is left to finish, and its outcome is unknown to the caller,
// as for an unbatched command whose reply it stopped waiting for.
func (b *batcher) process(ctx context.Context, cmd decisionCmd) error {
	b.mu.Lock()
	if !b.running { // nothing in flight, so nothing queued either
		b.running = true
		b.mu.Unlock()
		err := b.client.Process(ctx, cmd)
		b.mu.Lock()
		more := len(b.queue) > 0
		b.running = more
		b.mu.Unlock()
		if more {
			go b.drain()
		}
		return err
	}
	p := &pending{cmd: cmd, done: make(chan struct{})}
	b.queue = append(b.queue, p)
	b.mu.Unlock()
	select {
	case <-p.done:
		return cmd.Err()
	case <-ctx.Done():
	}
	select {
	case <-p.done: // the reply came too
		return cmd.Err()
	default:
	}
	b.mu.Lock()
	if i := slices.Index(b.queue, p); i >= 0 {
		b.queue = slices.Delete(b.queue, i, i+1)
	}
	b.mu.Unlock()
	return ctx.Err()
}

// drain sends pipelines until the queue is empty.
func (b *batcher) drain() {
	for b.sendNext() {
	}
}

// sendNext sends the first max queued commands in one pipeline and
// reports whether more are queued; if none are, it clears b.running.
func (b *batcher) sendNext() (more bool) {
	b.mu.Lock()
	n := min(len(b.queue), b.max)
	batch := slices.Clone(b.queue[:n])
	b.queue = slices.Delete(b.queue, 0, n)
	b.mu.Unlock()

	if len(batch) > 0 {
		// The commands belong to several callers, so no one caller's
		// context may cancel the pipeline: each caller stops waiting at
		// its own deadline, and the client's read and write timeouts bound
		// the pipeline.
		ctx := context.Background()
		groups := group(batch, b.anyKey)
		b.shared.Add(uint64(len(batch) - len(groups)))
		pipe := b.client.Pipeline()
		for _, g := range groups {
			_ = pipe.Process(ctx, g.cmd)
		}
		_, _ = pipe.Exec(ctx) // each command holds its own error
		b.pipelines.Add(1)
		for _, g := range groups {
			g.settle()
		}
		for _, p := range batch {
			close(p.done)
		}
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 {
		b.running = false
		return false
	}
	return true
}

// A shared is one script call of a pipeline: one caller's command, or the
// takes of several callers under one limit at one time, sent as one
// "takes" call (see bucket.lua) that reads, checks and writes each bucket
// once: takes of one bucket, or with anyKey takes of any buckets.
type shared struct {
	cmd     decisionCmd
	members []*pending
}

// group makes the script calls for batch, in queue order: takes that
// shareID finds alike share a call, in the order they were queued.
func group(batch []*pending, anyKey bool) []*shared {
	var (
		out  []*shared
		byID map[string]*shared
	)
	for _, p := range batch {
		id, ok := shareID(p.cmd.Args(), anyKey)
		if ok {
			if g := byID[id]; g != nil {
				g.members = append(g.members, p)
				continue
			}
		}
		g := &shared{cmd: p.cmd, members: []*pending{p}}
		if ok {
			if byID == nil {
				byID = make(map[string]*shared)
			}
			byID[id] = g
		}
		out = append(out, g)
	}
	for _, g := range out {
		if len(g.members) > 1 {
			args := make([][]any, len(g.members))
			for i, p := range g.members {
				args[i] = p.cmd.Args()
			}
			g.cmd = decisionCmd{redis.NewCmd(context.Background(), sharedArgs(args)...)}
		}
	}
	return out
}

// settle gives each member of a shared call its decision: its five values
// of the reply, the error of its own bucket (a "foreign" entry: that bucket
// holds a value Sluice did not write, and the others were decided), or the
// call's error.
func (g *shared) settle() {
	if len(g.members) == 1 {
		return // the member's own command ran
	}
	reply, err := g.cmd.Slice()
	if err == nil && len(reply) != replyLen*len(g.members) {
		err = scriptErrorf("reply of %d values to %d takes", len(reply), len(g.members))
	}
	for i, p := range g.members {
		if err != nil {
			p.cmd.SetErr(err)
			continue
		}
		one := reply[replyLen*i : replyLen*i+replyLen]
		if one[0] == kindForeign {
			p.cmd.SetErr(scriptErrorf("%v", one[1]))
			continue
		}
		p.cmd.SetVal(one)
	}
}

// Positions in the arguments of a script command built by Store.run.
const (
	argKeys = 3 // the first key
	// With one key:
	argOp   = 4
	argCost = 7
	argN    = 8 // the number of arguments
)

// shareID returns, for a take without a request ID sent by EVALSHA, what
// identifies the takes that may share one script call with it: its
// arguments but the cost (the limit, the time argument and the settings)
// and, unless anyKey, the bucket. Other commands share nothing.
func shareID(args []any, anyKey bool) (string, bool) {
	if len(args) != argN || args[0] != "evalsha" || args[2] != 1 || args[argOp] != "take" {
		return "", false
	}
	b := make([]byte, 0, 128)
	for i, a := range args[argKeys:] {
		if i := argKeys + i; i == argCost || (i == argKeys && anyKey) {
			continue
		}
		switch a := a.(type) {
		case string:
			b = append(b, a...)
		case int64:
			b = strconv.AppendInt(b, a, 10)
		default:
			b = fmt.Append(b, a)
		}
		b = append(b, 0)
	}
	return string(b), true
}

// sharedArgs returns the arguments of one "takes" script call for the
// takes of args, each a take that shareID accepted with the same identity.
func sharedArgs(args [][]any) []any {
	first := args[0]
	out := make([]any, 0, argN+2*len(args))
	out = append(out, first[0], first[1], len(args))
	for _, a := range args {
		out = append(out, a[argKeys])
	}
	out = append(out, "takes")
	out = append(out, first[argOp+1:]...)
	for _, a := range args[1:] {
		out = append(out, a[argCost])
	}
	return out
}
