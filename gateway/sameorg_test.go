package gateway

import (
	"net/http"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
)

// holdFirst holds the first request sent with key back for hold before it
// goes out.
type holdFirst struct {
	next http.RoundTripper
	key  string
	hold time.Duration
	once sync.Once
}

func (h *holdFirst) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Header.Get(anthropic.HeaderAPIKey) == h.key && r.URL.Path == "/v1/messages" {
		h.once.Do(func() { time.Sleep(h.hold) })
	}
	return h.next.RoundTrip(r)
}
