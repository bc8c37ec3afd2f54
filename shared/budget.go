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
// Leases are fenced: a process admits only while its lease is current on
// its own monotonic clock, less a margin (the lease runs from the moment
// the renewal was sent, so it ends before Redis' copy does). A process
// that was paused stops admitting at its lease's end until it renews, one
// that lost Redis as soon as a renewal fails; a request admitted before
// the lease ended but not yet sent is not sent. The others reclaim a
// silent process's slots only a grace after its lease ended in Redis,
// longer than its longest recent request, so its requests already in
// flight have ended on the server before their slots are given away.
//
// When Redis cannot be reached mid-run, a process cannot tell whether the
// others still reach it, so it admits nothing more (its requests in
// flight go on) and rejoins when Redis answers again; nothing is lost or
// sent twice, since the items themselves never leave the run's own store. Only when Redis is
// unreachable at start, and the run asked for it (Config.Fallback), does
// a process run on a local share: a conservative one (see FallbackShare).
package shared

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
)

// keyPrefix starts every Redis key of a lane this package writes.
const keyPrefix = "apidispatch:v1:lane:"

// orgOfPrefix starts the key that holds the organisation a key reaches
// (its fingerprint follows), once a process has seen it in an answer.
const orgOfPrefix = "apidispatch:v1:orgof:"

// orgOfTTL is how long Redis remembers a key's organisation.
const orgOfTTL = 30 * 24 * time.Hour

// DefaultTTL is how long a process's lease outlives its last renewal.
const DefaultTTL = 2 * time.Second

// FallbackShare is the part of a lane's start limit a process takes when
// Redis is unreachable at start and Config.Fallback is set: it cannot know
// how many others share the key, so it takes a quarter of the start limit
// (at least the lane's MinLimit), not the whole of it.
const FallbackShare = 0.25

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
	// TTL of a lease (default DefaultTTL): a process admits on a grant only
	// until TTL (less a margin of TTL/10) after it sent the renewal that
	// gave it.
	TTL time.Duration
	// Grace (default TTL) is the least time after a process's lease ended
	// in Redis that the others wait before they take its slots: its
	// requests in flight when it went silent have the grace plus the
	// margin to finish. Each lane asks for more when its requests may last
	// longer: until the bound of each request it has in flight
	// (gate.StillRunningBound of its max_tokens), and a quarter more than its longest request of the last
	// minute or two (at most 10 minutes). A dead process's slots are free
	// again TTL+grace after its last renewal.
	Grace time.Duration
	// Orgs are the run's orgs; their keys' fingerprints name the lanes.
	Orgs   []org.Org
	Events *rundir.EventLog
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
// before the run and Close (or Stop) after it. It is safe for concurrent use.
type Budget struct {
	cfg       Config
	rdb       *redis.Client
	host      string
	proc      string
	ttl       time.Duration
	grace     time.Duration
	margin    time.Duration // the lease ends this much earlier locally
	every     time.Duration
	opTimeout time.Duration
	fps       map[string]string // org name → key fingerprint
	// orgOf is key fingerprint → the organisation it reaches, as Redis
	// knew at Open (later ones each gate learns from its answers).
	orgOf map[string]string

	mu       sync.Mutex
	gates    []*Gate
	down     bool // Redis is out of reach
	downFrom time.Time
	// startLocal: Redis was unreachable at start (with Fallback); gates
	// made before it first answers run on a local share.
	startLocal bool
	periods    int
	seen       int

	trips atomic.Int64 // script runs, for the benchmark
	kickC chan struct{}
	// started and stopped (under mu) make Start run the loop once, and
	// never after Stop.
	started, stopped bool
	cancel           context.CancelFunc
	done             chan struct{}
	closeOnce        sync.Once
	closeErr         error
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
	if cfg.Grace <= 0 {
		cfg.Grace = cfg.TTL
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	b := &Budget{
		cfg: cfg, host: host, ttl: cfg.TTL, grace: cfg.Grace, margin: cfg.TTL / 10,
		every:     min(cfg.TTL/4, 250*time.Millisecond),
		opTimeout: max(cfg.TTL/4, 200*time.Millisecond),
		fps:       map[string]string{},
		orgOf:     map[string]string{},
		kickC:     make(chan struct{}, 1),
		done:      make(chan struct{}),
	}
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = b.opTimeout, b.opTimeout, b.opTimeout
	opt.MaxRetries = 0
	// Every call's context bounds it (go-redis ignores a context's
	// deadline otherwise, and each read of a call gets the whole
	// ReadTimeout): a process closing while Redis is out of reach must
	// not wait a read timeout per lane and per operation.
	opt.ContextTimeoutEnabled = true
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
		b.down, b.downFrom, b.periods, b.startLocal = true, time.Now(), 1, true
		cfg.Events.Emit(rundir.EventWarning, "shared budget: Redis at "+host+" is unreachable; running on a conservative local share until it answers", map[string]any{"shared": host})
		cfg.Log.Warn("shared budget: Redis unreachable; running on a local share", "host", host)
		return b, nil
	}
	if err := b.loadOrgs(pctx); err != nil && !cfg.Fallback {
		b.rdb.Close()
		return nil, fmt.Errorf("%w at %s: %v", ErrUnreachable, host, scrub(err, opt.Password))
	}
	return b, nil
}

