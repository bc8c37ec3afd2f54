package upstream

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/org"
)

// Discovery is how Orgs.Discover asks the API which organisation each key
// reaches.
type Discovery struct {
	// Client sends the requests; it must refuse redirects (a key never
	// leaves for another host), as apihttp.Guard's clients do.
	Client *http.Client
	// Base is the API's base URL (no trailing slash needed).
	Base string
	// Orgs are the keys to ask for; those the rule already knows are
	// skipped.
	Orgs []org.Org
	// Timeout bounds each request (default DiscoverTimeout).
	Timeout time.Duration
	// Speed is the simulator's speed factor (default 1): the pause
	// between two tries of one key is gate.ProbeBackoff's.
	Speed float64
}

// DiscoverTimeout bounds one discovery request by default. The models
// list answers in well under a second; a request that takes longer is
// tried again rather than waited for.
const DiscoverTimeout = 10 * time.Second

// organisationLearner is a lane gate that keeps its own record of its
// key's organisation (the shared gate's budget is the organisation's once
// known): Discover tells it what it learnt.
type organisationLearner interface {
	LearnOrganisation(id string)
}

// Discover learns, in the background, which organisation each key of
// d.Orgs reaches, from a free request of its own: GET /v1/models?limit=1,
// whose answer names the organisation (anthropic-organization-id, or
// OpenAI's openai-organization, each key asked in its provider's way)
// like every answer of the API. Until a key's organisation is known its lanes
// send one request at a time and count against every organisation's cap;
// learning it from the key's first message would hold that for as long as
// the message takes, which an API that is slow for a while makes minutes.
// The models list is not slowed by generation.
//
// A key whose organisation is not known sends no message while its
// first discovery request is out: with --shared, processes that each
// sent a first message on a key not known yet would add up past the
// organisation's cap (each counts only its own), while a key whose
// organisation is known is on the organisation's budget in Redis. Once
// that first request has ended, learnt or not, the key's lanes send one
// request at a time until it is known, as without discovery.
//
// It returns at once. Each key is asked until its organisation is known
// (from this request or from a lane's answer), until ctx ends, or until
// the API answers the request with an error of its own that names no
// organisation (a revoked key, an endpoint a mock does not serve): the
// key's first message decides then, as without discovery. Connection
// failures, 429s and 5xx are tried again after gate.ProbeBackoff. The
// functions given to OnLearn are called after each key learnt here, and
// when a key's first request ends without it.
func (o *Orgs) Discover(ctx context.Context, d Discovery) {
	if d.Timeout <= 0 {
		d.Timeout = DiscoverTimeout
	}
	if d.Speed <= 0 {
		d.Speed = 1
	}
	url := strings.TrimRight(d.Base, "/") + "/v1/models?limit=1"
	for _, x := range d.Orgs {
		o.mu.Lock()
		in := o.info[x.Name]
		ask := in != nil && !in.known && !in.asking
		if ask {
			in.asking = true
		}
		o.mu.Unlock()
		if ask {
			go o.discover(ctx, d, url, x)
		}
	}
}

// discover asks for x's organisation until it is known or cannot be.
// Until its first request ends the key's lanes send nothing (Discover).
func (o *Orgs) discover(ctx context.Context, d Discovery, url string, x org.Org) {
	// Learnt or not, the key's lanes may send once the first request has
	// ended (or the discovery ends without one).
	defer o.firstAsked(x.Name)
	for n := 1; ctx.Err() == nil; n++ {
		if _, known := o.ID(x.Name); known {
			return
		}
		status, hdr, err := discoverOnce(ctx, d, url, x)
		if err == nil {
			lim := For(x).Limits(hdr, time.Now())
			if lim.OrganizationID != "" || (status >= 200 && status <= 299) {
				o.learnFrom(x.Name, gate.Feedback{Outcome: anthropic.Outcome{Status: status}, Limits: lim})
				return
			}
			if status != http.StatusTooManyRequests && status < 500 {
				return // the API's own refusal: the key's first message decides
			}
		}
		o.firstAsked(x.Name)
		t := time.NewTimer(gate.ProbeBackoff(min(n, 8), d.Speed))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// discoverOnce sends one discovery request with key.
func discoverOnce(ctx context.Context, d Discovery, url string, x org.Org) (int, http.Header, error) {
	ctx, cancel := context.WithTimeout(ctx, d.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	For(x).SetHeaders(req.Header, x, false)
	resp, err := d.Client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	// The answer's headers are all it is asked for.
	resp.Body.Close()
	return resp.StatusCode, resp.Header, nil
}

// firstAsked ends the hold on org name's lanes (its first discovery
// request has ended) and wakes what waits on them.
func (o *Orgs) firstAsked(name string) {
	o.mu.Lock()
	in := o.info[name]
	if in == nil || !in.asking {
		o.mu.Unlock()
		return
	}
	in.asking = false
	if in.known {
		o.mu.Unlock()
		return // learnFrom (or a lane's answer) woke them
	}
	wakes := slices.Collect(maps.Values(o.wakes))
	o.mu.Unlock()
	for _, f := range wakes {
		f()
	}
}

// learnFrom records what a discovery answer showed of org name's
// organisation: the lanes' gates that keep their own record are told, the
// same-organisation notice is given, and OnLearn's functions are called.
func (o *Orgs) learnFrom(name string, fb gate.Feedback) {
	o.mu.Lock()
	in := o.info[name]
	if in == nil || in.known {
		o.mu.Unlock()
		return
	}
	drop, keep, id, reason := o.learnLocked(name, fb)
	gates := append([]*Gate(nil), o.gates[name]...)
	wakes := slices.Collect(maps.Values(o.wakes))
	learnt := in.id
	o.mu.Unlock()
	tellOrganisation(gates, learnt)
	if drop != "" && o.onSame != nil {
		o.onSame(drop, keep, id, reason)
	}
	for _, f := range wakes {
		f()
	}
}

// OnLearn has f called whenever Discover learns a key's organisation (the
// rule may then leave room where it left none): a scheduler wakes its
// admission with it. The returned function stops the calls.
func (o *Orgs) OnLearn(f func()) (stop func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.nextWake++
	id := o.nextWake
	if o.wakes == nil {
		o.wakes = map[uint64]func(){}
	}
	o.wakes[id] = f
	var once sync.Once
	return func() {
		once.Do(func() {
			o.mu.Lock()
			delete(o.wakes, id)
			o.mu.Unlock()
		})
	}
}
