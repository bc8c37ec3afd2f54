package batch

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/upstream"
)

// MetadataPrefix is the metadata key under which an OpenAI batch of the
// route names its custom_id prefix: a batch that names another is not the
// record's, and is passed over without reading its input.
const MetadataPrefix = "apidispatch_prefix"

// openaiLineOverhead bounds what an OpenAI batch input line adds to an
// item's request file line: the line is the item's own
// {"custom_id","method","url","body"} with the custom_id replaced by one
// of at most 34 characters, and its newline.
const openaiLineOverhead = 64

// openaiFileRoom is kept free of a file's limit for the multipart form
// around it.
const openaiFileRoom = 64 << 10

// openaiAPI is the OpenAI Files and Batch APIs for one org: a batch is an
// uploaded JSONL file (purpose batch) of batch input lines and a create
// naming it, one model per batch; its results are its output and error
// files, and its input file holds the custom_ids it was created with.
type openaiAPI struct{ *conn }

func (c openaiAPI) pacer() *pacer  { return c.pace }
func (openaiAPI) maxRequests() int { return openai.MaxBatchRequests }
func (openaiAPI) maxBytes() int64  { return openai.MaxBatchFileBytes - openaiFileRoom }

// ready: the input file of a batch can be read whatever its status.
func (openaiAPI) ready(b *apiBatch) bool { return b.InputFile != "" }

func (openaiAPI) itemBytes(it store.Item) int64 { return it.Length + openaiLineOverhead }

func (c openaiAPI) url(path string, parts ...string) string {
	return c.base.JoinPath(append([]string{path}, parts...)...).String()
}

// create uploads the input file, then creates the batch with the prefix
// in its metadata. An upload makes no batch: its failure, answered or
// not, is certain.
func (c openaiAPI) create(ctx context.Context, prefix string, items []store.Item, body rundir.BodyReader) (*apiBatch, error) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		pw.CloseWithError(writeOpenAIUpload(mw, prefix, items, body))
	}()
	var f openai.File
	err := c.call(ctx, http.MethodPost, c.url(openai.PathFiles), pr, mw.FormDataContentType(), &f)
	pr.Close()
	<-wrote
	if err == nil && f.ID == "" {
		err = &apiError{typ: anthropic.ErrTypeNotMessage, msg: "the upload's answer has no file id"}
	}
	if err != nil {
		if ae, ok := err.(*apiError); ok {
			ae.noEffect = true
			ae.msg = "uploading the batch's input file: " + ae.msg
		}
		return nil, err
	}
	req, _ := json.Marshal(map[string]any{
		"input_file_id": f.ID, "endpoint": openai.PathChatCompletions, "completion_window": openai.CompletionWindow,
		"metadata": map[string]string{MetadataPrefix: prefix},
	})
	var b openai.Batch
	if err := c.call(ctx, http.MethodPost, c.url(openai.PathBatches), strings.NewReader(string(req)), "", &b); err != nil {
		if ae, ok := err.(*apiError); ok {
			ae.upload = f.ID
		}
		return nil, err
	}
	if b.ID == "" {
		return nil, &apiError{typ: anthropic.ErrTypeNotMessage, msg: "the create answer has no batch id"}
	}
	return openaiBatch(&b), nil
}

