package anthropic

import (
	"net/http"

	"github.com/apidispatch/apidispatch/org"
)

// SetHeaders sets the headers every request to the API carries: the key,
// in x-api-key only; anthropic-version, APIVersion unless h already has
// one (the gateway passes its client's on); and, for a request with a
// body, content-type application/json. Every route, the planner's probe
// and the gateway build their requests with it.
func SetHeaders(h http.Header, key org.Key, hasBody bool) {
	h.Set(HeaderAPIKey, key.Reveal())
	if h.Get(HeaderVersion) == "" {
		h.Set(HeaderVersion, APIVersion)
	}
	if hasBody {
		h.Set("content-type", "application/json")
	}
}
