package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/runner"
	"github.com/apidispatch/apidispatch/store"
	upstreampkg "github.com/apidispatch/apidispatch/upstream"
	"github.com/apidispatch/apidispatch/workload"
)

// The OpenAI Batches API (POST /v1/batches, GET /v1/batches[/{id}],
// POST /v1/batches/{id}/cancel) for clients of the openai SDKs. A batch
// is a gateway batch like a Message Batch (batches.go): its input file's
// lines, copied into its directory, are run by runner over the OpenAI
// orgs (the batch route on their Batch API by default; the
// x-apidispatch-route header as for Message Batches), with the same
// worst case held in the client's spend gate from its create, the same
// resume after a restart (each custom_id once), the same cancel and
// expiry. What is OpenAI's:
//
//   - the input file is the client's upload (oafiles.go), each line
//     {"custom_id", "method": "POST", "url": "/v1/chat/completions",
//     "body"}; a file with bad lines makes a batch whose status is failed,
//     its errors naming each bad line by number, as the API does, and
//     nothing is held or sent;
//   - a batch whose worst case would pass the client's max_cost (or the
//     gateway's --max-cost) is refused at create with the 429
//     insufficient_quota of the gateway's chat completions;
//   - the results are an output file (the requests answered 200) and an
//     error file (the rest: other statuses, and the requests canceled or
//     expired, with code batch_cancelled or batch_expired), in the API's
//     batch output line format, readable with GET /v1/files/{id}/content;
//   - statuses are the API's: validating (the create's answer),
//     in_progress, cancelling, finalizing while the results of a run
//     that ended every request are written, then completed, failed,
//     expired or cancelled; a batch the gateway stopped for good (a spend
//     cap, a run it cannot run) is failed, its errors saying why;
//     request_counts are total, completed and failed.