// writeOpenAIUpload writes the multipart form of an upload: purpose batch
// and the file, a batch input line per item under its sentID.
func writeOpenAIUpload(mw *multipart.Writer, prefix string, items []store.Item, body rundir.BodyReader) error {
	if err := mw.WriteField("purpose", openai.PurposeBatch); err != nil {
		return err
	}
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename="%s.jsonl"`, prefix))
	h.Set("Content-Type", "application/jsonl")
	part, err := mw.CreatePart(h)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(part, 256<<10)
	for _, it := range items {
		b, err := body(it)
		if err != nil {
			return fmt.Errorf("reading item %s: %w", it.CustomID, err)
		}
		id, _ := json.Marshal(sentID(prefix, it))
		bw.WriteString(`{"custom_id":`)
		bw.Write(id)
		bw.WriteString(`,"method":"POST","url":"` + openai.PathChatCompletions + `","body":`)
		bw.Write(b)
		bw.WriteString("}\n")
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return mw.Close()
}

// openaiBatch converts an OpenAI batch object.
func openaiBatch(b *openai.Batch) *apiBatch {
	at := func(p *int64) *time.Time {
		if p == nil {
			return nil
		}
		t := time.Unix(*p, 0)
		return &t
	}
	out := &apiBatch{ID: b.ID, Status: b.Status, Ended: openai.BatchTerminal(b.Status), Total: b.RequestCounts.Total,
		CreatedAt: time.Unix(b.CreatedAt, 0), InputFile: b.InputFileID, Prefix: b.Metadata[MetadataPrefix]}
	if e := at(b.ExpiresAt); e != nil {
		out.ExpiresAt = *e
	}
	for _, p := range []*int64{b.CompletedAt, b.FailedAt, b.ExpiredAt, b.CancelledAt} {
		if p != nil {
			out.EndedAt = at(p)
		}
	}
	if b.OutputFileID != nil {
		out.OutputFile = *b.OutputFileID
	}
	if b.ErrorFileID != nil {
		out.ErrorFile = *b.ErrorFileID
	}
	if b.Status == openai.BatchFailed {
		out.Failed = "the batch failed"
		if b.Errors != nil && len(b.Errors.Data) > 0 {
			var msgs []string
			for _, e := range b.Errors.Data {
				if e.Code == openai.CodeTokenLimitExceeded {
					out.QueueFull = true
				}
				m := e.Code + ": " + e.Message
				if e.Line != nil {
					m = fmt.Sprintf("line %d: %s", *e.Line, m)
				}
				msgs = append(msgs, m)
			}
			out.Failed += ": " + strings.Join(msgs, "; ")
		}
	}
	return out
}

func (c openaiAPI) retrieve(ctx context.Context, id string) (*apiBatch, error) {
	var b openai.Batch
	if err := c.call(ctx, http.MethodGet, c.url(openai.PathBatches, id), nil, "", &b); err != nil {
		return nil, err
	}
	return openaiBatch(&b), nil
}

func (c openaiAPI) cancel(ctx context.Context, id string) (*apiBatch, error) {
	var b openai.Batch
	if err := c.call(ctx, http.MethodPost, c.url(openai.PathBatches, id, "cancel"), nil, "", &b); err != nil {
		return nil, err
	}
	return openaiBatch(&b), nil
}

func (c openaiAPI) list(ctx context.Context, fn func(b *apiBatch) bool) error {
	after := ""
	for {
		u := c.url(openai.PathBatches) + "?limit=100"
		if after != "" {
			u += "&after=" + url.QueryEscape(after)
		}
		var page struct {
			Data    []openai.Batch `json:"data"`
			HasMore bool           `json:"has_more"`
		}
		if err := c.call(ctx, http.MethodGet, u, nil, "", &page); err != nil {
			return err
		}
		for i := range page.Data {
			if !fn(openaiBatch(&page.Data[i])) {
				return nil
			}
		}
		if !page.HasMore || len(page.Data) == 0 {
			return nil
		}
		after = page.Data[len(page.Data)-1].ID
	}
}

// uploads lists the org's files of purpose batch, newest first, down to
// the first created before since, in pages of the API's most (10,000), so
// that an org holding many files costs few calls.
func (c openaiAPI) uploads(ctx context.Context, since time.Time, fn func(name, id string) bool) error {
	after := ""
	for {
		u := c.url(openai.PathFiles) + "?purpose=" + openai.PurposeBatch + "&limit=10000"
		if after != "" {
			u += "&after=" + url.QueryEscape(after)
		}
		var page struct {
			Data    []openai.File `json:"data"`
			HasMore bool          `json:"has_more"`
		}
		if err := c.call(ctx, http.MethodGet, u, nil, "", &page); err != nil {
			return err
		}
		for _, f := range page.Data {
			if time.Unix(f.CreatedAt, 0).Before(since) {
				return nil
			}
			if !fn(f.Filename, f.ID) {
				return nil
			}
		}
		if !page.HasMore || len(page.Data) == 0 {
			return nil
		}
		after = page.Data[len(page.Data)-1].ID
	}
}

// parts: the output file, then the error file (those the batch has).
func (openaiAPI) parts(b *apiBatch) []string {
	var out []string
	for _, f := range []string{b.OutputFile, b.ErrorFile} {
		if f != "" {
			out = append(out, f)
		}
	}
	return out
}

// results: the lines of file f, one of b's parts.
func (c openaiAPI) results(ctx context.Context, b *apiBatch, f string, fn func(line []byte) error) error {
	err := c.stream(ctx, c.url(openai.PathFiles, f, "content"), fn)
	if ae, ok := err.(*apiError); ok {
		ae.file = f
		ae.msg = "file " + f + ": " + ae.msg
	}
	return err
}

// discard deletes the batch's input file: the API keeps it (and counts it
// in the org's file storage) until it expires. A 404 is a file deleted
// already.
func (c openaiAPI) discard(ctx context.Context, b *apiBatch) error {
	if b.InputFile == "" {
		return nil
	}
	var out struct {
		Deleted bool `json:"deleted"`
	}
	err := c.call(ctx, http.MethodDelete, c.url(openai.PathFiles, b.InputFile), nil, "", &out)
	var ae *apiError
	switch {
	case errors.As(err, &ae) && ae.status == http.StatusNotFound:
		return nil
	case err != nil:
		return err
	case !out.Deleted:
		return fmt.Errorf("the API answered the delete of %s without deleted: true", b.InputFile)
	}
	return nil
}

// sent: the batch's input file, whose lines hold its custom_ids.
func (c openaiAPI) sent(ctx context.Context, b *apiBatch, fn func(line []byte) error) error {
	return c.stream(ctx, c.url(openai.PathFiles, b.InputFile, "content"), fn)
}

// parse classifies a line of the output or error file as the sync route
// classifies the same answer (upstream.OpenAI): a success is done, a
// terminal error kept; any other answer, and a request the batch did not
// execute (expired, cancelled), is sent again.
func (openaiAPI) parse(line []byte) (result, error) {
	var l openai.BatchOutputLine
	if err := json.Unmarshal(line, &l); err != nil {
		return result{}, fmt.Errorf("a results line is not JSON: %w", err)
	}
	r := result{customID: l.CustomID}
	if l.Response == nil {
		if l.Error != nil {
			r.errCode, r.errMsg = l.Error.Code, l.Error.Message
			r.expired = l.Error.Code == openai.CodeBatchExpired
		}
		return r, nil
	}
	r.status, r.body, r.requestID = l.Response.StatusCode, l.Response.Body, l.Response.RequestID
	o, u := upstream.OpenAI.Classify(r.status, nil, r.body, nil, time.Now())
	r.errType = o.ErrorType
	switch {
	case o.Kind == anthropic.Success && u != nil:
		r.kind, r.usage = resultSucceeded, u
	case o.Kind == anthropic.Terminal:
		r.kind = resultErrored
	}
	return r, nil
}

// line is the OpenAI batch output line, as the sync route writes it for
// the same answer.
func (openaiAPI) line(customID string, r *result, d rundir.Dispatch) []byte {
	d.RequestID = r.requestID
	return rundir.OpenAIResultLine(customID, r.status, r.body, r.errCode, r.errMsg, d)
}
