package plan

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/apihttp"
)

// newClient is the client Probe and CountTokens use when given none: its
// own transport (closed when they return, so no connection outlives them)
// and a 60 s timeout.
// It refuses redirects, as every API client does (apihttp).
func newClient() *http.Client {
	return apihttp.NewClient(nil, 16, 60*time.Second)
}

// errorText is "type: message" of an error envelope, or the start of the body.
func errorText(b []byte) string {
	var env anthropic.ErrorEnvelope
	if json.Unmarshal(b, &env) == nil && env.Error.Type != "" {
		return env.Error.Type + ": " + env.Error.Message
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