// oaBatchDoc is what the durable record of an OpenAI batch adds.
type oaBatchDoc struct {
	InputFileID      string            `json:"input_file_id"`
	Endpoint         string            `json:"endpoint"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	// Errors are a failed batch's errors.data (nil: not failed).
	Errors []openai.BatchError `json:"errors,omitempty"`
	// Model is the model of the file's first request; Usage the
	// answered requests' usage summed, once the batch has ended.
	Model        string       `json:"model,omitempty"`
	Usage        oaBatchUsage `json:"usage"`
	OutputFileID string       `json:"output_file_id,omitempty"`
	ErrorFileID  string       `json:"error_file_id,omitempty"`
	Expired      bool         `json:"expired,omitempty"`
	// FinalizingAt is when the gateway began to write the results of a
	// run that ended every request (nil: it has not); completed_at is
	// when it had written them.
	FinalizingAt *time.Time `json:"finalizing_at,omitempty"`
	// OutputExpiresS is the create's output_expires_after.seconds: the
	// output and error files expire that long after they are written (0:
	// the default, defaultFileExpiry).
	OutputExpiresS int64 `json:"output_expires_after_s,omitempty"`
}

// oaBatchUsage is a batch object's usage: its answered requests' usage
// summed.
type oaBatchUsage struct {
	InputTokens        int64 `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int64 `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int64 `json:"total_tokens"`
}

// add adds one answer's usage.
func (u *oaBatchUsage) add(a openai.Usage) {
	u.InputTokens += a.PromptTokens
	u.InputTokensDetails.CachedTokens += a.PromptTokensDetails.CachedTokens
	u.OutputTokens += a.CompletionTokens
	u.OutputTokensDetails.ReasoningTokens += a.CompletionTokensDetails.ReasoningTokens
	u.TotalTokens = u.InputTokens + u.OutputTokens
}

// Result files of an OpenAI batch, in its directory.
const (
	oaOutputFile = "output.jsonl"
	oaErrorFile  = "error.jsonl"
	// maxLineErrors bounds the bad lines a failed batch lists.
	maxLineErrors = 50
)

// createOABatch serves POST /v1/batches.
func (g *Gateway) createOABatch(w http.ResponseWriter, r *http.Request, client string) {
	body, ok := readBodyAs(w, r, 1<<20, writeOAError)
	if !ok {
		return
	}
	bad := func(param, code, msg string) {
		writeOAErrorParam(w, http.StatusBadRequest, openai.ErrInvalidRequest, code, param, msg)
	}
	var req struct {
		InputFileID        *string         `json:"input_file_id"`
		Endpoint           *string         `json:"endpoint"`
		CompletionWindow   *string         `json:"completion_window"`
		Metadata           json.RawMessage `json:"metadata"`
		OutputExpiresAfter json.RawMessage `json:"output_expires_after"`
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(&req); err != nil {
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te) && te.Field != "":
			bad(te.Field, "invalid_type", fmt.Sprintf("Invalid type for '%s': expected %s, but got %s.", te.Field, te.Type, te.Value))
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			bad("", "unknown_parameter", "Unrecognized request argument supplied: "+strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`))
		default:
			bad("", "", "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)")
		}
		return
	}
	switch {
	case req.InputFileID == nil:
		bad("input_file_id", "missing_required_parameter", "Missing required parameter: 'input_file_id'.")
		return
	case req.Endpoint == nil:
		bad("endpoint", "missing_required_parameter", "Missing required parameter: 'endpoint'.")
		return
	case req.CompletionWindow == nil:
		bad("completion_window", "missing_required_parameter", "Missing required parameter: 'completion_window'.")
		return
	case *req.CompletionWindow != openai.CompletionWindow:
		bad("completion_window", "invalid_value", fmt.Sprintf("Invalid value: '%s'. Supported values are: '24h'.", *req.CompletionWindow))
		return
	case *req.Endpoint != openai.PathChatCompletions:
		bad("endpoint", "invalid_value", fmt.Sprintf("Invalid value: '%s'. The apidispatch gateway's batches support '/v1/chat/completions' only.", *req.Endpoint))
		return
	}
	var meta map[string]string
	if m := bytes.TrimSpace(req.Metadata); len(m) > 0 && string(m) != "null" {
		if json.Unmarshal(m, &meta) != nil || len(meta) > 16 {
			bad("metadata", "invalid_type", "Invalid 'metadata': expected an object of at most 16 string values.")
			return
		}
	}
	outExpiry := defaultFileExpiry
	if m := bytes.TrimSpace(req.OutputExpiresAfter); len(m) > 0 && string(m) != "null" {
		var oe struct {
			Anchor  *string      `json:"anchor"`
			Seconds *json.Number `json:"seconds"`
		}
		d := json.NewDecoder(bytes.NewReader(m))
		d.UseNumber()
		d.DisallowUnknownFields()
		if d.Decode(&oe) != nil {
			bad("output_expires_after", "invalid_type", "Invalid 'output_expires_after': expected an object {\"anchor\": \"created_at\", \"seconds\": an integer}.")
			return
		}
		var secs *string
		if oe.Seconds != nil {
			v := oe.Seconds.String()
			secs = &v
		}
		var param, code, msg string
		if outExpiry, param, code, msg = parseExpiresAfter(oe.Anchor, secs, defaultFileExpiry); param != "" {
			bad("output_"+param, code, strings.ReplaceAll(msg, "'expires_after.", "'output_expires_after."))
			return
		}
	}
	route, deadline, msg := batchRoute(r)
	if msg != "" {
		bad("", "", msg)
		return
	}
	in := g.files.own(client, *req.InputFileID)
	if in == nil {
		noSuchFile(w, *req.InputFileID, "input_file_id")
		return
	}
	if in.Purpose != openai.PurposeBatch {
		bad("input_file_id", "invalid_value", fmt.Sprintf("The input file %s must have purpose 'batch', not '%s'.", in.ID, in.Purpose))
		return
	}
	if !g.serves(upstreampkg.OpenAI) {
		bad("", "", `apidispatch gateway: no OpenAI org is configured (an org with provider = "openai" in the orgs file, or OPENAI_API_KEY), so OpenAI batches cannot be served`)
		return
	}
	n, worst, model, lineErrs, err := g.checkOAInput(g.files.path(in), route == runner.RouteBatch)
	if err != nil {
		writeOAError(w, http.StatusInternalServerError, openai.ErrServer, "apidispatch gateway: reading the input file: "+err.Error())
		return
	}
	s := g.batches
	now := time.Now().UTC()
	id := "batch_" + randomHex(12)
	oa := &oaBatchDoc{InputFileID: in.ID, Endpoint: *req.Endpoint, CompletionWindow: *req.CompletionWindow, Metadata: meta, Model: model}
	if outExpiry != defaultFileExpiry {
		oa.OutputExpiresS = int64(outExpiry / time.Second)
	}
	gb := &gwBatch{dir: filepath.Join(s.dir, id), cancelReq: make(chan struct{}), meta: batchMetaDoc{
		ID: id, Seq: s.nextSeq(), Client: client, N: n, Route: route, DeadlineS: deadline.Seconds(),
		Status: statusInProgress, CreatedAt: now, ExpiresAt: now.Add(time.Duration(float64(24*time.Hour) / g.cfg.Speed)),
		Counts: counts{Processing: n}, OpenAI: oa,
	}}
	if lineErrs != nil {
		// The API's failed batch: nothing held, nothing sent.
		oa.Errors = lineErrs
		gb.meta.Status, gb.meta.EndedAt, gb.meta.Counts = statusEnded, &now, counts{}
		if err := os.MkdirAll(gb.dir, 0o700); err == nil {
			err = s.launch(gb)
		}
		if err != nil {
			os.RemoveAll(gb.dir)
			writeOAError(w, http.StatusInternalServerError, openai.ErrServer, "apidispatch gateway: storing the batch: "+err.Error())
			return
		}
		// The API validates after its create, whose answer says
		// validating; the failure shows from the next retrieve.
		writeOAJSON(w, g.appendOABatch(nil, gb, openai.BatchValidating))
		return
	}
	hold, err := g.reserveTagged(client, worst, batchHoldTag)
	if err != nil {
		g.stats.refusedCap.Add(1)
		writeOACapError(w, err)
		return
	}
	gb.hold, gb.meta.WorstNanos = hold, worst
	fail := func(err error) {
		hold.Settle(Entry{})
		os.RemoveAll(gb.dir)
		writeOAError(w, http.StatusInternalServerError, openai.ErrServer, "apidispatch gateway: storing the batch: "+err.Error())
	}
	if err := os.MkdirAll(gb.dir, 0o700); err != nil {
		fail(err)
		return
	}
	if err := linkOrCopy(g.files.path(in), filepath.Join(gb.dir, batchRequests)); err != nil {
		fail(err)
		return
	}
	if err := s.launch(gb); err != nil {
		fail(err)
		return
	}
	writeOAJSON(w, g.appendOABatch(nil, gb, openai.BatchValidating))
}

