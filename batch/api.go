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
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/upstream"
)

// apiBatch is a batch as the route reads it, whatever its API: each API's
// client converts its own batch object into one.
type apiBatch struct {
	ID string
	// Status is the API's own word for the batch's state (for messages).
	Status string
	// Ended: the batch will not change again; its results can be read.
	Ended bool
	// Total is how many requests it holds.
	Total      int64
	CreatedAt  time.Time
	EndedAt    *time.Time
	ExpiresAt  time.Time // zero: not known
	ArchivedAt *time.Time
	// Prefix is the custom_id prefix the batch names in its metadata
	// (OpenAI), "" when it names none: a batch that names another prefix
	// is not a record's whose prefix it does not name.
	Prefix string
	// The OpenAI batch's input, output and error files ("" when none).
	InputFile, OutputFile, ErrorFile string
	// Failed says why a batch failed as a whole (OpenAI: its input was
	// refused), "" when it did not; QueueFull: it failed for the
	// enqueued-token limit of its model.
	Failed    string
	QueueFull bool
}

// messageBatch is the message_batch object (docs/design.md §19), as far as
// the route reads it.
type messageBatch struct {
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

func (m *messageBatch) batch() *apiBatch {
	return &apiBatch{ID: m.ID, Status: m.ProcessingStatus, Ended: m.ProcessingStatus == "ended", Total: m.RequestCounts.total(),
		CreatedAt: m.CreatedAt, EndedAt: m.EndedAt, ExpiresAt: m.ExpiresAt, ArchivedAt: m.ArchivedAt}
}

// apiError is an answer other than 2xx, or no answer.
type apiError struct {
	status     int    // 0: no answer (transport error)
	typ        string // error.type, or anthropic.ErrTypeConnection
	msg        string
	retryAfter time.Duration
	// noEffect: whatever the answer, the call made no batch (an OpenAI
	// upload, which only stores a file).
	noEffect bool
	// file is the OpenAI file whose download this answered ("" for
	// another call).
	file string
	// upload is the input file an OpenAI create uploaded before its
	// batch create failed ("" when there was none).
	upload string
}

func (e *apiError) Error() string {
	if e.status == 0 {
		return e.msg
	}
	return fmt.Sprintf("HTTP %d %s: %s", e.status, e.typ, e.msg)
}

// certain reports whether the answer proves the call had no effect: a
// client error other than 408/409 (a 429 included) never creates a batch,
// nor does a redirect (never followed), nor a call that cannot (noEffect);
// a 5xx, a reset or a timeout may have.
func (e *apiError) certain() bool {
	return e.noEffect || e.status >= 300 && e.status < 500 && e.status != 408 && e.status != 409
}

// api is one provider's batch API, as the route calls it. The route's
// logic (records before creates, holds, the adoption proof, harvest-once,
// reservations, pacing) is one for every provider; an api only speaks its
// wire: the Message Batches API (messagesAPI) or the OpenAI Files and
// Batch APIs (openaiAPI).
type api interface {
	// create makes a batch of items, each sent under sentID(prefix, it),
	// reading each item's request with body. The body honours ctx: cut
	// short, the answer is lost (a 5xx-like error), unless the call that
	// was cut makes no batch (then certain).
	create(ctx context.Context, prefix string, items []store.Item, body rundir.BodyReader) (*apiBatch, error)
	retrieve(ctx context.Context, id string) (*apiBatch, error)
	cancel(ctx context.Context, id string) (*apiBatch, error)
	// list calls fn for the org's batches, newest first, until fn returns
	// false or there are no more.
	list(ctx context.Context, fn func(b *apiBatch) bool) error
	// parts names ended batch b's results streams, in the order they are
	// read (a message batch's one, an OpenAI batch's output file then its
	// error file); results streams every line of one of them.
	parts(b *apiBatch) []string
	results(ctx context.Context, b *apiBatch, part string, fn func(line []byte) error) error
	// sent streams lines that hold (as "custom_id") every custom_id batch
	// b was created with, each once: the adoption proof. ready reports
	// whether they can be read now.
	sent(ctx context.Context, b *apiBatch, fn func(line []byte) error) error
	ready(b *apiBatch) bool
	// discard deletes what batch b keeps on the org that nothing needs
	// once its results are harvested (an OpenAI batch's input file), and
	// is nil when it is gone already or there is nothing.
	discard(ctx context.Context, b *apiBatch) error
	// uploads calls fn with the name and id of each input file the org
	// holds that was uploaded since since (as far as the API's clock
	// tells), newest first, until fn returns false or there are no more
	// (nothing for an API without input files).
	uploads(ctx context.Context, since time.Time, fn func(name, id string) bool) error
	// parse reads one results line.
	parse(line []byte) (result, error)
	// line is the results.jsonl line of a harvested result.
	line(customID string, r *result, d rundir.Dispatch) []byte
	// maxRequests and maxBytes are the API's limits of one batch;
	// itemBytes bounds what an item adds to a batch's body.
	maxRequests() int
	maxBytes() int64
	itemBytes(it store.Item) int64
	pacer() *pacer
}

// resultKind is what a results line says of its request.
type resultKind int

const (
	// resultRetry: not done, nothing to keep (a retryable error, expired,
	// canceled, not a message): the item is pending again.
	resultRetry resultKind = iota
	resultSucceeded
	// resultErrored: a terminal error, kept as the item's result.
	resultErrored
)

// result is one line of a batch's results, read.
type result struct {
	customID string
	kind     resultKind
	errType  string // resultErrored's error type; a retry's when it has one
	expired  bool   // a retry: not processed before the batch expired
	// usage is a success's usage (nil: it reported none).
	usage *upstream.Usage
	// raw is the Message Batches result object; status, body and
	// requestID the OpenAI response (status 0: none, errCode and errMsg
	// say why).
	raw             json.RawMessage
	status          int
	body            json.RawMessage
	requestID       string
	errCode, errMsg string
}

// conn makes one org's calls to its batch API, paced by pace.
type conn struct {
	http *http.Client
	base *url.URL
	org  org.Org
	prov *upstream.Provider
	pace *pacer
}

// newConn is a connection of o's provider.
func newConn(hc *http.Client, base *url.URL, o org.Org, pace *pacer) *conn {
	return &conn{http: hc, base: base, org: o, prov: upstream.For(o), pace: pace}
}

// do makes one call once the org's pacer lets it go. A ctx that ends
// while it waits returns ctx.Err() unchanged: nothing was sent. ctype,
// when set, is the body's content type (else JSON when there is a body).
func (c *conn) do(ctx context.Context, method, u string, body io.Reader, ctype string) (*http.Response, error) {
	if err := c.pace.wait(ctx); err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	c.prov.SetHeaders(req.Header, c.org, body != nil)
	if ctype != "" {
		req.Header.Set("content-type", ctype)
	}
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
func (c *conn) call(ctx context.Context, method, u string, body io.Reader, ctype string, out any) error {
	resp, err := c.do(ctx, method, u, body, ctype)
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

// errorOf reads an error answer: both APIs' envelopes hold error.type and
// error.message.
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

// stream reads the JSONL answer of a GET of u, calling fn for every
// complete line. A stream that breaks off returns an error after the lines
// before the break; a line cut by the break is not passed on.
func (c *conn) stream(ctx context.Context, u string, fn func(line []byte) error) error {
	resp, err := c.do(ctx, http.MethodGet, u, nil, "")
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

// --- the Message Batches API --------------------------------------------------

// messagesAPI is Anthropic's Message Batches API for one org.
type messagesAPI struct{ *conn }

func (c messagesAPI) pacer() *pacer        { return c.pace }
func (messagesAPI) maxRequests() int       { return MaxRequests }
func (messagesAPI) maxBytes() int64        { return MaxBytes }
func (messagesAPI) ready(b *apiBatch) bool { return b.Ended && b.ArchivedAt == nil }

// itemBytes bounds what item it adds to a create body: its line, and
// `{"custom_id":"…","params":…},` around the params, which are never
// longer than the line that holds them.
func (messagesAPI) itemBytes(it store.Item) int64 { return itemBytes(it) }

func (c messagesAPI) url(parts ...string) string {
	return c.base.JoinPath(append([]string{"v1", "messages", "batches"}, parts...)...).String()
}

func (c messagesAPI) create(ctx context.Context, prefix string, items []store.Item, body rundir.BodyReader) (*apiBatch, error) {
	pr, pw := io.Pipe()
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		pw.CloseWithError(writeMessagesBody(pw, prefix, items, body))
	}()
	var m messageBatch
	err := c.call(ctx, http.MethodPost, c.url(), pr, "", &m)
	pr.Close()
	<-wrote
	if err != nil {
		return nil, err
	}
	if m.ID == "" {
		return nil, &apiError{typ: anthropic.ErrTypeNotMessage, msg: "the create answer has no batch id"}
	}
	return m.batch(), nil
}

func (c messagesAPI) retrieve(ctx context.Context, id string) (*apiBatch, error) {
	var m messageBatch
	if err := c.call(ctx, http.MethodGet, c.url(id), nil, "", &m); err != nil {
		return nil, err
	}
	return m.batch(), nil
}

func (c messagesAPI) cancel(ctx context.Context, id string) (*apiBatch, error) {
	var m messageBatch
	if err := c.call(ctx, http.MethodPost, c.url(id, "cancel"), nil, "", &m); err != nil {
		return nil, err
	}
	return m.batch(), nil
}

func (c messagesAPI) list(ctx context.Context, fn func(b *apiBatch) bool) error {
	after := ""
	for {
		u := c.url() + "?limit=100"
		if after != "" {
			u += "&after_id=" + url.QueryEscape(after)
		}
		var page struct {
			Data    []messageBatch `json:"data"`
			HasMore bool           `json:"has_more"`
			LastID  string         `json:"last_id"`
		}
		if err := c.call(ctx, http.MethodGet, u, nil, "", &page); err != nil {
			return err
		}
		for i := range page.Data {
			if !fn(page.Data[i].batch()) {
				return nil
			}
		}
		if !page.HasMore || page.LastID == "" || len(page.Data) == 0 {
			return nil
		}
		after = page.LastID
	}
}

// parts: a message batch's results are one stream.
func (messagesAPI) parts(*apiBatch) []string { return []string{"results"} }

func (c messagesAPI) results(ctx context.Context, b *apiBatch, _ string, fn func(line []byte) error) error {
	return c.stream(ctx, c.url(b.ID, "results"), fn)
}

// discard: a message batch keeps nothing beside itself.
func (messagesAPI) discard(context.Context, *apiBatch) error { return nil }

// uploads: a message batch is created without a file.
func (messagesAPI) uploads(context.Context, time.Time, func(name, id string) bool) error { return nil }

// sent: a message batch's custom_ids are in its results, once it has ended.
func (c messagesAPI) sent(ctx context.Context, b *apiBatch, fn func(line []byte) error) error {
	return c.results(ctx, b, "results", fn)
}

// writeMessagesBody streams the create body of items: {"requests":
// [{custom_id, params}, …]}, each under the custom_id sentID gives it with
// prefix, reading each params object from the input file.
func writeMessagesBody(w io.Writer, prefix string, items []store.Item, body rundir.BodyReader) error {
	bw := bufio.NewWriterSize(w, 256<<10)
	bw.WriteString(`{"requests":[`)
	for i, it := range items {
		params, err := body(it)
		if err != nil {
			return fmt.Errorf("reading item %s: %w", it.CustomID, err)
		}
		if i > 0 {
			bw.WriteByte(',')
		}
		id, _ := json.Marshal(sentID(prefix, it))
		bw.WriteString(`{"custom_id":`)
		bw.Write(id)
		bw.WriteString(`,"params":`)
		bw.Write(params)
		bw.WriteByte('}')
	}
	bw.WriteString(`]}`)
	return bw.Flush()
}

// messageResult is a Message Batches results line.
type messageResult struct {
	CustomID string          `json:"custom_id"`
	Result   json.RawMessage `json:"result"`
}

type messageResultBody struct {
	Type    string `json:"type"`
	Message *struct {
		ID    string          `json:"id"`
		Usage anthropic.Usage `json:"usage"`
	} `json:"message"`
	Error *anthropic.ErrorEnvelope `json:"error"`
}

// parse: succeeded is done; errored with a non-retryable type is terminal;
// errored with a retryable type, expired, canceled, or succeeded without a
// message is sent again.
func (messagesAPI) parse(line []byte) (result, error) {
	var l messageResult
	if err := json.Unmarshal(line, &l); err != nil {
		return result{}, fmt.Errorf("a results line is not JSON: %w", err)
	}
	r := result{customID: l.CustomID, raw: l.Result}
	var rb messageResultBody
	if err := json.Unmarshal(l.Result, &rb); err != nil {
		return r, fmt.Errorf("the result of %s is not a result object: %w", l.CustomID, err)
	}
	switch rb.Type {
	case "succeeded":
		if rb.Message != nil {
			u := rb.Message.Usage
			r.kind = resultSucceeded
			r.usage = &upstream.Usage{Input: u.InputTokens, CacheRead: u.CacheReadInputTokens, CacheWrite: u.CacheCreationInputTokens,
				Output: u.OutputTokens, Anthropic: &u}
		}
	case "errored":
		if rb.Error != nil {
			r.errType = rb.Error.Error.Type
		}
		if r.errType != "" && !anthropic.IsRetryableType(r.errType) {
			r.kind = resultErrored
		}
	case "expired":
		r.expired = true
	}
	return r, nil
}

// line: the API's result object as it came, compacted, and the dispatch
// object.
func (messagesAPI) line(customID string, r *result, d rundir.Dispatch) []byte {
	var res bytes.Buffer
	if json.Compact(&res, r.raw) != nil {
		res.Reset()
		res.Write(r.raw)
	}
	return rundir.ResultLine(customID, res.Bytes(), d)
}