// loadOrgs reads the organisations other processes learnt the keys reach.
func (b *Budget) loadOrgs(ctx context.Context) error {
	if len(b.fps) == 0 {
		return nil
	}
	var names, keys []string
	for _, fp := range b.fps {
		names = append(names, fp)
		keys = append(keys, orgOfPrefix+fp)
	}
	vals, err := b.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return err
	}
	for i, v := range vals {
		if s, ok := v.(string); ok && s != "" {
			b.orgOf[names[i]] = s
		}
	}
	return nil
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
//
// A process has one gate per lane: every gate renews under the process's
// name, so a second gate of the same lane (the next engine of a run: the
// pilot's, auto's sync share, what comes back from the batches) would
// overwrite in Redis what the first holds, and an idle one would tell the
// others the process holds nothing while the other has the cap in flight.
// NewGate therefore hands a later engine the lane's existing gate, which
// judges the key anew (not disabled) and asks for slots at once.
func (b *Budget) NewGate(lc gate.LaneConfig) gate.Gate {
	fp := b.fps[lc.Org]
	g := newGate(b, lc, fp, b.orgOf[fp])
	b.mu.Lock()
	for _, old := range b.gates {
		// The same key and pool: the same lane, wherever its budget is now.
		if old.fp == g.fp && old.cfg.Pool == g.cfg.Pool {
			b.mu.Unlock()
			old.mu.Lock()
			old.disabled = ""
			old.starved = true
			old.mu.Unlock()
			b.kick()
			return old
		}
	}
	if b.tagTakenLocked(g, g.keys[0]) {
		g.proc = b.proc + "|" + fp
	}
	if !b.startLocal {
		// The first renewal comes at once; until then the gate admits
		// nothing it was not granted.
		g.local = false
	} else {
		g.localLimit = math.Max(g.cfg.MinLimit, math.Floor(g.limit*FallbackShare))
	}
	b.gates = append(b.gates, g)
	b.mu.Unlock()
	b.kick()
	return g
}

// tagTakenLocked reports whether a gate of b other than g renews on the
// lane whose first key is k (two keys of one organisation, each with its
// lane on the organisation's budget): g then renews under a name of its
// own, so that neither overwrites what the other holds. b.mu is held.
func (b *Budget) tagTakenLocked(g *Gate, k string) bool {
	for _, x := range b.gates {
		if x != g && x.keysNow()[0] == k {
			return true
		}
	}
	return false
}

func (b *Budget) kick() {
	select {
	case b.kickC <- struct{}{}:
	default:
	}
}

// Start runs the renewal loop in the background until ctx ends or Stop
// (or Close) is called. Only the first call starts it: a later one, or one
// after Stop, does nothing.
func (b *Budget) Start(ctx context.Context) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started || b.stopped {
		return
	}
	b.started = true
	ctx, cancel := context.WithCancel(ctx)
	b.cancel = cancel
	go b.renewLoop(ctx)
}

// renewLoop renews the leases every b.every, and soon after a kick, until
// ctx ends.
func (b *Budget) renewLoop(ctx context.Context) {
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
}

// renewAll renews every gate's lease at once (one round trip each, all
// concurrent, so that many lanes do not lapse one after another on a slow
// Redis) and waits for them.
func (b *Budget) renewAll(ctx context.Context) {
	b.mu.Lock()
	gates := b.gates
	b.mu.Unlock()
	errs := make([]error, len(gates))
	var wg sync.WaitGroup
	for i, g := range gates {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, b.opTimeout)
			defer cancel()
			errs[i] = g.renew(rctx)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		if ctx.Err() == nil {
			b.lost(err)
		}
		return
	}
	procs := 0
	for _, g := range gates {
		procs = max(procs, g.procsSeen())
	}
	b.mu.Lock()
	b.seen = max(b.seen, procs)
	b.mu.Unlock()
	b.rejoined(gates)
}