// checkOAInput reads an OpenAI batch input file: its requests, their
// worst case (at the Batch API's price when batch), or, for a file the
// API would fail, its bad lines (at most maxLineErrors, then one counting
// the rest; of the lines naming a model other than the first request's,
// the first only, as the API names it), and the model of its first
// request.
func (g *Gateway) checkOAInput(path string, batch bool) (int64, cost.Nanos, string, []openai.BatchError, error) {
	var errs []openai.BatchError
	more := 0
	addParam := func(code, param, msg string, line int64) {
		if len(errs) >= maxLineErrors {
			more++
			return
		}
		e := openai.BatchError{Code: code, Message: msg}
		if param != "" {
			e.Param = &param
		}
		if line > 0 {
			e.Line = &line
		}
		errs = append(errs, e)
	}
	add := func(code, msg string, line int64) { addParam(code, "", msg, line) }
	done := func() []openai.BatchError {
		if more > 0 {
			errs = append(errs, openai.BatchError{Code: "invalid_value", Message: fmt.Sprintf("and %d more problems", more)})
		}
		return errs
	}
	_, err := rundir.Validate(path, g.cfg.Prices)
	var ve *workload.ValidationError
	switch {
	case errors.As(err, &ve):
		for _, p := range ve.Problems {
			add("invalid_value", p.Msg, p.Line)
		}
		more += ve.More
		return 0, 0, "", done(), nil
	case errors.Is(err, workload.ErrEmpty):
		add("empty_file", "The input file has no requests.", 0)
		return 0, 0, "", done(), nil
	case err != nil:
		return 0, 0, "", nil, err
	}
	// Each line's body is read back for its worst case: its image parts
	// are billed as images, which neither its length nor its estimate
	// bounds.
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, "", nil, err
	}
	defer f.Close()
	var n, modelLine int64
	var worst cost.Nanos
	var model string
	mixed := false
	err = workload.Scan(path, func(it store.Item) error {
		n++
		if it.Provider != workload.ProviderOpenAI {
			add("invalid_value", "this line is a Message Batches request (params); a line of an OpenAI batch is {\"custom_id\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\"}", it.Line)
			return nil
		}
		switch {
		case model == "":
			model, modelLine = it.Model, it.Line
		case it.Model != model:
			// The API runs a batch on one model: a file naming another
			// fails, at the first such line (its message, code and param).
			if !mixed {
				addParam("mixed_models", "body.model", fmt.Sprintf("A batch may use one model only: this line uses '%s' and line %d '%s'.", it.Model, modelLine, model), it.Line)
			}
			mixed = true
			return nil
		}
		body, err := workload.ReadAt(f, it)
		if err != nil {
			return err
		}
		c, err := upstreampkg.OpenAI.WorstCase(g.cfg.Prices, upstreampkg.Item{Model: it.Model, EstInput: it.EstInput, Length: it.Length,
			MaxTokens: it.MaxTokens, Choices: it.Choices}, body, batch)
		if err != nil {
			add("invalid_value", fmt.Sprintf("body.model %q: its worst case cannot be priced: %v", it.Model, err), it.Line)
			return nil
		}
		worst += c
		return nil
	})
	if err != nil {
		return 0, 0, "", nil, err
	}
	if n > openai.MaxBatchRequests {
		add("too_many_requests", fmt.Sprintf("The input file has %d requests; a batch may hold at most %d.", n, openai.MaxBatchRequests), 0)
	}
	if errs != nil {
		return 0, 0, "", done(), nil
	}
	return n, worst, model, nil, nil
}

