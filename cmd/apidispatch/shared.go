package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/apidispatch/apidispatch/metrics"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/shared"
)

// sharedFlags are the flags of the shared budget (design.md §12).
type sharedFlags struct {
	url, fallback, passwordFile string
}

func (s *sharedFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.url, "shared", os.Getenv("APIDISPATCH_REDIS_URL"), "share one polite budget per key with every process on the same keys, in Redis at `URL` (redis://HOST:PORT/DB or rediss:// for TLS; env APIDISPATCH_REDIS_URL). A password in a URL on the command line is visible to every user in ps: prefer the env and --shared-password-file")
	fs.StringVar(&s.fallback, "shared-fallback", "", "'local': when Redis is unreachable at start, run each lane on a conservative local share (a quarter of its start limit) until Redis answers, instead of exiting with an error")
	fs.StringVar(&s.passwordFile, "shared-password-file", os.Getenv("APIDISPATCH_REDIS_PASSWORD_FILE"), "`FILE` holding the Redis AUTH password, instead of putting it in the URL (env APIDISPATCH_REDIS_PASSWORD_FILE)")
}

// open connects the shared budget, or returns nil without --shared.
func (s *sharedFlags) open(ctx context.Context, orgs []org.Org, events *rundir.EventLog) (*shared.Budget, error) {
	if s.url == "" {
		if s.fallback != "" {
			return nil, fmt.Errorf("--shared-fallback needs --shared")
		}
		return nil, nil
	}
	if s.fallback != "" && s.fallback != "local" {
		return nil, fmt.Errorf("--shared-fallback %q: the only fallback is 'local'", s.fallback)
	}
	return shared.Open(ctx, shared.Config{
		URL: s.url, PasswordFile: s.passwordFile, Fallback: s.fallback == "local",
		Orgs: orgs, Events: events,
	})
}

// metricsServer is 'run --metrics': the registry and its server.
type metricsServer struct {
	*metrics.Metrics
	srv *http.Server
}

func startMetrics(addr string, stderr io.Writer) (*metricsServer, error) {
	m := metrics.New()
	srv, at, err := m.Serve(addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics %s: %w", addr, err)
	}
	fmt.Fprintf(stderr, "metrics: http://%s/metrics\n", at)
	return &metricsServer{Metrics: m, srv: srv}, nil
}

// Close stops the server.
func (m *metricsServer) Close() error { return m.srv.Close() }
