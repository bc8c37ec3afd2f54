// Package shared keeps one polite budget per API key across processes and
// machines, in Redis. Every process whose key has the same fingerprint
// shares, per model pool: the concurrency slots (leases with a TTL renewed
// while the process lives, so a dead process's slots come back), the AIMD
// limit (one multiplicative cut per congestion epoch for all processes),
// the ramp, the retry-after holds, what the rate-limit headers said, and
// the colleague reserve. Processes with work split the limit about evenly;
// one alone gets all of it; one that finishes hands its share back at once.
//
// Each step is one Lua script run atomically on Redis' own clock. Nothing
// of a key but its fingerprint reaches Redis.
//
// When Redis cannot be reached mid-run, each gate keeps going on a local
// share (the limit divided by the number of processes last seen) and
// rejoins when Redis answers again; nothing is lost or sent twice, since
// the items themselves never leave the run's own store.
package shared

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/org"
)

// keyPrefix starts every Redis key this package writes.
const keyPrefix = "apidispatch:v1:lane:"

// DefaultTTL is how long a process's lease outlives its last renewal.
const DefaultTTL = 2 * time.Second

// ErrUnreachable: Redis could not be reached at start.
var ErrUnreachable = errors.New("shared: Redis is unreachable")

// Config configures a Budget.
type Config struct {
	// URL is redis://[user:password@]host:port/db or rediss:// for TLS.
	URL string
	// PasswordFile, when set, holds the AUTH password (one line), so it
	// need not be in the URL.
	PasswordFile string
	// Fallback keeps going on a local share when Redis is unreachable at
	// start (otherwise Open fails with ErrUnreachable).
	Fallback bool
	// TTL of a lease (default DefaultTTL): a dead process's slots are free
	// again at most this long after it died.
	TTL time.Duration
	// Orgs are the run's orgs; their keys' fingerprints name the lanes.
	Orgs   []org.Org
	Events *dispatch.EventLog
	Log    *slog.Logger
}

// Stats says what the budget saw, for the summary.
type Stats struct {
	Host            string `json:"host"`
	ProcessesSeen   int    `json:"processes_seen"`
	FallbackPeriods int    `json:"fallback_periods"`
	Connected       bool   `json:"connected_at_end"`
}

// Budget connects the gates of one process to Redis and renews their
// leases. Make it with Open, hand NewGate to dispatch.Config, call Start
// before the run and Close after it. It is safe for concurrent use.
type Budget struct {
	cfg       Config
	rdb       *redis.Client
	host      string
	proc      string
	ttl       time.Duration
	every     time.Duration
	opTimeout time.Duration
	fps       map[string]string // org name → key fingerprint

	mu       sync.Mutex
	gates    []*Gate
	down     bool // Redis is out of reach
	downFrom time.Time
	periods  int
	seen     int

	trips     atomic.Int64 // script runs, for the benchmark
	kickC     chan struct{}
	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// Open connects to Redis (one PING). When it cannot be reached the error
// wraps ErrUnreachable, unless cfg.Fallback, in which case the budget
// starts on local shares and joins when Redis answers.
func Open(ctx context.Context, cfg Config) (*Budget, error) {
	opt, host, err := parseURL(cfg.URL, cfg.PasswordFile)
	if err != nil {
		return nil, err
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	b := &Budget{
		cfg: cfg, host: host, ttl: cfg.TTL,
		every:     min(cfg.TTL/4, 250*time.Millisecond),
		opTimeout: max(cfg.TTL/4, 200*time.Millisecond),
		fps:       map[string]string{},
		kickC:     make(chan struct{}, 1),
		done:      make(chan struct{}),
	}
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = b.opTimeout, b.opTimeout, b.opTimeout
	opt.MaxRetries = 0
	b.rdb = redis.NewClient(opt)
	for _, o := range cfg.Orgs {
		b.fps[o.Name] = o.Key.Fingerprint()
	}
	hn, _ := os.Hostname()
	var r [4]byte
	rand.Read(r[:])
	b.proc = fmt.Sprintf("%s:%d:%s", hn, os.Getpid(), hex.EncodeToString(r[:]))
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := b.rdb.Ping(pctx).Err(); err != nil {
		if !cfg.Fallback {
			b.rdb.Close()
			return nil, fmt.Errorf("%w at %s: %v (use --shared-fallback local to run on a local share instead)", ErrUnreachable, host, scrub(err, opt.Password))
		}
		b.down, b.downFrom, b.periods = true, time.Now(), 1
		cfg.Events.Emit(dispatch.EventWarning, "shared budget: Redis at "+host+" is unreachable; running on a local share until it answers", map[string]any{"shared": host})
		cfg.Log.Warn("shared budget: Redis unreachable; running on a local share", "host", host)
	}
	return b, nil
}

// parseURL reads a redis:// or rediss:// URL, the password optionally
// from a file, and returns the options and the host for messages.
func parseURL(raw, pwFile string) (*redis.Options, string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" {
		return nil, "", fmt.Errorf("shared: %q is not a redis:// or rediss:// URL", redactURL(raw))
	}
	opt, err := redis.ParseURL(raw)
	if err != nil {
		return nil, "", fmt.Errorf("shared: %s: %v", redactURL(raw), scrub(err, u.User.String()))
	}
	if pwFile != "" {
		b, err := os.ReadFile(pwFile)
		if err != nil {
			return nil, "", fmt.Errorf("shared: reading the Redis password file: %w", err)
		}
		opt.Password = strings.TrimSpace(string(b))
	}
	return opt, u.Host, nil
}

func redactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Redacted()
	}
	return "(unparseable URL)"
}