// linkOrCopy makes dst the content of src: a hard link (an upload is
// never written again, so batches made from one file share its bytes on
// disk, and a delete of the file leaves theirs), else a copy.
func linkOrCopy(src, dst string) error {
	if os.Link(src, dst) == nil {
		return nil
	}
	return copyFileSync(src, dst)
}

// copyFileSync copies src to a new file dst (0600), synced.
func copyFileSync(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// findOABatch returns the client's OpenAI batch id, or answers the API's
// 404 (another client's batch is not found either).
func (g *Gateway) findOABatch(w http.ResponseWriter, client, id string) *gwBatch {
	s := g.batches
	s.mu.Lock()
	gb := s.byID[id]
	s.mu.Unlock()
	if gb != nil {
		gb.mu.Lock()
		own := gb.meta.Client == client && gb.meta.OpenAI != nil
		gb.mu.Unlock()
		if own {
			return gb
		}
	}
	writeOAErrorParam(w, http.StatusNotFound, openai.ErrInvalidRequest, "", "batch_id", "No batch found with id '"+id+"'.")
	return nil
}

func (g *Gateway) retrieveOABatch(w http.ResponseWriter, r *http.Request, client string) {
	if gb := g.findOABatch(w, client, r.PathValue("id")); gb != nil {
		writeOAJSON(w, g.appendOABatch(nil, gb, ""))
	}
}

func (g *Gateway) cancelOABatch(w http.ResponseWriter, r *http.Request, client string) {
	gb := g.findOABatch(w, client, r.PathValue("id"))
	if gb == nil {
		return
	}
	ended, err := gb.requestCancel()
	switch {
	case ended:
		gb.mu.Lock()
		st := oaStatus(&gb.meta)
		gb.mu.Unlock()
		writeOAErrorParam(w, http.StatusBadRequest, openai.ErrInvalidRequest, "", "", fmt.Sprintf("Cannot cancel a batch with status '%s'.", st))
		return
	case err != nil:
		writeOAError(w, http.StatusInternalServerError, openai.ErrServer, "apidispatch gateway: storing the cancel: "+err.Error())
		return
	}
	writeOAJSON(w, g.appendOABatch(nil, gb, ""))
}

// listOABatches serves GET /v1/batches: the client's OpenAI batches,
// newest first, after and limit (1–100, default 20).
func (g *Gateway) listOABatches(w http.ResponseWriter, r *http.Request, client string) {
	q := r.URL.Query()
	limit, ok := oaLimit(w, q.Get("limit"), 20, 100)
	if !ok {
		return
	}
	type entry struct {
		gb  *gwBatch
		id  string
		seq int64
	}
	s := g.batches
	s.mu.Lock()
	var mine []entry
	for _, gb := range s.byID {
		gb.mu.Lock()
		if gb.meta.Client == client && gb.meta.OpenAI != nil {
			mine = append(mine, entry{gb, gb.meta.ID, gb.meta.Seq})
		}
		gb.mu.Unlock()
	}
	s.mu.Unlock()
	slices.SortFunc(mine, func(a, b entry) int { return cmpNewest(a.seq, b.seq, a.id, b.id) })
	page, more, ok := oaPage(mine, q.Get("after"), limit, func(e entry) string { return e.id })
	if !ok {
		writeOAErrorParam(w, http.StatusBadRequest, openai.ErrInvalidRequest, "invalid_value", "after", fmt.Sprintf("Invalid 'after': no batch %q", q.Get("after")))
		return
	}
	out := []byte(`{"object":"list","data":[`)
	for i, e := range page {
		if i > 0 {
			out = append(out, ',')
		}
		out = g.appendOABatch(out, e.gb, "")
	}
	writeOAJSON(w, appendListEnd(out, page, more, func(e entry) string { return e.id }))
}

// oaStatus is the API's status of a batch record. The gateway's own
// validation is done by the create's answer, which says validating.
func oaStatus(m *batchMetaDoc) string {
	switch {
	case m.Status == statusCanceling:
		return openai.BatchCancelling
	case m.Status != statusEnded && m.OpenAI.FinalizingAt != nil:
		return openai.BatchFinalizing
	case m.Status != statusEnded:
		return openai.BatchInProgress
	case m.OpenAI.Errors != nil:
		return openai.BatchFailed
	case m.CancelInitiated != nil:
		return openai.BatchCancelled
	case m.OpenAI.Expired:
		return openai.BatchExpired
	}
	return openai.BatchCompleted
}

// appendOABatch appends gb's batch object, its status status when set.
func (g *Gateway) appendOABatch(buf []byte, gb *gwBatch, status string) []byte {
	gb.mu.Lock()
	m := gb.meta
	oa := *m.OpenAI
	m.OpenAI = &oa
	c := m.Counts
	if m.Status != statusEnded && gb.st != nil {
		if agg, err := gb.st.Aggregate(context.Background()); err == nil {
			c = counts{Succeeded: agg.Succeeded, Errored: agg.Errored}
		}
	}
	gb.mu.Unlock()
	if status == "" {
		status = oaStatus(&m)
	}
	unix := func(t time.Time) *int64 { u := t.Unix(); return &u }
	b := openai.Batch{
		ID: m.ID, Object: "batch", Endpoint: oa.Endpoint, InputFileID: oa.InputFileID, CompletionWindow: oa.CompletionWindow,
		Status: status, CreatedAt: m.CreatedAt.Unix(), ExpiresAt: unix(m.ExpiresAt), Metadata: oa.Metadata,
		RequestCounts: openai.BatchRequestCounts{Total: m.N, Completed: c.Succeeded, Failed: c.Errored + c.Canceled + c.Expired},
	}
	if status == openai.BatchFailed {
		b.Errors = &openai.BatchErrors{Object: "list", Data: oa.Errors}
		b.FailedAt = unix(*m.EndedAt)
	}
	if status != openai.BatchValidating && (oa.Errors == nil || m.Stopped != nil) {
		// It ran: a batch that failed its validation never did.
		b.InProgressAt = unix(m.CreatedAt)
	}
	if m.CancelInitiated != nil {
		b.CancellingAt = unix(*m.CancelInitiated)
	}
	if oa.OutputFileID != "" {
		b.OutputFileID = &oa.OutputFileID
	}
	if oa.ErrorFileID != "" {
		b.ErrorFileID = &oa.ErrorFileID
	}
	switch status {
	case openai.BatchFinalizing:
		b.FinalizingAt = unix(*oa.FinalizingAt)
	case openai.BatchCompleted:
		b.FinalizingAt, b.CompletedAt = unix(*m.EndedAt), unix(*m.EndedAt)
		if oa.FinalizingAt != nil { // nil in a record of an older gateway
			b.FinalizingAt = unix(*oa.FinalizingAt)
		}
	case openai.BatchCancelled:
		b.CancelledAt = unix(*m.EndedAt)
	case openai.BatchExpired:
		b.ExpiredAt = unix(*m.EndedAt)
	}
	var mp *string
	if oa.Model != "" {
		mp = &oa.Model
	}
	o, _ := json.Marshal(struct {
		openai.Batch
		Model *string      `json:"model"`
		Usage oaBatchUsage `json:"usage"`
	}{b, mp, oa.Usage})
	return append(buf, o...)
}

// oaLine is what writeOAResults reads of a run's results.jsonl line: an
// OpenAI batch output line (with apidispatch's dispatch object, dropped).
type oaLine struct {
	ID       string                    `json:"id"`
	CustomID string                    `json:"custom_id"`
	Response *openai.BatchLineResponse `json:"response"`
	Error    *openai.BatchLineError    `json:"error"`
}

// Codes of a stopped batch's errors.data and of its lines not run.
const (
	// codeBatchFailed: the gateway cannot run the batch.
	codeBatchFailed = "batch_failed"
)

// oaStopCode is the code saying why a batch stopped for good: the
// insufficient_quota of the gateway's chat completions for a spend cap,
// batch_failed otherwise.
func oaStopCode(st *batchStop) string {
	if st.Cause == stopSpendCap {
		return openai.CodeInsufficientQuota
	}
	return codeBatchFailed
}

// oaFileID is the id of gb's output or error file: fixed by the batch, so
// that a finalize done again (after a crash) records the same file.
func oaFileID(batchID, kind string) string {
	sum := sha256.Sum256([]byte(batchID + "\x00" + kind))
	return "file-" + hex.EncodeToString(sum[:12])
}

// writeOAResults is writeAPIResults for an OpenAI batch: the run's
// results split into the output file (answered 200) and the error file
// (the rest, and every request the run did not end, as cancelled,
// expired, or not run because the run stopped for good), both recorded
// as gb's client's files. A batch stopped for good gets errors.data
// saying why, and so ends failed.
func (g *Gateway) writeOAResults(gb *gwBatch) func(dir string, end batchEnd) (counts, error) {
	return func(dir string, end batchEnd) (counts, error) {
		var c counts
		var usage oaBatchUsage
		var out, errs bytes.Buffer
		put := func(buf *bytes.Buffer, l oaLine) {
			b, _ := json.Marshal(openai.BatchOutputLine{ID: l.ID, CustomID: l.CustomID, Response: l.Response, Error: l.Error})
			buf.Write(b)
			buf.WriteByte('\n')
		}
		done, err := eachRunResult(dir, func(_ string, raw []byte) {
			var l oaLine
			json.Unmarshal(raw, &l)
			if l.Response != nil && l.Response.StatusCode == http.StatusOK && l.Error == nil {
				c.Succeeded++
				put(&out, l)
				var body struct {
					Usage openai.Usage `json:"usage"`
				}
				json.Unmarshal(l.Response.Body, &body)
				usage.add(body.Usage)
			} else {
				c.Errored++
				put(&errs, l)
			}
		})
		if err != nil {
			return c, err
		}
		code, msg := openai.CodeBatchCancelled, "This request was not executed because the batch was cancelled."
		var stopErrs []openai.BatchError
		switch {
		case end.expired && !end.canceled:
			code, msg = openai.CodeBatchExpired, "This request could not be executed before the completion window expired."
		case end.stop != nil && !end.canceled:
			code = oaStopCode(end.stop)
			msg = "This request was not executed because the batch stopped: " + end.stop.Message + "."
			stopErrs = []openai.BatchError{{Code: code, Message: "The batch stopped before running all its requests: " + end.stop.Message + "."}}
		}
		err = eachUnended(dir, done, func(customID string) {
			sum := sha256.Sum256([]byte(gb.meta.ID + "\x00" + customID))
			put(&errs, oaLine{ID: "batch_req_" + hex.EncodeToString(sum[:16]), CustomID: customID, Error: &openai.BatchLineError{Code: code, Message: msg}})
			if code == openai.CodeBatchExpired {
				c.Expired++
			} else {
				c.Canceled++ // cancelled, or not run (the run stopped for good)
			}
		})
		if err != nil {
			return c, err
		}
		gb.mu.Lock()
		client, id := gb.meta.Client, gb.meta.ID
		expiry := defaultFileExpiry
		if s := gb.meta.OpenAI.OutputExpiresS; s > 0 {
			expiry = time.Duration(s) * time.Second
		}
		gb.mu.Unlock()
		var outID, errID string
		for _, f := range []struct {
			name, kind string
			data       []byte
			id         *string
		}{{oaOutputFile, "output", out.Bytes(), &outID}, {oaErrorFile, "error", errs.Bytes(), &errID}} {
			if len(f.data) == 0 {
				continue
			}
			if err := rundir.WriteFileAtomic(filepath.Join(dir, f.name), f.data, 0o600); err != nil {
				return c, err
			}
			rel, err := filepath.Rel(g.cfg.StateDir, filepath.Join(dir, f.name))
			if err != nil {
				return c, err
			}
			*f.id = oaFileID(id, f.kind)
			now := time.Now()
			err = g.files.put(&fileDoc{ID: *f.id, Seq: now.UnixNano(), Client: client, Filename: id + "_" + f.kind + ".jsonl",
				Purpose: openai.PurposeBatchOutput, Bytes: int64(len(f.data)), CreatedAt: now.Unix(), ExpiresAt: g.files.expiresAt(now, expiry), Data: rel})
			if err != nil {
				return c, err
			}
		}
		gb.mu.Lock()
		gb.meta.OpenAI.OutputFileID, gb.meta.OpenAI.ErrorFileID, gb.meta.OpenAI.Usage = outID, errID, usage
		if stopErrs != nil {
			gb.meta.OpenAI.Errors = stopErrs
		}
		gb.mu.Unlock()
		return c, nil
	}
}
