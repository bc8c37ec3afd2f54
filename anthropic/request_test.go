package anthropic

import (
	"net/http"
	"testing"

	"github.com/apidispatch/apidispatch/org"
)

// TestSetHeaders: the key goes in x-api-key only, the version is ours
// unless the request already names one, and content-type only with a body.
func TestSetHeaders(t *testing.T) {
	key := org.NewKey("sk-ant-test-1")
	h := http.Header{}
	SetHeaders(h, key, true)
	if h.Get(HeaderAPIKey) != "sk-ant-test-1" || h.Get(HeaderVersion) != APIVersion || h.Get("content-type") != "application/json" || len(h) != 3 {
		t.Fatalf("with a body: %v", h)
	}
	h = http.Header{}
	h.Set(HeaderVersion, "2099-01-01")
	SetHeaders(h, key, false)
	if h.Get(HeaderVersion) != "2099-01-01" || h.Get("content-type") != "" || h.Get(HeaderAPIKey) != "sk-ant-test-1" || len(h) != 2 {
		t.Fatalf("a client's version, no body: %v", h)
	}
}
