package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestServeSlowloris: 200 connections that trickle their headers are
// closed within the read-header timeout and a second, while ordinary
// requests keep being answered.
func TestServeSlowloris(t *testing.T) {
	const (
		conns   = 200
		timeout = time.Second // shortened from 5s to keep the test short
		slack   = time.Second
	)
	old := readHeaderTimeout
	readHeaderTimeout = timeout
	t.Cleanup(func() { readHeaderTimeout = old }) // after the server stops
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	writeConfig(t, path, "  api:\n    limit: \"1000000 1000000/s\"\n")
	s := startServe(t, "-config", path, "-watch=false")
	addr := strings.TrimPrefix(s.api, "http://")

	type result struct {
		closedAfter time.Duration
		err         error
	}
	results := make([]result, conns)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				results[i].err = err
				return
			}
			defer c.Close()
			start := time.Now()
			// A bound of the test's own: a connection still open then was
			// not cut off.
			c.SetReadDeadline(start.Add(timeout + slack + time.Second)) //nolint:errcheck // a bound, checked below
			stop := make(chan struct{})
			go func() {
				// The request line at once, then a header byte every 100ms:
				// never the blank line that ends the headers.
				if _, err := fmt.Fprintf(c, "POST /v1/take HTTP/1.1\r\nHost: %s\r\nX-Slow: ", addr); err != nil {
					return
				}
				tick := time.NewTicker(100 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						if _, err := c.Write([]byte("a")); err != nil {
							return
						}
					}
				}
			}()
			buf := make([]byte, 512)
			for {
				if _, err := c.Read(buf); err != nil {
					results[i].closedAfter = time.Since(start)
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						results[i].err = fmt.Errorf("still open after %v", results[i].closedAfter.Round(time.Millisecond))
					}
					break
				}
			}
			close(stop)
		})
	}

	// Meanwhile, ordinary requests are answered, each promptly.
	client := &http.Client{Timeout: 2 * time.Second}
	var slowest time.Duration
	served := 0
	for end := time.Now().Add(timeout + slack); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		begin := time.Now()
		resp, err := client.Post(s.api+"/v1/take", "application/json", strings.NewReader(`{"policy":"api","key":"k"}`))
		if err != nil {
			t.Fatalf("an ordinary request during the attack failed: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("an ordinary request during the attack answered %d, want 200", resp.StatusCode)
		}
		served++
		slowest = max(slowest, time.Since(begin))
	}
	wg.Wait()

	var after []time.Duration
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("slow connection %d: %v", i, r.err)
		}
		after = append(after, r.closedAfter)
	}
	sort.Slice(after, func(i, j int) bool { return after[i] < after[j] })
	if last := after[len(after)-1]; last > timeout+slack {
		t.Errorf("the last slow connection was closed after %v, want within %v", last, timeout+slack)
	}
	if first := after[0]; first < timeout-100*time.Millisecond {
		t.Errorf("the first slow connection was closed after %v, before the %v timeout", first, timeout)
	}
	t.Logf("%d slow connections closed after %v to %v (median %v); %d ordinary requests served meanwhile, the slowest in %v",
		conns, after[0].Round(time.Millisecond), after[len(after)-1].Round(time.Millisecond), after[len(after)/2].Round(time.Millisecond),
		served, slowest.Round(time.Millisecond))
}