// scrub removes a secret from an error's text.
func scrub(err error, secret string) string {
	s := err.Error()
	if secret != "" {
		s = strings.ReplaceAll(s, secret, "xxxxx")
	}
	return s
}

// Host is the Redis address, for messages (never the password).
func (b *Budget) Host() string { return b.host }

// NewGate makes the shared gate of one lane; pass it as dispatch.Config.NewGate.
func (b *Budget) NewGate(lc dispatch.LaneConfig) dispatch.Gate {
	g := newGate(b, lc, b.fps[lc.Org])
	b.mu.Lock()
	if !b.down {
		// The first renewal comes at once; until then the gate admits
		// nothing it was not granted.
		g.local = false
	} else {
		g.localLimit = g.limit / float64(max(1, b.seen))
	}
	b.gates = append(b.gates, g)
	b.mu.Unlock()
	b.kick()
	return g
}

func (b *Budget) kick() {
	select {
	case b.kickC <- struct{}{}:
	default:
	}
}

// Start runs the renewal loop until Close.
func (b *Budget) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	go func() {
		defer close(b.done)
		t := time.NewTicker(b.every)
		defer t.Stop()
		// Kicks come when a gate has used its grant; renew at most every
		// 5 ms for them, so a starved process does not flood Redis.
		var last time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-b.kickC:
				if d := 5*time.Millisecond - time.Since(last); d > 0 {
					select {
					case <-time.After(d):
					case <-ctx.Done():
						return
					}
				}
			}
			last = time.Now()
			b.renewAll(ctx)
		}
	}()
}

func (b *Budget) renewAll(ctx context.Context) {
	b.mu.Lock()
	gates := b.gates
	b.mu.Unlock()
	for _, g := range gates {
		rctx, cancel := context.WithTimeout(ctx, b.opTimeout)
		err := g.renew(rctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				b.lost(err)
			}
			return
		}
		g.mu.Lock()
		procs := g.procs
		g.mu.Unlock()
		b.mu.Lock()
		b.seen = max(b.seen, procs)
		b.mu.Unlock()
	}
	b.rejoined(gates)
}

// lost switches every gate to a local share once Redis stops answering.
func (b *Budget) lost(err error) {
	b.mu.Lock()
	if b.down {
		b.mu.Unlock()
		return
	}
	b.down, b.downFrom = true, time.Now()
	b.periods++
	gates := b.gates
	procs := 1
	for _, g := range gates {
		g.mu.Lock()
		procs = max(procs, g.procs)
		g.mu.Unlock()
	}
	b.mu.Unlock()
	for _, g := range gates {
		g.goLocal(procs)
	}
	msg := fmt.Sprintf("shared budget: Redis at %s stopped answering (%v); continuing on a local share (the limit ÷ %d processes last seen) until it is back", b.host, err, procs)
	b.cfg.Events.Emit(dispatch.EventWarning, msg, map[string]any{"shared": b.host, "processes_last_seen": procs})
	b.cfg.Log.Warn("shared budget: Redis lost; continuing on a local share", "host", b.host, "processes_last_seen", procs)
}

func (b *Budget) rejoined(gates []*Gate) {
	b.mu.Lock()
	if !b.down {
		b.mu.Unlock()
		return
	}
	b.down = false
	out := time.Since(b.downFrom)
	b.mu.Unlock()
	maxIn := map[string]int{}
	for _, g := range gates {
		g.mu.Lock()
		maxIn[g.cfg.Org+"/"+string(g.cfg.Pool)] = g.localMaxInF
		g.mu.Unlock()
	}
	b.cfg.Events.Emit(dispatch.EventLane, fmt.Sprintf("shared budget: rejoined Redis at %s after %.1f s on a local share", b.host, out.Seconds()),
		map[string]any{"shared": b.host, "rejoined": true, "outage_s": out.Seconds(), "max_in_flight_during_outage": maxIn})
	b.cfg.Log.Info("shared budget: rejoined Redis", "host", b.host, "outage_s", out.Seconds())
}

// Stats reports what the budget saw.
func (b *Budget) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return Stats{Host: b.host, ProcessesSeen: max(1, b.seen), FallbackPeriods: b.periods, Connected: !b.down}
}

// Close stops the renewal loop and hands every slot back at once. It waits
// for the loop and is safe to call more than once.
func (b *Budget) Close() error {
	b.closeOnce.Do(func() { b.closeErr = b.close() })
	return b.closeErr
}

func (b *Budget) close() error {
	if b.cancel != nil {
		b.cancel()
		<-b.done
	}
	b.mu.Lock()
	gates := b.gates
	down := b.down
	b.mu.Unlock()
	var err error
	if !down {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		for _, g := range gates {
			if e := g.release(ctx); e != nil && err == nil {
				err = e
			}
		}
		cancel()
	}
	if e := b.rdb.Close(); e != nil && err == nil && !errors.Is(e, redis.ErrClosed) {
		err = e
	}
	return err
}

// quiet drops go-redis' own log lines (dial failures while Redis is down):
// the budget reports an outage once, as an event, and its rejoin.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quiet{}) }
