// Package faultproxy is a TCP proxy for fault tests on loopback: it
// forwards every connection it accepts to a target and, on command, cuts
// the connections, refuses new ones as a stopped server would, delays
// replies, or drops them.
//
// "Replies" are the bytes from the target back to the client. Dropping them
// lets requests reach the target and run there while the client never hears
// back: the lost-reply case of an indeterminate call.
//
// A Proxy owns one goroutine for accepting and four per connection; Close
// stops them all and waits for them.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// dialTimeout bounds the dial to the target for each accepted connection.
const dialTimeout = time.Second

// Proxy forwards TCP connections from Addr to a target. Its methods are safe
// for concurrent use. Create one with New and stop it with Close.
type Proxy struct {
	target string
	addr   string

	latency atomic.Int64 // time.Duration added to every reply chunk
	drop    atomic.Bool  // discard replies

	mu       sync.Mutex
	ln       net.Listener // nil while refusing or closed
	links    map[*link]struct{}
	closed   bool
	accepted int

	wg sync.WaitGroup
}

// New starts a Proxy on a free loopback port forwarding to target (a
// host:port).
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, addr: ln.Addr().String(), links: make(map[*link]struct{})}
	p.serve(ln)
	return p, nil
}

// Addr returns the host:port clients connect to. It stays the same across
// Refuse and Restore.
func (p *Proxy) Addr() string { return p.addr }

// Cut closes every open connection, both sides. New connections are still
// accepted.
func (p *Proxy) Cut() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
}

// Refuse stops listening and cuts every connection, as a server that went
// down: dials are refused until Restore.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	p.mu.Unlock()
	p.Cut()
}

// Restore listens again on Addr after Refuse. It is a no-op if the proxy is
// listening.
func (p *Proxy) Restore() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("faultproxy: restore after close")
	}
	if p.ln != nil {
		return nil
	}
	var err error
	for range 50 { // the port may linger for a moment
		var ln net.Listener
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			p.serveLocked(ln)
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("faultproxy: listening again on %s: %w", p.addr, err)
}

// SetLatency delays every reply chunk by d from when the proxy read it
// (zero: none). Chunks keep their order; requests are not delayed.
func (p *Proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// DropReplies makes the proxy discard (on) or forward (off) the replies of
// every connection, open or new. Requests still reach the target.
func (p *Proxy) DropReplies(on bool) { p.drop.Store(on) }

// Conns returns the number of connections open now.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Accepted returns the number of connections accepted so far.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines to end. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	p.mu.Unlock()
	p.Cut()
	p.wg.Wait()
	return nil
}

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.serveLocked(ln)
}

// serveLocked starts accepting on ln (mu held).
func (p *Proxy) serveLocked(ln net.Listener) {
	p.ln = ln
	p.wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return // closed by Refuse or Close
			}
			p.wg.Go(func() { p.forward(in, ln) })
		}
	})
}

// link is one proxied connection.
type link struct {
	in   net.Conn
	done chan struct{} // closed by close

	mu     sync.Mutex
	out    net.Conn
	closed bool
}

// setOut attaches the connection to the target, unless the link was closed
// meanwhile (then it closes out and reports false).
func (l *link) setOut(out net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		out.Close()
		return false
	}
	l.out = out
	return true
}

// close closes both sides; it is idempotent.
func (l *link) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	close(l.done)
	l.in.Close()
	if l.out != nil {
		l.out.Close()
	}
}

// chunk is a piece of reply read at a time and due for writing.
type chunk struct {
	data []byte
	due  time.Time
}

// forward dials the target for in, accepted on ln, and copies both ways
// until either side closes or the proxy cuts the link.
func (p *Proxy) forward(in net.Conn, ln net.Listener) {
	l := &link{in: in, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed || p.ln != ln { // accepted just before Refuse or Close
		p.mu.Unlock()
		in.Close()
		return
	}
	p.links[l] = struct{}{}
	p.accepted++
	p.mu.Unlock()
	defer func() {
		l.close()
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()

	out, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		return
	}
	if !l.setOut(out) {
		return // cut while dialing
	}

	var wg sync.WaitGroup
	// Requests: straight through.
	wg.Go(func() {
		defer l.close()
		io.Copy(out, in)
	})
	// Replies: read, stamp, and hand to the writer below, which waits for
	// each chunk's due time.
	replies := make(chan chunk, 256)
	wg.Go(func() {
		defer close(replies)
		defer l.close()
		buf := make([]byte, 32<<10)
		for {
			n, err := out.Read(buf)
			if n > 0 && !p.drop.Load() {
				c := chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(time.Duration(p.latency.Load()))}
				select {
				case replies <- c:
				case <-l.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	wg.Go(func() {
		defer l.close()
		timer := time.NewTimer(0)
		defer timer.Stop()
		for c := range replies {
			if wait := time.Until(c.due); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-l.done:
					return
				}
			}
			if _, err := in.Write(c.data); err != nil {
				return
			}
		}
	})
	wg.Wait()
}
