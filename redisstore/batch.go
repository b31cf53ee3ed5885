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

// minPipeline is the fewest queued commands that open another pipeline
// while one is in flight: a round trip costs Redis a read, a write and a
// script call besides the decisions, so a pipeline is worth sending beside
// one in flight only when it carries a few of them. Beyond that, another
// pipeline opens only when as many commands are queued as the last send
// carried: while pipelines come back full, the queue waits for the next
// one to take it whole, in one script call per bucket, rather than
// splitting it into two smaller ones.
const minPipeline = 8

// batcher sends the commands of concurrent callers together, in pipelines
// of at most max commands, with at most flights sends in flight at once
// (group commit over a few connections). A caller that finds nothing in
// flight sends its own command at once, under its own context, as without
// batching. While sends are in flight, later callers queue up; the first
// send to come back takes the queue (up to max commands) as its next
// pipeline, in a goroutine of the batcher, and goes on until the queue is
// empty; and when fewer than flights sends are in flight and at least
// minPipeline commands are queued, and as many as the last send carried, a
// new send takes them at once. A lone caller pays
// one round trip, as without batching; many callers share round trips,
// and Redis reads, runs and answers them back to back, with the next
// pipeline already sent while the client reads a reply.
//
// Every command of a pipeline is a decisionCmd, which go-redis does not
// retry: a pipeline whose reply is lost fails all its commands once.
type batcher struct {
	client  Pipeliner
	max     int
	flights int  // the most sends in flight at once, >= 1
	anyKey  bool // takes of different buckets may share a script call

	mu     sync.Mutex
	queue  []*pending // empty unless flying > 0
	flying int        // sends in flight, or about to be
	last   int        // the commands of the last send to leave

	pipelines atomic.Uint64 // pipelines sent
	shared    atomic.Uint64 // takes sent in the script call of another
}

// pending is one caller's command in the queue; done is closed when its
// reply (or error) is in cmd.
type pending struct {
	cmd  decisionCmd
	done chan struct{}
}

// process sends cmd at once if nothing is in flight, else in a later
// pipeline, and waits for its reply, or for ctx to end. A
// command still queued when ctx ends is withdrawn, unsent; one already
// sent is left to finish, and its outcome is unknown to the caller, as for
// an unbatched command whose reply it stopped waiting for.
func (b *batcher) process(ctx context.Context, cmd decisionCmd) error {
	b.mu.Lock()
	if b.flying == 0 { // so nothing is queued
		b.flying++
		b.last = 1
		b.mu.Unlock()
		err := b.client.Process(ctx, cmd)
		b.mu.Lock()
		more := len(b.queue) > 0
		if !more {
			b.flying--
		}
		b.mu.Unlock()
		if more { // this send goes on with the queue
			go b.drain()
		}
		return err
	}
	p := &pending{cmd: cmd, done: make(chan struct{})}
	b.queue = append(b.queue, p)
	open := b.flying < b.flights && len(b.queue) >= max(minPipeline, b.last)
	if open {
		b.flying++
	}
	b.mu.Unlock()
	if open {
		go b.drain()
	}
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

// drain, one of the sends in flight, sends pipelines until the queue is
// empty.
func (b *batcher) drain() {
	for b.sendNext() {
	}
}

// sendNext sends the first max queued commands in one pipeline and
// reports whether more are queued; if none are, this send is no longer in
// flight.
func (b *batcher) sendNext() (more bool) {
	b.mu.Lock()
	n := min(len(b.queue), b.max)
	batch := slices.Clone(b.queue[:n])
	b.queue = slices.Delete(b.queue, 0, n)
	if n > 0 {
		b.last = n
	}
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
		b.flying--
		return false
	}
	return true
}

// A shared is one script call of a pipeline: one caller's command, or the
// takes of several callers under one limit at one time, sent as one
// "takes" call (see bucket.lua) that reads, checks and writes each bucket
// once: takes of one bucket, or with anyKey takes of any buckets; or the
// multi-takes of several callers under the same limits at one time, sent
// as one "alls" call: of the same buckets, or with anyKey of any.
type shared struct {
	cmd     decisionCmd
	members []*pending
	parts   int               // the parts of each multi-take; 0 for takes
	specs   map[string]string // the spec of each bucket of the multi-takes
}

