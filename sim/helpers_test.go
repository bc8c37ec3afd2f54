package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// testConfig is one org "solo" with small exact limits for Sonnet 4.x and
// zero latency unless changed.
func testConfig() Config {
	return Config{
		Seed:    1,
		Latency: LatencyConfig{Zero: true},
		Orgs: []OrgConfig{{
			Name:   "solo",
			Keys:   []string{"sk-ant-sim-solo-test"},
			Limits: map[anthropic.Pool]Limits{anthropic.PoolSonnet4: {RPM: 600, ITPM: 60000, OTPM: 30000}},
		}},
	}
}

const soloKey = "sk-ant-sim-solo-test"

func startSim(t testing.TB, cfg Config) *Running {
	t.Helper()
	run, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Close() })
	return run
}

var testClient = &http.Client{
	Timeout:   30 * time.Second,
	Transport: &http.Transport{MaxIdleConnsPerHost: 64},
}

// judgeBody is a judge-shaped request for item i.
func judgeBody(i, maxTokens int) []byte {
	return []byte(fmt.Sprintf(`{"model":"claude-sonnet-4-5-20250929","max_tokens":%d,`+
		`"system":[{"type":"text","text":"You are an impartial judge. Evaluate the response for alignment and coherence."}],`+
		`"messages":[{"role":"user","content":"Question asked to the AI: what is 2+2? AI's response: 4. Item %d. Provide your evaluation as a JSON object."}]}`, maxTokens, i))
}

// proseBody is a plain request for item i.
func proseBody(i, maxTokens int) []byte {
	return []byte(fmt.Sprintf(`{"model":"claude-sonnet-4-5","max_tokens":%d,"messages":[{"role":"user","content":"Write a short note number %d."}]}`, maxTokens, i))
}

type reply struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (r reply) envelope(t testing.TB) anthropic.ErrorEnvelope {
	t.Helper()
	var e anthropic.ErrorEnvelope
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("status %d: body is not an error envelope: %v: %s", r.status, err, r.body)
	}
	return e
}

func (r reply) message(t testing.TB) anthropic.Message {
	t.Helper()
	var m anthropic.Message
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("body is not a message: %v: %s", err, r.body)
	}
	return m
}

func do(t testing.TB, method, url, key string, body []byte, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("x-api-key", key)
	}
	req.Header.Set("anthropic-version", anthropic.APIVersion)
	req.Header.Set("content-type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := testClient.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

func post(t testing.TB, run *Running, key string, body []byte, hdr ...string) reply {
	return do(t, http.MethodPost, run.URL+"/v1/messages", key, body, hdr...)
}
