package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/config"
	"github.com/sluicehq/sluice/internal/httpapi"
)

// readHeaderTimeout bounds the reading of a request's headers: a client
// that trickles them is cut off then. It is a variable only so that a test
// can shorten it.
var readHeaderTimeout = 5 * time.Second

// Timeouts of the HTTP servers: a slow or stalled client cannot hold a
// connection or a goroutine for longer.
const (
	readTimeout    = 10 * time.Second
	writeTimeout   = 10 * time.Second
	idleTimeout    = 2 * time.Minute
	maxHeaderBytes = 16 << 10
)

// serve runs the service until ctx ends or a SIGTERM or SIGINT arrives,
// reloading the policies on SIGHUP.
var serveHelp = help{
	usage: "sluice serve [-config FILE] [-drain D] [-watch=true|false]",
	about: `Runs the rate-limit service: the HTTP JSON API on listen.http, the gRPC
API (sluice.v1, Envoy's rate-limit service, health, reflection) on
listen.grpc, and metrics, health and admin endpoints on listen.admin.
Without -config: the in-memory store and the policy "default" of "100 10/s"
on :8080, :8081 and 127.0.0.1:9090. It reads the config file, the bearer
tokens it names, envoy.config's rule files and, for the memory store, its
snapshot file; nothing from stdin. SIGHUP or a change of the files reloads
the policies; SIGTERM drains and stops (docs/service.md, docs/config.md).`,
	example: "sluice serve -config /etc/sluice/sluice.yaml",
	exit:    "0 after a clean shutdown; 2 if the config is bad, a port is taken, the store cannot be opened, or a server failed",
}

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	quiet(fs)
	path := fs.String("config", "", "the YAML config file (docs/config.md); none: the in-memory store and the policy \"default\" of \"100 10/s\"")
	drain := fs.Duration("drain", 10*time.Second, "on SIGTERM, how long in-flight requests may take to finish")
	watch := fs.Bool("watch", true, "reload the config when its file changes (the file's directory is watched), as well as on SIGHUP")
	if err := fs.Parse(args); err != nil {
		return serveHelp.parseErr(err, "serve", fs, stdout)
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("serve takes no arguments, got %q", fs.Args())
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))

	cfg, err := loadConfig(*path)
	if err != nil {
		return err
	}
	for _, w := range cfg.Warnings() {
		log.Warn("config", "warning", w)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	rt, err := build(ctx, cfg, reg, log)
	if err != nil {
		return err
	}
	defer rt.close()
	rt.path = *path
	for _, w := range rt.core.Table().Envoy().Warnings() {
		log.Warn("envoy rules", "warning", w)
	}
	if err := loadSnapshot(cfg, rt, log); err != nil {
		return err
	}

	var ready atomic.Bool
	api, err := httpapi.New(rt.core, httpapi.Options{
		Tokens:       rt.tokens,
		Logger:       log,
		Ready:        readiness(&ready, rt),
		MaxBodyBytes: 0,
	})
	if err != nil {
		return err
	}
	admin := http.NewServeMux()
	admin.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	admin.Handle("GET /healthz", api)
	admin.Handle("GET /readyz", api)
	admin.HandleFunc("GET /config", rt.adminConfig)
	admin.HandleFunc("GET /peek", rt.adminPeek)
	admin.HandleFunc("POST /reset", func(w http.ResponseWriter, r *http.Request) { rt.adminReset(w, r, log) })

	apiLn, err := net.Listen("tcp", cfg.Listen.HTTP)
	if err != nil {
		return fmt.Errorf("listen.http: %w", err)
	}
	adminLn, err := net.Listen("tcp", cfg.Listen.Admin)
	if err != nil {
		apiLn.Close()
		return fmt.Errorf("listen.admin: %w", err)
	}
	grpcLn, err := net.Listen("tcp", cfg.Listen.GRPC)
	if err != nil {
		apiLn.Close()
		adminLn.Close()
		return fmt.Errorf("listen.grpc: %w", err)
	}
	gs, err := newGRPCServer(rt, reg, log)
	if err != nil {
		apiLn.Close()
		adminLn.Close()
		grpcLn.Close()
		return err
	}
	servers := []*http.Server{newServer(api, log), newServer(admin, log)}
	listeners := []net.Listener{apiLn, adminLn}
	served := make(chan error, len(servers)+1)
	for i, srv := range servers {
		go func() { served <- srv.Serve(listeners[i]) }()
	}
	go func() { served <- gs.srv.Serve(grpcLn) }()
	// The signals are caught and the watch starts before the banner: a
	// SIGHUP or a change made once the banner is out is seen.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(signals)
	if *watch && *path != "" {
		wctx, stopWatch := context.WithCancel(ctx)
		var extra []string
		if cfg.Envoy.Config != "" {
			extra = append(extra, cfg.Envoy.Config)
		}
		watched, err := watchConfig(wctx, *path, log, func() { rt.reload(*path, log, reloadOnChange) }, extra...)
		if err != nil {
			// The service runs; SIGHUP still reloads.
			log.Warn("config file changes are not watched; reload with SIGHUP", "error", err)
			stopWatch()
		} else {
			defer func() { stopWatch(); <-watched }()
		}
	}
	ready.Store(true)
	gs.setServing(true)
	announce(stdout, cfg, rt, apiLn.Addr(), grpcLn.Addr(), adminLn.Addr())

	for {
		select {
		case sig := <-signals:
			if sig == syscall.SIGHUP {
				rt.reload(*path, log, reloadOnSignal)
				continue
			}
			log.Info("shutting down", "signal", sig.String(), "drain", drain.String())
		case <-ctx.Done():
			log.Info("shutting down", "reason", context.Cause(ctx).Error(), "drain", drain.String())
		case err := <-served:
			return fmt.Errorf("server stopped: %w", err)
		}
		break
	}
	// Readiness drops first, so that load balancers stop sending; the
	// requests in flight then have the drain time to finish.
	ready.Store(false)
	gs.beginShutdown()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), *drain)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(servers)+1)
	for i, srv := range servers {
		wg.Go(func() { errs[i] = srv.Shutdown(sctx) })
	}
	wg.Go(func() { errs[len(servers)] = stopGRPC(sctx, gs.srv) })
	wg.Wait()
	// The last decision has been answered (or the drain time is over):
	// the buckets are written as they are now.
	errs = append(errs, saveSnapshot(cfg, rt, log))
	return errors.Join(errs...)
}

func newServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// loadConfig reads the config file, or returns the default config.
func loadConfig(path string) (config.Config, error) {
	if path == "" {
		return config.Default(), nil
	}
	return config.Load(path)
}

// readiness reports ready while the server is not shutting down and the
// store answers.
func readiness(ready *atomic.Bool, rt *runtime) func(context.Context) error {
	return func(ctx context.Context) error {
		if !ready.Load() {
			return errors.New("shutting down")
		}
		return rt.ping(ctx)
	}
}

// stopGRPC stops srv gracefully, letting the calls in flight finish, and
// ends the ones still running when ctx ends.
func stopGRPC(ctx context.Context, srv *grpc.Server) error {
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		srv.Stop()
		<-done
		return fmt.Errorf("grpc: calls still running after the drain time were ended: %w", ctx.Err())
	}
}

// announce prints where the service listens and how to try it.
func announce(w io.Writer, cfg config.Config, rt *runtime, api, grpcAddr, admin net.Addr) {
	fmt.Fprintf(w, "sluice: serving the HTTP API on http://%s, gRPC (sluice.v1, Envoy rate limit) on %s, and metrics on http://%s/metrics\n", api, grpcAddr, admin)
	fmt.Fprintf(w, "sluice: config %s, %s store, %d %s:\n", describeSource(rt.path), cfg.Store.Type, len(cfg.Policies), plural(len(cfg.Policies), "policy", "policies"))
	if t := rt.core.Table(); t.Envoy() != nil {
		fmt.Fprintf(w, "  and %d Envoy %s from %s\n", len(t.Envoy().Rules()), plural(len(t.Envoy().Rules()), "rule", "rules"), cfg.Envoy.Config)
	}
	for _, p := range cfg.Policies {
		limits := make([]string, len(p.Limits))
		for i, l := range p.Limits {
			limits[i] = fmt.Sprintf("%q", l.String())
		}
		shadow := ""
		if p.Shadow {
			shadow = " (shadow)"
		}
		fmt.Fprintf(w, "  %s: %s%s\n", p.Name, strings.Join(limits, " and "), shadow)
	}
	if len(cfg.Policies) > 0 {
		host := "127.0.0.1"
		if a, ok := api.(*net.TCPAddr); ok && !a.IP.IsUnspecified() {
			host = a.IP.String()
		}
		port := "8080"
		if a, ok := api.(*net.TCPAddr); ok {
			port = fmt.Sprint(a.Port)
		}
		auth := ""
		if cfg.Auth.Enabled() {
			auth = ` -H "Authorization: Bearer $TOKEN"`
		}
		fmt.Fprintf(w, "try: curl -s%s -X POST http://%s/v1/take -d '{\"policy\":%q,\"key\":\"me\"}'\n",
			auth, net.JoinHostPort(host, port), cfg.Policies[0].Name)
	}
}

func describeSource(path string) string {
	if path == "" {
		return "built-in default"
	}
	return path
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
