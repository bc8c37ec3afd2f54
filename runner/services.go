package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/metrics"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/shared"
)

// Shared is the shared budget of docs/design.md §12 (--shared): one polite
// budget per key with every process on the same keys, in Redis. The zero
// value is no shared budget.
type Shared struct {
	// URL is Redis' redis:// or rediss:// URL; empty: no shared budget.
	URL string
	// PasswordFile, when set, holds the Redis AUTH password.
	PasswordFile string
	// Fallback is "" or "local": with "local", a Redis unreachable at
	// start runs each lane on a conservative local share until it answers
	// instead of failing.
	Fallback string
}

// open connects the shared budget for orgs, or returns nil without a URL.
// It does not start it.
func (s Shared) open(ctx context.Context, orgs []org.Org, events *rundir.EventLog, log *slog.Logger) (*shared.Budget, error) {
	if s.URL == "" {
		if s.Fallback != "" {
			return nil, fmt.Errorf("--shared-fallback needs --shared")
		}
		return nil, nil
	}
	if s.Fallback != "" && s.Fallback != "local" {
		return nil, fmt.Errorf("--shared-fallback %q: the only fallback is 'local'", s.Fallback)
	}
	return shared.Open(ctx, shared.Config{
		URL: s.URL, PasswordFile: s.PasswordFile, Fallback: s.Fallback == "local",
		Orgs: orgs, Events: events, Log: log,
	})
}

// Check connects to Redis once and disconnects: it fails as Open would
// at a run's start (unreachable without the fallback, a bad URL or
// password file). Without a URL it only checks the fallback's flag.
func (s Shared) Check(ctx context.Context) error {
	b, err := s.open(ctx, nil, nil, nil)
	if b != nil {
		b.Close()
	}
	return err
}

// ServicesConfig configures the services beside a front door's lanes.
type ServicesConfig struct {
	Shared Shared
	// MetricsAddr, when set, is the loopback address of /metrics.
	MetricsAddr string
	// Orgs are the lanes' orgs (the shared budget names lanes by their
	// keys' fingerprints); Events gets the shared budget's warnings.
	Orgs   []org.Org
	Events *rundir.EventLog
	// Stderr gets the metrics address (nil: discarded).
	Stderr io.Writer
	// Log gets the shared budget's warnings too (nil: discarded): Redis
	// unreachable at start, lost and rejoined mid-run.
	Log *slog.Logger
}

// Services run in the background beside a front door's lanes: the shared
// budget (renewing its leases) and the metrics server. StartServices
// starts them; Stop stops them and waits. A nil *Services has none.
type Services struct {
	// Budget is the shared budget (nil without Shared.URL).
	Budget *shared.Budget
	// Metrics is the registry /metrics serves (nil without an address).
	Metrics *metrics.Metrics
	server  *metrics.Server
}

// StartServices opens and starts the services c asks for. They run until
// Stop, not until ctx ends: a run that was told to stop still renews its
// leases while its requests in flight finish.
func StartServices(ctx context.Context, c ServicesConfig) (*Services, error) {
	w := c.Stderr
	if w == nil {
		w = io.Discard
	}
	sb, err := c.Shared.open(ctx, c.Orgs, c.Events, c.Log)
	if err != nil {
		return nil, err
	}
	s := &Services{Budget: sb}
	if sb != nil {
		sb.Start(context.WithoutCancel(ctx))
	}
	if c.MetricsAddr != "" {
		m := metrics.New()
		srv, err := m.Start(ctx, c.MetricsAddr)
		if err != nil {
			s.Stop()
			return nil, fmt.Errorf("--metrics %s: %w", c.MetricsAddr, err)
		}
		fmt.Fprintf(w, "metrics: http://%s/metrics\n", srv.Addr())
		s.Metrics, s.server = m, srv
	}
	return s, nil
}

// NewGate is the lanes' gate factory with the services in it: the shared
// budget's gates in place of base, wrapped by the metrics. Without
// services it is base (nil: the in-process lane).
func (s *Services) NewGate(base func(gate.LaneConfig) gate.Gate) func(gate.LaneConfig) gate.Gate {
	if s == nil {
		return base
	}
	if s.Budget != nil {
		base = s.Budget.NewGate
	}
	if s.Metrics != nil {
		base = s.Metrics.Wrap(base)
	}
	return base
}

// SharedStats is what the shared budget saw, for the summary (nil without
// one).
func (s *Services) SharedStats() any {
	if s == nil || s.Budget == nil {
		return nil
	}
	return s.Budget.Stats()
}

// Stop stops the metrics server and the shared budget (handing its slots
// back) and waits for both. It is safe to call more than once.
func (s *Services) Stop() error {
	if s == nil {
		return nil
	}
	var errs []error
	if s.server != nil {
		errs = append(errs, s.server.Stop())
	}
	if s.Budget != nil {
		errs = append(errs, s.Budget.Stop())
	}
	return errors.Join(errs...)
}
