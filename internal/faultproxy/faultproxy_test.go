package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// echoServer answers every line with the same line, on loopback, until the
// test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { io.Copy(c, c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// roundTrip sends a line on c and reads the answer within timeout.
func roundTrip(c net.Conn, r *bufio.Reader, timeout time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

func newProxy(t *testing.T) *Proxy {
	t.Helper()
	p, err := New(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, p *Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func TestForward(t *testing.T) {
	p := newProxy(t)
	c, r := dial(t, p)
	if got, err := roundTrip(c, r, time.Second); got != "ping\n" || err != nil {
		t.Fatalf("round trip through the proxy = %q, %v; want \"ping\\n\", nil", got, err)
	}
	if got := p.Conns(); got != 1 {
		t.Errorf("Conns() = %d, want 1", got)
	}
}

func TestLatency(t *testing.T) {
	p := newProxy(t)
	c, r := dial(t, p)
	const d = 100 * time.Millisecond
	p.SetLatency(d)
	start := time.Now()
	if _, err := roundTrip(c, r, time.Second); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < d {
		t.Errorf("round trip with latency %v took %v, want at least %v", d, took, d)
	}
	p.SetLatency(0)
	start = time.Now()
	if _, err := roundTrip(c, r, time.Second); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took >= d {
		t.Errorf("round trip without latency took %v, want less than %v", took, d)
	}
}

func TestDropReplies(t *testing.T) {
	p := newProxy(t)
	c, r := dial(t, p)
	p.DropReplies(true)
	_, err := roundTrip(c, r, 100*time.Millisecond)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("round trip with replies dropped: %v, want a timeout", err)
	}
	p.DropReplies(false)
	c2, r2 := dial(t, p)
	if got, err := roundTrip(c2, r2, time.Second); got != "ping\n" || err != nil {
		t.Fatalf("round trip after replies flow again = %q, %v", got, err)
	}
}

func TestCut(t *testing.T) {
	p := newProxy(t)
	c, r := dial(t, p)
	if _, err := roundTrip(c, r, time.Second); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	if _, err := roundTrip(c, r, time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("round trip on a cut connection: %v, want it closed", err)
	}
	c2, r2 := dial(t, p)
	if got, err := roundTrip(c2, r2, time.Second); got != "ping\n" || err != nil {
		t.Fatalf("round trip on a new connection after Cut = %q, %v", got, err)
	}
}

func TestRefuseRestore(t *testing.T) {
	p := newProxy(t)
	c, r := dial(t, p)
	p.Refuse()
	if _, err := roundTrip(c, r, time.Second); err == nil {
		t.Fatal("round trip on a connection open before Refuse succeeded")
	}
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatal("dial after Refuse succeeded, want refused")
	}
	if err := p.Restore(); err != nil {
		t.Fatal(err)
	}
	c2, r2 := dial(t, p)
	if got, err := roundTrip(c2, r2, time.Second); got != "ping\n" || err != nil {
		t.Fatalf("round trip after Restore = %q, %v", got, err)
	}
}

// TestCloseStopsGoroutines: Close returns only once every goroutine of the
// proxy has ended (it waits for them), also those waiting to deliver a
// delayed reply; so it returning at once is the test.
func TestCloseStopsGoroutines(t *testing.T) {
	p, err := New(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "ping\n")
	}
	p.SetLatency(time.Hour) // writers now wait on a due time an hour away
	time.Sleep(50 * time.Millisecond)
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return within 5s")
	}
	if n := p.Conns(); n != 0 {
		t.Errorf("Conns() after Close = %d, want 0", n)
	}
	if err := p.Restore(); err == nil {
		t.Error("Restore after Close succeeded, want an error")
	}
}
