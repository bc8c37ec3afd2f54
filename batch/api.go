package batch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/apihttp"
	"github.com/apidispatch/apidispatch/org"
)

// apiBatch is the message_batch object (docs/design.md §19), as far as the
// route reads it.
type apiBatch struct {
	ID               string        `json:"id"`
	Type             string        `json:"type"`
	ProcessingStatus string        `json:"processing_status"`
	RequestCounts    requestCounts `json:"request_counts"`
	CreatedAt        time.Time     `json:"created_at"`
	EndedAt          *time.Time    `json:"ended_at"`
	ExpiresAt        time.Time     `json:"expires_at"`
	ArchivedAt       *time.Time    `json:"archived_at"`
	CancelInitiated  *time.Time    `json:"cancel_initiated_at"`
	ResultsURL       *string       `json:"results_url"`
}

type requestCounts struct {
	Processing int64 `json:"processing"`
	Succeeded  int64 `json:"succeeded"`
	Errored    int64 `json:"errored"`
	Canceled   int64 `json:"canceled"`
	Expired    int64 `json:"expired"`
}

func (c requestCounts) total() int64 {
	return c.Processing + c.Succeeded + c.Errored + c.Canceled + c.Expired
}

func (b *apiBatch) ended() bool { return b.ProcessingStatus == "ended" }

// apiError is an answer other than 2xx, or no answer.
type apiError struct {
	status     int    // 0: no answer (transport error)
	typ        string // error.type, or anthropic.ErrTypeConnection
	msg        string
	retryAfter time.Duration
}

func (e *apiError) Error() string {
	if e.status == 0 {
		return e.msg
	}
	return fmt.Sprintf("HTTP %d %s: %s", e.status, e.typ, e.msg)
}

// certain reports whether the answer proves the call had no effect: a
// client error other than 408/409 (a 429 included) never creates a batch,
// nor does a redirect (never followed); a 5xx, a reset or a timeout may
// have.
func (e *apiError) certain() bool {
	return e.status >= 300 && e.status < 500 && e.status != 408 && e.status != 409
}

// client makes the Message Batches calls for one org, paced by pace.
type client struct {
	http *http.Client
	base *url.URL
	key  org.Key
	pace *pacer
}

func (c *client) url(parts ...string) string {
	return c.base.JoinPath(append([]string{"v1", "messages", "batches"}, parts...)...).String()
}

// do makes one call once the org's pacer lets it go. A ctx that ends
// while it waits returns ctx.Err() unchanged: nothing was sent.
func (c *client) do(ctx context.Context, method, u string, body io.Reader) (*http.Response, error) {
	if err := c.pace.wait(ctx); err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	anthropic.SetHeaders(req.Header, c.key, body != nil)
	resp, err := c.http.Do(req)
	if err != nil {
		var re *apihttp.RedirectError
		if errors.As(err, &re) {
			// Refused before anything reached the redirect's target.
			return nil, &apiError{status: re.Status, typ: "redirect", msg: re.Error()}
		}
		return nil, &apiError{typ: anthropic.ErrTypeConnection, msg: "transport: " + org.Scrub(err.Error())}
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		c.pace.onLimited(time.Now(), retryAfterOf(resp))
	} else {
		c.pace.onAnswered()
	}
	return resp, nil
}

// retryAfterOf is the delay resp asks for (anthropic.ParseRetryAfter:
// retry-after-ms, else retry-after as seconds or an HTTP date; 0 when
// there is none), the same reading as the sync route's.
func retryAfterOf(resp *http.Response) time.Duration {
	d, _ := anthropic.ParseRetryAfter(resp.Header, time.Now())
	return d
}

// call makes a request whose answer is one JSON object, decoded into out.
func (c *client) call(ctx context.Context, method, u string, body io.Reader, out any) error {
	resp, err := c.do(ctx, method, u, body)
	if err != nil {
		return err
	}
	b, rerr := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return errorOf(resp, b)
	}
	if rerr != nil {
		return &apiError{typ: anthropic.ErrTypeTruncated, msg: "answer cut short: " + rerr.Error()}
	}
	if err := json.Unmarshal(b, out); err != nil {
		return &apiError{typ: anthropic.ErrTypeNotMessage, msg: "answer is not the expected JSON: " + err.Error()}
	}
	return nil
}

func errorOf(resp *http.Response, b []byte) *apiError {
	e := &apiError{status: resp.StatusCode, typ: "http_" + strconv.Itoa(resp.StatusCode)}
	var env anthropic.ErrorEnvelope
	if json.Unmarshal(b, &env) == nil && env.Error.Type != "" {
		e.typ, e.msg = env.Error.Type, env.Error.Message
	} else {
		e.msg = string(bytes.TrimSpace(b[:min(len(b), 200)]))
	}
	e.retryAfter = retryAfterOf(resp)
	return e
}

func (c *client) create(ctx context.Context, body io.Reader) (*apiBatch, error) {
	var b apiBatch
	if err := c.call(ctx, http.MethodPost, c.url(), body, &b); err != nil {
		return nil, err
	}
	if b.ID == "" {
		return nil, &apiError{typ: anthropic.ErrTypeNotMessage, msg: "the create answer has no batch id"}
	}
	return &b, nil
}

func (c *client) retrieve(ctx context.Context, id string) (*apiBatch, error) {
	var b apiBatch
	if err := c.call(ctx, http.MethodGet, c.url(id), nil, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

func (c *client) cancel(ctx context.Context, id string) (*apiBatch, error) {
	var b apiBatch
	if err := c.call(ctx, http.MethodPost, c.url(id, "cancel"), nil, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// list calls fn for the org's batches, newest first, page by page, until
// fn returns false or there are no more.
func (c *client) list(ctx context.Context, fn func(b *apiBatch) bool) error {
	after := ""
	for {
		u := c.url() + "?limit=100"
		if after != "" {
			u += "&after_id=" + url.QueryEscape(after)
		}
		var page struct {
			Data    []apiBatch `json:"data"`
			HasMore bool       `json:"has_more"`
			LastID  string     `json:"last_id"`
		}
		if err := c.call(ctx, http.MethodGet, u, nil, &page); err != nil {
			return err
		}
		for i := range page.Data {
			if !fn(&page.Data[i]) {
				return nil
			}
		}
		if !page.HasMore || page.LastID == "" || len(page.Data) == 0 {
			return nil
		}
		after = page.LastID
	}
}

// results streams the JSONL results of an ended batch, calling fn for every
// complete line. A stream that breaks off returns an error after the lines
// before the break; a line cut by the break is not passed on.
func (c *client) results(ctx context.Context, id string, fn func(line []byte) error) error {
	resp, err := c.do(ctx, http.MethodGet, c.url(id, "results"), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return errorOf(resp, b)
	}
	r := bufio.NewReaderSize(resp.Body, 1<<20)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				if len(bytes.TrimSpace(line)) > 0 {
					// The last line may lack its newline; a complete
					// object is a complete line.
					if !json.Valid(line) {
						return &apiError{typ: anthropic.ErrTypeTruncated, msg: "results stream ends inside a line"}
					}
					return fn(line)
				}
				return nil
			}
			return &apiError{typ: anthropic.ErrTypeTruncated, msg: "results stream broke off: " + err.Error()}
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if err := fn(line); err != nil {
			return err
		}
	}
}
