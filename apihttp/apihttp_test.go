package apihttp_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/apidispatch/apidispatch/apihttp"
)

// redirector is a loopback server answering every request with status to
// a second loopback server, which counts what reaches it.
func redirector(t *testing.T, status int) (from *httptest.Server, to *httptest.Server, reached *atomic.Int64) {
	reached = new(atomic.Int64)
	to = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
	}))
	t.Cleanup(to.Close)
	// A second loopback host: "localhost" instead of "127.0.0.1".
	target := strings.Replace(to.URL, "127.0.0.1", "localhost", 1)
	from = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target+r.URL.Path, status)
	}))
	t.Cleanup(from.Close)
	return from, to, reached
}

// Issue 20: a base URL that redirects to another host gets an error
// naming that host, and no request (with its x-api-key, which Go would
// forward) reaches it, for every redirect status.
func TestRedirectIsRefusedAndNamesItsTarget(t *testing.T) {
	for _, status := range []int{301, 302, 303, 307, 308} {
		from, to, reached := redirector(t, status)
		c := apihttp.NewClient(nil, 4, 0)
		req, _ := http.NewRequest("POST", from.URL+"/v1/messages", strings.NewReader("{}"))
		req.Header.Set("x-api-key", "sk-ant-never-forwarded")
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%d: a redirect was followed", status)
		}
		var re *apihttp.RedirectError
		if !errors.Is(err, apihttp.ErrRedirect) || !errors.As(err, &re) || re.Status != status {
			t.Fatalf("%d: error %v", status, err)
		}
		host := strings.Replace(strings.TrimPrefix(to.URL, "http://"), "127.0.0.1", "localhost", 1)
		if !strings.Contains(err.Error(), host) || strings.Contains(err.Error(), "sk-ant") {
			t.Fatalf("%d: error %q does not name %s (or names the key)", status, err, host)
		}
		if n := reached.Load(); n != 0 {
			t.Fatalf("%d: %d requests reached the redirect's target", status, n)
		}
	}
}

// A caller's own client is guarded too.
func TestGuardRefusesRedirectsOfACallersClient(t *testing.T) {
	from, _, reached := redirector(t, http.StatusTemporaryRedirect)
	c := apihttp.Guard(&http.Client{})
	resp, err := c.Get(from.URL)
	if err == nil {
		resp.Body.Close()
	}
	if !errors.Is(err, apihttp.ErrRedirect) || reached.Load() != 0 {
		t.Fatalf("error %v, %d requests reached the target", err, reached.Load())
	}
	if apihttp.Guard(nil) != nil {
		t.Fatal("Guard(nil) is not nil")
	}
}
