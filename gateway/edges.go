package gateway

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// checkEdges checks the fields of cfg that face the clients and fills in
// their defaults.
func (cfg *Config) checkEdges() error {
	switch cfg.CacheScope {
	case "", CacheScopeClient, CacheScopeShared:
	default:
		return fmt.Errorf("%w: cache scope %q: want %q or %q", ErrConfig, cfg.CacheScope, CacheScopeClient, CacheScopeShared)
	}
	if cfg.PublicURL != "" {
		u, err := url.Parse(cfg.PublicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
			u.RawQuery != "" || u.Fragment != "" || strings.Trim(u.Path, "/") != "" {
			return fmt.Errorf("%w: public URL %q: want http(s)://host[:port], the base URL clients reach the gateway at", ErrConfig, cfg.PublicURL)
		}
		cfg.PublicURL = u.Scheme + "://" + u.Host
	}
	return nil
}

// publicBase is the gateway's base URL as r's client reached it, for the
// URLs the gateway hands out (results_url): PublicURL when configured,
// else the scheme and local address of r's connection (the listener's
// own address: what the client connected to, whatever Host it claims).
func (g *Gateway) publicBase(r *http.Request) string {
	if g.cfg.PublicURL != "" {
		return g.cfg.PublicURL
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		return scheme + "://" + a.String()
	}
	return scheme + "://localhost" // no connection: a handler called directly
}
