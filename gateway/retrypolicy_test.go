package gateway

import (
	"context"
	"crypto/sha256"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/dispatch"
	"github.com/apidispatch/apidispatch/internal/simtest"
	"github.com/apidispatch/apidispatch/org"
	"github.com/apidispatch/apidispatch/rundir"
)

// onceBusy is an upstream that answers each distinct request 529 (with
// retry-after-ms ra when ra > 0) the first time and then as the API
// does, and records when each attempt came; the models list (the
// organisation's discovery) it answers at once.
type onceBusy struct {
	ra time.Duration
	mu sync.Mutex
	at map[[32]byte][]time.Time
}

func (u *onceBusy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/v1/models" {
		// The discovery of the key's organisation (upstream.Orgs.Discover)
		// is not a request under test.
		w.Header().Set(anthropic.HeaderOrganizationID, "org-retry-policy")
		io.WriteString(w, `{"data":[],"has_more":false,"first_id":null,"last_id":null}`)
		return
	}
	b, _ := io.ReadAll(r.Body)
	k := sha256.Sum256(append([]byte(r.URL.Path), b...))
	u.mu.Lock()
	u.at[k] = append(u.at[k], time.Now())
	n := len(u.at[k])
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if n == 1 {
		if u.ra > 0 {
			w.Header().Set(anthropic.HeaderRetryAfterMs, strconv.FormatInt(u.ra.Milliseconds(), 10))
		}
		w.WriteHeader(529)
		io.WriteString(w, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
		return
	}
	if strings.HasSuffix(r.URL.Path, "/count_tokens") {
		io.WriteString(w, `{"input_tokens":5}`)
		return
	}
	io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":2}}`)
}

// gaps is the wait between the first two attempts of each request seen.
func (u *onceBusy) gaps() []time.Duration {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []time.Duration
	for _, ts := range u.at {
		if len(ts) >= 2 {
			out = append(out, ts[1].Sub(ts[0]))
		}
	}
	return out
}

// One retry policy: after a 529, run's engine, the gateway's Messages
// requests and its passthrough (count_tokens) all wait the server's
// retry-after when it gives one (run and Messages because their lane
// holds for it, the passthrough by gate.RetryWait), else the back-off
// (0.5 s of server time less up to a quarter, for a first failure). The
// passthrough once let a retry-after replace the back-off while Messages
// took the larger of the two.
func TestEveryRouteBacksOffAndHonoursRetryAfterAlike(t *testing.T) {
	const slack = 1500 * time.Millisecond // a loaded 2-core machine under -race
	routes := map[string]func(t *testing.T, base string){
		"run": func(t *testing.T, base string) {
			dir := t.TempDir()
			job, err := rundir.OpenJob(context.Background(), rundir.JobConfig{InputPath: simtest.Judge(t, dir, 1, 1), RunDir: filepath.Join(dir, "run"), Prices: cost.Default()}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer job.Close()
			eng, err := dispatch.NewForJob(job, dispatch.Config{Orgs: []org.Org{{Name: "a", Key: org.NewKey("sk-ant-test-retry-policy-0001")}},
				BaseURL: base, Speed: 1, Prices: cost.Default(), SampleEvery: -1})
			if err != nil {
				t.Fatal(err)
			}
			if res, err := eng.Run(context.Background()); err != nil || !res.Complete {
				t.Fatalf("run: %v", err)
			}
		},
		"messages": func(t *testing.T, base string) { postThrough(t, base, "/v1/messages") },
		"passthrough": func(t *testing.T, base string) {
			postThrough(t, base, "/v1/messages/count_tokens")
		},
	}
	for _, ra := range []time.Duration{0, 100 * time.Millisecond, 1500 * time.Millisecond} {
		lo, hi := 375*time.Millisecond, 500*time.Millisecond+slack
		if ra > 0 {
			lo, hi = ra, ra+slack
		}
		for name, send := range routes {
			t.Run(name+"/retry-after-"+ra.String(), func(t *testing.T) {
				t.Parallel()
				up := &onceBusy{ra: ra, at: map[[32]byte][]time.Time{}}
				srv := httptest.NewServer(up)
				defer srv.Close()
				if name == "run" {
					send(t, srv.URL)
				} else {
					g, err := New(Config{Orgs: []org.Org{{Name: "a", Key: org.NewKey("sk-ant-test-retry-policy-0001")}}, BaseURL: srv.URL, Speed: 1,
						Prices: cost.Default(), Clients: []Client{{Name: "a", Token: tokA}}, StateDir: t.TempDir(), RetryFor: time.Minute})
					if err != nil {
						t.Fatal(err)
					}
					gs := httptest.NewServer(g.Handler())
					send(t, gs.URL)
					gs.Close()
					g.Close()
				}
				gaps := up.gaps()
				if len(gaps) != 1 {
					t.Fatalf("%d requests retried, want 1", len(gaps))
				}
				if d := gaps[0]; d < lo || d > hi {
					t.Errorf("waited %v between attempts, want %v to %v", d, lo, hi)
				}
			})
		}
	}
}

// postThrough sends one small request to path through the gateway at base
// and wants a 200.
func postThrough(t *testing.T, base, path string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(`{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("x-api-key", tokA)
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
	}
}