// lost notes that Redis stopped answering. Each gate admits nothing more
// until a renewal answers (Redis keeps its slots for the lease and a grace
// more, for the requests already in flight).
func (b *Budget) lost(err error) {
	b.mu.Lock()
	if b.down {
		b.mu.Unlock()
		return
	}
	b.down, b.downFrom = true, time.Now()
	b.periods++
	gates := b.gates
	b.mu.Unlock()
	for _, g := range gates {
		g.goDark()
	}
	msg := fmt.Sprintf("shared budget: Redis at %s stopped answering (%v); admitting nothing until it is back", b.host, err)
	b.cfg.Events.Emit(rundir.EventWarning, msg, map[string]any{"shared": b.host})
	b.cfg.Log.Warn("shared budget: Redis lost; admitting nothing until it is back", "host", b.host)
}

func (b *Budget) rejoined(gates []*Gate) {
	b.mu.Lock()
	if !b.down {
		b.mu.Unlock()
		return
	}
	b.down, b.startLocal = false, false
	out := time.Since(b.downFrom)
	b.mu.Unlock()
	maxIn := map[string]int{}
	for _, g := range gates {
		g.mu.Lock()
		maxIn[g.cfg.Org+"/"+string(g.cfg.Pool)] = g.localMaxInF
		g.mu.Unlock()
	}
	b.cfg.Events.Emit(rundir.EventLane, fmt.Sprintf("shared budget: rejoined Redis at %s after %.1f s without it", b.host, out.Seconds()),
		map[string]any{"shared": b.host, "rejoined": true, "outage_s": out.Seconds(), "max_in_flight_during_outage": maxIn})
	b.cfg.Log.Info("shared budget: rejoined Redis", "host", b.host, "outage_s", out.Seconds())
}

// Stats reports what the budget saw.
func (b *Budget) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return Stats{Host: b.host, ProcessesSeen: max(1, b.seen), FallbackPeriods: b.periods, Connected: !b.down}
}

// Close stops the renewal loop, waits for it, and hands every slot back at
// once, but those of a lane with requests admitted and never Done (cut by
// the process as it stops): they may still run upstream, so the others
// get them only when the lease and its grace have passed. Each lane handed
// back is recorded in Config.Events (a lane event with "handed_back"): its
// cap stops bounding the others from then, before the process has exited.
// It is safe to call more than once (later calls return the first's
// error), and before or without Start.
func (b *Budget) Close() error {
	b.closeOnce.Do(func() { b.closeErr = b.close() })
	return b.closeErr
}

// outOfReach reports whether the renewals find Redis out of reach now.
func (b *Budget) outOfReach() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.down
}

// Stop is Close, for callers that pair Start with Stop.
func (b *Budget) Stop() error { return b.Close() }

func (b *Budget) close() error {
	b.mu.Lock()
	b.stopped = true
	cancel := b.cancel
	b.mu.Unlock()
	if cancel != nil {
		cancel()
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
			if g.busy() {
				// Requests it admitted were never answered (cut at the
				// process's exit): they may still run upstream. Their
				// slots stay taken until the lease and its grace have
				// passed, as a killed process's.
				continue
			}
			if e := g.release(ctx); e != nil {
				// Out of reach: the remaining lanes' slots lapse with their
				// leases and grace, as a killed process's do, rather
				// than each wait for Redis in turn.
				err = e
				break
			}
			// From here the lane's cap is no longer this process's: the
			// others on the key may go up to the smallest cap of those
			// still in Redis while this process is still finishing (the
			// campaign's checker reads when from this event).
			b.cfg.Events.Emit(rundir.EventLane, fmt.Sprintf("shared budget: %s/%s handed its slots and its cap back (the run is over)", g.cfg.Org, g.cfg.Pool),
				map[string]any{"org": g.cfg.Org, "pool": string(g.cfg.Pool), "key": g.fp, "handed_back": true})
		}
		cancel()
	}
	if e := b.rdb.Close(); e != nil && err == nil && !errors.Is(e, redis.ErrClosed) {
		err = e
	}
	return err
}

// QuietRedisLog drops go-redis' own log lines (dial failures while Redis
// is down) for the whole process: the budget reports an outage once, as an
// event, and its rejoin. go-redis has one logger per process, not one per
// client, so the program calls this where it starts rather than the
// package changing it behind its importers' backs.
func QuietRedisLog() { redis.SetLogger(quiet{}) }

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
