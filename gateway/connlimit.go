package gateway

import (
	"container/list"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// ConnLimits bound the client connections the gateway holds open, so that
// idle connections (a flood of them, or a client that opens many) cannot
// take the file descriptors the gateway needs for its clients' requests,
// its upstream connections and its own files.
//
// At a limit, a new connection takes the place of the connection idle for
// longest (one with no request under way: opened and silent, or kept alive
// between requests), which is closed; when every connection has a request
// under way, the new one is closed at once. A client whose idle connection
// was closed reconnects, as HTTP clients do.
type ConnLimits struct {
	// Max is the most connections open at once (0: DefaultMaxConns of the
	// process's file limit).
	Max int
	// PerIP is the most from one client IP address (0: no limit of its own).
	PerIP int
}

// connHeadroom is the part of the file limit kept for everything but
// client connections (upstream connections, the ledger, the status file,
// the batches' stores), and its least.
const (
	connHeadroomDiv = 4
	connHeadroomMin = 256
)

// DefaultMaxConns is how many client connections a process allowed
// fileLimit open files holds at most: the limit less a quarter of it (at
// least 256) of headroom. With an unknown limit (0) it is 4096.
func DefaultMaxConns(fileLimit uint64) int {
	if fileLimit == 0 {
		return 4096
	}
	room := max(fileLimit/connHeadroomDiv, connHeadroomMin)
	if fileLimit <= room {
		return 16
	}
	return int(min(fileLimit-room, 1<<30))
}

// CheckConnLimits checks c against a file limit (0: unknown) and fills in
// Max: a Max that leaves no headroom under the file limit is refused.
func CheckConnLimits(c ConnLimits, fileLimit uint64) (ConnLimits, error) {
	if c.Max < 0 || c.PerIP < 0 {
		return c, fmt.Errorf("%w: connection limits must be positive (max %d, per IP %d)", ErrConfig, c.Max, c.PerIP)
	}
	most := DefaultMaxConns(fileLimit)
	if c.Max == 0 {
		c.Max = most
	}
	if fileLimit != 0 && c.Max > most {
		return c, fmt.Errorf("%w: %d connections leave too little headroom under the process's file limit of %d: at most %d (or raise the limit: ulimit -n)",
			ErrConfig, c.Max, fileLimit, most)
	}
	return c, nil
}

// connLimiter is a listener that holds its connections to ConnLimits. Give
// its connState to the http.Server that serves it, so that it knows which
// connections are idle. It is safe for concurrent use.
type connLimiter struct {
	net.Listener
	max, perIP int

	mu    sync.Mutex
	conns map[net.Conn]*connEntry
	idle  *list.List            // of *connEntry, longest idle first
	byIP  map[string]*ipEntries // per client IP address

	evicted, refused atomic.Int64
}

type connEntry struct {
	c      net.Conn
	ip     *ipEntries
	idleAt *list.Element // in connLimiter.idle; nil: a request is under way
	ipIdle *list.Element // in ip.idle
}

type ipEntries struct {
	addr string
	n    int
	idle *list.List
}

func newConnLimiter(ln net.Listener, c ConnLimits) *connLimiter {
	return &connLimiter{Listener: ln, max: c.Max, perIP: c.PerIP, conns: map[net.Conn]*connEntry{}, idle: list.New(), byIP: map[string]*ipEntries{}}
}

// Accept implements net.Listener.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if lc := l.admit(c); lc != nil {
			return lc, nil
		}
		l.refused.Add(1)
		c.Close()
	}
}

// admit tracks c, closing the connections it takes the place of, or
// returns nil when it cannot be held.
func (l *connLimiter) admit(c net.Conn) net.Conn {
	addr := c.RemoteAddr().String()
	if h, _, err := net.SplitHostPort(addr); err == nil {
		addr = h
	}
	var victims []net.Conn
	defer func() {
		for _, v := range victims {
			l.evicted.Add(1)
			v.Close()
		}
	}()
	l.mu.Lock()
	defer l.mu.Unlock()
	ip := l.byIP[addr]
	if ip == nil {
		ip = &ipEntries{addr: addr, idle: list.New()}
		l.byIP[addr] = ip
	}
	if l.perIP > 0 && ip.n >= l.perIP {
		if ip.idle.Len() == 0 {
			l.dropIPLocked(ip)
			return nil
		}
		victims = append(victims, l.forgetLocked(ip.idle.Front().Value.(*connEntry)))
	}
	if len(l.conns) >= l.max {
		if l.idle.Len() == 0 {
			l.dropIPLocked(ip)
			return nil
		}
		victims = append(victims, l.forgetLocked(l.idle.Front().Value.(*connEntry)))
	}
	lc := &limitedConn{Conn: c, l: l}
	e := &connEntry{c: lc, ip: ip}
	l.conns[lc] = e
	ip.n++
	l.setIdleLocked(e, true) // idle until its first request
	return lc
}

// dropIPLocked forgets ip when it holds nothing.
func (l *connLimiter) dropIPLocked(ip *ipEntries) {
	if ip.n == 0 {
		delete(l.byIP, ip.addr)
	}
}

func (l *connLimiter) setIdleLocked(e *connEntry, idle bool) {
	if idle == (e.idleAt != nil) {
		return
	}
	if idle {
		e.idleAt, e.ipIdle = l.idle.PushBack(e), e.ip.idle.PushBack(e)
		return
	}
	l.idle.Remove(e.idleAt)
	e.ip.idle.Remove(e.ipIdle)
	e.idleAt, e.ipIdle = nil, nil
}

// forgetLocked stops tracking e and returns its connection.
func (l *connLimiter) forgetLocked(e *connEntry) net.Conn {
	l.setIdleLocked(e, false)
	delete(l.conns, e.c)
	e.ip.n--
	l.dropIPLocked(e.ip)
	return e.c
}

func (l *connLimiter) forget(c net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.conns[c]; e != nil {
		l.forgetLocked(e)
	}
}

// connState is the http.Server's ConnState hook: it learns which
// connections have a request under way.
func (l *connLimiter) connState(c net.Conn, s http.ConnState) {
	if t, ok := c.(interface{ NetConn() net.Conn }); ok { // TLS
		c = t.NetConn()
	}
	switch s {
	case http.StateActive, http.StateIdle:
		l.mu.Lock()
		if e := l.conns[c]; e != nil {
			l.setIdleLocked(e, s == http.StateIdle)
		}
		l.mu.Unlock()
	case http.StateHijacked, http.StateClosed:
		l.forget(c)
	}
}

// open is how many connections are held now.
func (l *connLimiter) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// limitedConn is a connection the limiter holds; closing it frees its
// place.
type limitedConn struct {
	net.Conn
	l    *connLimiter
	once sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() { c.l.forget(c) })
	return c.Conn.Close()
}