// group makes the script calls for batch, in queue order: takes that
// shareID finds alike share a call, in the order they were queued, and so
// do multi-takes that multiID finds alike, as long as each bucket is under
// one spec in all of them.
func group(batch []*pending, anyKey bool) []*shared {
	var (
		out           []*shared
		takes, multis map[string]*shared
	)
	for _, p := range batch {
		args := p.cmd.Args()
		if id, ok := shareID(args, anyKey); ok {
			if g := takes[id]; g != nil {
				g.members = append(g.members, p)
				continue
			}
			g := &shared{cmd: p.cmd, members: []*pending{p}}
			if takes == nil {
				takes = make(map[string]*shared)
			}
			takes[id] = g
			out = append(out, g)
			continue
		}
		if id, k, ok := multiID(args, anyKey); ok {
			if g := multis[id]; g != nil && g.join(p, k) {
				continue
			}
			g := &shared{cmd: p.cmd, parts: k, specs: make(map[string]string, k)}
			g.join(p, k)
			if multis == nil {
				multis = make(map[string]*shared)
			}
			multis[id] = g
			out = append(out, g)
			continue
		}
		out = append(out, &shared{cmd: p.cmd, members: []*pending{p}})
	}
	for _, g := range out {
		if len(g.members) > 1 {
			args := make([][]any, len(g.members))
			for i, p := range g.members {
				args[i] = p.cmd.Args()
			}
			var a []any
			if g.parts > 0 {
				a = sharedMultiArgs(args, g.parts)
			} else {
				a = sharedArgs(args)
			}
			g.cmd = decisionCmd{redis.NewCmd(context.Background(), a...)}
		}
	}
	return out
}

// join adds p, a multi-take of k parts, to g unless one of its buckets is
// in g under another spec (another part of the multi-takes already in g),
// and reports whether it did.
func (g *shared) join(p *pending, k int) bool {
	args := p.cmd.Args()
	for i := range k {
		key, spec := args[argKeys+i].(string), args[argKeys+k+2+2*i].(string)
		if s, ok := g.specs[key]; ok && s != spec {
			return false
		}
	}
	for i := range k {
		g.specs[args[argKeys+i].(string)] = args[argKeys+k+2+2*i].(string)
	}
	g.members = append(g.members, p)
	return true
}

// settle gives each member of a shared call its decision: its five values
// of the reply (for a multi-take, five per part), the error of its own
// bucket (a "foreign" entry: that bucket holds a value Sluice did not
// write, and the others were decided), or the call's error.
func (g *shared) settle() {
	if len(g.members) == 1 {
		return // the member's own command ran
	}
	per := replyLen * max(1, g.parts)
	reply, err := g.cmd.Slice()
	if err == nil && len(reply) != per*len(g.members) {
		err = scriptErrorf("reply of %d values to %d decisions of %d values", len(reply), len(g.members), per)
	}
	for i, p := range g.members {
		if err != nil {
			p.cmd.SetErr(err)
			continue
		}
		one := reply[per*i : per*(i+1)]
		var foreign error
		for j := 0; j < per && foreign == nil; j += replyLen {
			if one[j] == kindForeign {
				foreign = scriptErrorf("%v", one[j+1])
			}
		}
		if foreign != nil {
			p.cmd.SetErr(foreign)
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

// multiID returns, for a multi-take ("all") sent by EVALSHA, what
// identifies the multi-takes that may share one script call with it: its
// number of parts k, the time argument and the specs of its parts in
// order, and, unless anyKey, its buckets. Other commands share nothing.
func multiID(args []any, anyKey bool) (id string, k int, ok bool) {
	if len(args) <= argKeys || args[0] != "evalsha" {
		return "", 0, false
	}
	k, ok = args[2].(int)
	if !ok || k < 1 || len(args) != argKeys+3*k+2 || args[argKeys+k] != "all" {
		return "", 0, false
	}
	b := strconv.AppendInt(make([]byte, 0, 128), int64(k), 10)
	b = fmt.Append(append(b, 0), args[argKeys+k+1])
	for i := range k {
		spec, ok := args[argKeys+k+2+2*i].(string)
		if !ok {
			return "", 0, false
		}
		b = append(append(b, 0), spec...)
		if !anyKey {
			key, ok := args[argKeys+i].(string)
			if !ok {
				return "", 0, false
			}
			b = append(append(b, 0), key...)
		}
	}
	return string(b), k, true
}

// sharedMultiArgs returns the arguments of one "alls" script call for the
// multi-takes of args, each of k parts, that multiID accepted with the
// same identity: their buckets in order, the time, the k specs, their
// costs in order.
func sharedMultiArgs(args [][]any, k int) []any {
	first := args[0]
	out := make([]any, 0, argKeys+2*k*len(args)+2+k)
	out = append(out, first[0], first[1], k*len(args))
	for _, a := range args {
		out = append(out, a[argKeys:argKeys+k]...)
	}
	out = append(out, "alls", first[argKeys+k+1])
	for i := range k {
		out = append(out, first[argKeys+k+2+2*i])
	}
	for _, a := range args {
		for i := range k {
			out = append(out, a[argKeys+k+3+2*i])
		}
	}
	return out
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
