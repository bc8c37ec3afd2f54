package upstream

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/org"
)

// modelsAPI answers GET /v1/models per key: the organisation id to name
// (by the key's last four characters), or a status to fail with first.
type modelsAPI struct {
	mu    sync.Mutex
	seen  map[string]int // requests per key suffix
	orgOf map[string]string
	// fail is how many first requests of a key get failStatus.
	fail       map[string]int
	failStatus int
}

func (m *modelsAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(anthropic.HeaderAPIKey)
	suffix := key[len(key)-4:]
	m.mu.Lock()
	m.seen[suffix]++
	n := m.seen[suffix]
	m.mu.Unlock()
	if r.Method != http.MethodGet || r.URL.Path != "/v1/models" || r.URL.Query().Get("limit") != "1" {
		w.WriteHeader(http.StatusTeapot)
		return
	}
	if n <= m.fail[suffix] {
		w.WriteHeader(m.failStatus)
		return
	}
	id, ok := m.orgOf[suffix]
	if !ok {
		w.WriteHeader(http.StatusNotFound) // a mock that does not serve the list
		return
	}
	w.Header().Set(anthropic.HeaderOrganizationID, id)
	w.Write([]byte(`{"data":[],"has_more":false}`))
}

func (m *modelsAPI) requests(suffix string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.seen[suffix]
}

func threeOrgs() []org.Org {
	return []org.Org{{Name: "a", Key: org.NewKey("sk-ant-test-discover-0001")},
		{Name: "b", Key: org.NewKey("sk-ant-test-discover-0002")},
		{Name: "c", Key: org.NewKey("sk-ant-test-discover-0003")}}
}

func waitKnown(t *testing.T, o *Orgs, names ...string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		all := true
		for _, n := range names {
			_, known := o.ID(n)
			all = all && known
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v not all known after 10 s", names)
		}
	}
}

// Discover learns each key's organisation from the models list before any
// lane has an answer: a key of an organisation listed before stops at
// once, an unknown key no longer holds a lane to one request, and OnLearn
// is told.
func TestDiscoverLearnsOrganisationsBeforeAnyAnswer(t *testing.T) {
	api := &modelsAPI{seen: map[string]int{}, orgOf: map[string]string{"0001": "org-x", "0002": "org-x", "0003": "org-y"}}
	srv := httptest.NewServer(api)
	defer srv.Close()
	var notes []string
	var mu sync.Mutex
	o := NewOrgs(threeOrgs(), func(drop, keep, id, reason string) {
		mu.Lock()
		notes = append(notes, drop+" "+keep+" "+id)
		mu.Unlock()
	})
	lc := gate.LaneConfig{Org: "c", Pool: anthropic.PoolSonnet4, Cap: 5, StartFraction: 1}
	c := o.Wrap(gate.NewLane(lc), lc)
	now := time.Now()
	if ps := admitAll(c, now); len(ps) != 1 {
		t.Fatalf("c admitted %d before its organisation is known, want 1", len(ps))
	}
	var learnt atomic.Int64
	stop := o.OnLearn(func() { learnt.Add(1) })
	defer stop()
	o.Discover(context.Background(), Discovery{Client: srv.Client(), Base: srv.URL + "/", Orgs: threeOrgs()})
	waitKnown(t, o, "a", "b", "c")
	if reason, keep, id := o.Drop("b"); reason == "" || keep != "a" || id != "org-x" {
		t.Errorf("b (the same organisation as a, listed after it): dropped %q for %q %q; want dropped for a, org-x", reason, keep, id)
	}
	if r := o.Dropped("a") + o.Dropped("c"); r != "" {
		t.Errorf("a or c dropped: %q", r)
	}
	if ps := admitAll(c, now); len(ps) != 4 {
		t.Errorf("c admitted %d more once known, want 4 (cap 5, one in flight)", len(ps))
	}
	mu.Lock()
	if len(notes) != 1 || !strings.HasPrefix(notes[0], "b a org-x") {
		t.Errorf("same-organisation notices %q, want one for b", notes)
	}
	mu.Unlock()
	for deadline := time.Now().Add(5 * time.Second); learnt.Load() < 3 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if n := learnt.Load(); n != 3 {
		t.Errorf("OnLearn told %d times, want 3 (one per key)", n)
	}
	for _, s := range []string{"0001", "0002", "0003"} {
		if n := api.requests(s); n != 1 {
			t.Errorf("key …%s asked %d times, want 1", s, n)
		}
	}
}

