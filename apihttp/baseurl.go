package apihttp

import (
	"errors"
	"fmt"
	"net"
	"net/url"
)

// ErrInsecureURL: a plain-http base URL that is not loopback.
var ErrInsecureURL = errors.New("dispatch: http:// is only allowed for loopback addresses; use https://")

// DefaultBaseURL is the API root used when none is given.
const DefaultBaseURL = "https://api.anthropic.com"

// ResolveBaseURL is CheckBaseURL of raw, or of DefaultBaseURL when raw is
// empty.
func ResolveBaseURL(raw string) (*url.URL, error) {
	if raw == "" {
		raw = DefaultBaseURL
	}
	return CheckBaseURL(raw)
}

// CheckBaseURL accepts https URLs and http URLs on loopback only.
func CheckBaseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("dispatch: base URL %q is not an absolute URL", raw)
	}
	switch u.Scheme {
	case "https":
		return u, nil
	case "http":
		host := u.Hostname()
		if host == "localhost" {
			return u, nil
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
			return u, nil
		}
		return nil, fmt.Errorf("%w (got %s)", ErrInsecureURL, u.Redacted())
	}
	return nil, fmt.Errorf("dispatch: base URL scheme %q is not http or https", u.Scheme)
}
