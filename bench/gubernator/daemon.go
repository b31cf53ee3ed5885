package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"

	"github.com/gubernator-io/gubernator/v2"
	"github.com/sirupsen/logrus"
)

// daemonEnv, set to 1 in the environment, makes this program (or its test
// binary) a gubernator daemon instead of the load generator: the launcher
// starts gubernator so, as a process of its own whose CPU time it reads.
const daemonEnv = "SLUICE_BENCH_GUBERNATOR_DAEMON"

// serveGubernator runs a single gubernator node until ctx ends, as its
// cmd/gubernator does, with the defaults of its environment config
// (SetupDaemonConfig: a cache of 50,000 items, a worker per CPU, its
// batching defaults), and these differences:
//
//   - it listens on free loopback ports (GUBER_GRPC_ADDRESS and
//     GUBER_HTTP_ADDRESS, unless the environment gives other ones), and
//     writes them on one line to stdout once it is up;
//   - peer discovery is "none" and the node is made its own only peer,
//     which is what a member-list of one comes to, without the gossip
//     port (7946) that would clash on a shared machine;
//   - tracing is not set up: cmd/gubernator exports spans over OTLP by
//     default, which on a machine without a collector is work the node
//     does for nothing; here the OpenTelemetry provider stays the no-op
//     one.
func serveGubernator(ctx context.Context, stdout, stderr io.Writer) error {
	for _, name := range []string{"GUBER_GRPC_ADDRESS", "GUBER_HTTP_ADDRESS"} {
		if v := os.Getenv(name); v == "" || strings.HasSuffix(v, ":0") {
			// The daemon needs the port before it listens: it advertises
			// its gRPC address to its peers (itself) and its HTTP
			// gateway dials it.
			addr, err := freePort()
			if err != nil {
				return err
			}
			if err := os.Setenv(name, addr); err != nil {
				return err
			}
		}
	}
	if os.Getenv("GUBER_PEER_DISCOVERY_TYPE") == "" {
		if err := os.Setenv("GUBER_PEER_DISCOVERY_TYPE", "none"); err != nil {
			return err
		}
	}
	logger := logrus.StandardLogger()
	logger.SetOutput(stderr)
	conf, err := gubernator.SetupDaemonConfig(logger, nil)
	if err != nil {
		return fmt.Errorf("gubernator config: %w", err)
	}
	conf.Logger = logrus.NewEntry(logger).WithField("category", "gubernator")
	d, err := gubernator.SpawnDaemon(ctx, conf)
	if err != nil {
		return fmt.Errorf("starting gubernator: %w", err)
	}
	defer d.Close()
	d.PeerInfo = gubernator.PeerInfo{GRPCAddress: conf.AdvertiseAddress, HTTPAddress: d.HTTPListener.Addr().String()}
	d.SetPeers([]gubernator.PeerInfo{d.PeerInfo})
	fmt.Fprintf(stdout, "gubernator: serving HTTP on http://%s and gRPC on %s\n", d.HTTPListener.Addr(), d.GRPCListeners[0].Addr())
	<-ctx.Done()
	return nil
}

// freePort returns a loopback address with a port free at the time.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