// Failures the API may recover from (a 503, a 429) are tried again; an
// answer of the API's own that names no organisation (a 404 from a mock
// without the models list) ends the discovery of that key: its lanes'
// first answers decide, as without it.
func TestDiscoverRetriesServerErrorsAndStopsOnRefusal(t *testing.T) {
	for _, status := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests} {
		api := &modelsAPI{seen: map[string]int{}, orgOf: map[string]string{"0001": "org-x", "0002": "org-y"},
			fail: map[string]int{"0001": 2}, failStatus: status}
		srv := httptest.NewServer(api)
		o := NewOrgs(threeOrgs(), nil)
		ctx, cancel := context.WithCancel(context.Background())
		// Speed 20: the back-offs of 0.5 and 1 s of API time are 25 and 50 ms.
		o.Discover(ctx, Discovery{Client: srv.Client(), Base: srv.URL, Orgs: threeOrgs(), Speed: 20})
		waitKnown(t, o, "a", "b")
		time.Sleep(200 * time.Millisecond) // c's discovery has had time to try again, were it to
		if id, _ := o.ID("a"); id != "org-x" || api.requests("0001") != 3 {
			t.Errorf("after two %ds: a's organisation %q after %d requests, want org-x after 3", status, id, api.requests("0001"))
		}
		if _, known := o.ID("c"); known || api.requests("0003") != 1 {
			t.Errorf("c (a 404 naming no organisation): known %v after %d requests, want unknown after 1", known, api.requests("0003"))
		}
		cancel()
		srv.Close()
	}
}

// Discover stops when its context ends, and asks nothing for a key whose
// organisation is already known.
func TestDiscoverStopsWithItsContext(t *testing.T) {
	api := &modelsAPI{seen: map[string]int{}, orgOf: map[string]string{"0001": "org-x", "0003": "org-z"},
		fail: map[string]int{"0001": 1 << 30}, failStatus: http.StatusInternalServerError}
	srv := httptest.NewServer(api)
	defer srv.Close()
	o := NewOrgs(threeOrgs(), nil)
	lc := gate.LaneConfig{Org: "b", Pool: anthropic.PoolSonnet4, Cap: 5, StartFraction: 1}
	b := o.Wrap(gate.NewLane(lc), lc)
	now := time.Now()
	ps := admitAll(b, now)
	b.Done(now, ps[0], answer("org-y", 200))
	ctx, cancel := context.WithCancel(context.Background())
	o.Discover(ctx, Discovery{Client: srv.Client(), Base: srv.URL, Orgs: threeOrgs(), Speed: 20})
	waitKnown(t, o, "c")
	// a's first request may still be on its way when c is known (a
	// loaded machine, -race): cancel once the API has seen one.
	for deadline := time.Now().Add(5 * time.Second); api.requests("0001") == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	cancel()
	time.Sleep(100 * time.Millisecond)
	n := api.requests("0001")
	time.Sleep(300 * time.Millisecond)
	if m := api.requests("0001"); m != n || n == 0 {
		t.Errorf("a's discovery sent %d requests before the cancel and %d after, want some and none", n, m-n)
	}
	if m := api.requests("0002"); m != 0 {
		t.Errorf("b (known from its lane's answer) asked %d times, want 0", m)
	}
}

// A key whose organisation is unknown sends nothing while its first
// discovery request is out (several --shared processes that each sent a
// first message on one organisation's keys before anyone knew it went past
// its cap: 3 in flight on a cap of 2 in the outside attack's
// TestAttackFirstRequestsOfKeysOfOneOrgInSeveralProcessesBeforeDiscoveryAnswers);
// once that request has ended without naming the organisation (a 503),
// the key sends one request at a time, as without discovery.
func TestDiscoverHoldsAKeyUntilItsFirstRequestEnds(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	orgs := threeOrgs()[:1]
	o := NewOrgs(orgs, nil)
	lc := gate.LaneConfig{Org: "a", Pool: anthropic.PoolSonnet4, Cap: 5, StartFraction: 1}
	a := o.Wrap(gate.NewLane(lc), lc)
	woke := make(chan struct{}, 8)
	defer o.OnLearn(func() { woke <- struct{}{} })()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o.Discover(ctx, Discovery{Client: srv.Client(), Base: srv.URL, Orgs: orgs, Speed: 1000})
	now := time.Now()
	if _, wait, ok := a.TryAdmit(now, gate.Demand{}); ok || wait <= 0 {
		t.Fatalf("admitted %v (wait %v) while the key's first discovery request is out, want a refusal with a bound", ok, wait)
	}
	close(release)
	select {
	case <-woke:
	case <-time.After(5 * time.Second):
		t.Fatal("the end of the first discovery request woke nobody")
	}
	if ps := admitAll(a, now); len(ps) != 1 {
		t.Errorf("admitted %d once the first discovery request failed, want 1 (one until the organisation is known)", len(ps))
	}
}
