package faultproxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/sluicehq/sluice/internal/faultproxy"
)

// A proxy in front of an echo server: forwarding, then a server that went
// down, then back.
func Example() {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()

	p, err := faultproxy.New(ln.Addr().String())
	if err != nil {
		panic(err)
	}
	defer p.Close()
	ask := func() {
		c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
		if err != nil {
			fmt.Println("dial refused")
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		fmt.Fprintln(c, "hello")
		line, err := bufio.NewReader(c).ReadString('\n')
		fmt.Printf("%q %v\n", line, err)
	}

	ask()
	p.Refuse() // as if the server were killed
	ask()
	p.Restore()
	ask()
	// Output:
	// "hello\n" <nil>
	// dial refused
	// "hello\n" <nil>
}
