package sim

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/internal/numfmt"
	"github.com/apidispatch/apidispatch/openai"
)

// The Files and Batch APIs of the OpenAI surface. A batch's schedule is
// fixed when it is created, all in API time: it validates for
// oaValidateTime, then its requests are processed one after another at
// the org's BatchLimits.PerMinute (the org's batches FIFO), then it
// finalizes for oaFinalizeTime and is completed. One not done within 24 h
// is expired; a cancelled one stays cancelling for BatchLimits.CancelS.
// The input file is validated at create (a bad file makes the batch fail
// once validating ends), and so is the enqueued-token limit of its model.
// When a batch is first seen ended its output and error files are
// written and its succeeded requests billed at half price.

const (
	oaValidateTime    = 10 * time.Second
	oaFinalizeTime    = 10 * time.Second
	oaFileRetention   = 30 * 24 * time.Hour // a batch file expires after 30 days
	oaMaxListedFiles  = 10_000
	saltOAFile        = 0x9b05688c2b3e6c1f
	saltOABatch       = 0x1f83d9abfb41bd6b ^ 0x5be0cd19137e2179
	saltOABatchReq    = 0xcbbb9d5dc1059ed8
	saltOABatchCmpl   = 0x629a292a367cd507
	saltOABatchLineID = 0x9159015a3070dd17
)

var oaPurposes = map[string]bool{"assistants": true, "batch": true, "fine-tune": true, "vision": true, "user_data": true, "evals": true}

// oaFile is an uploaded or generated file.
type oaFile struct {
	id, filename, purpose string
	data                  []byte
	created               int64 // Unix seconds
	expires               int64 // Unix seconds; 0 none
	results               bool  // a batch's output or error file, whose downloads batch_results_cut strikes
}

func appendOAFile(b []byte, f *oaFile) []byte {
	b = append(b, `{"id":`...)
	b = appendJSONString(b, f.id)
	b = append(b, `,"object":"file","bytes":`...)
	b = strconv.AppendInt(b, int64(len(f.data)), 10)
	b = append(b, `,"created_at":`...)
	b = strconv.AppendInt(b, f.created, 10)
	b = append(b, `,"expires_at":`...)
	if f.expires > 0 {
		b = strconv.AppendInt(b, f.expires, 10)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"filename":`...)
	b = appendJSONString(b, f.filename)
	b = append(b, `,"purpose":`...)
	b = appendJSONString(b, f.purpose)
	return append(b, `,"status":"processed","status_details":null}`...)
}

// oaNewFileID is a file id unique per (org, n).
func (s *Server) oaNewFileID(n uint64) string { return "file-" + s.newID("", n, saltOAFile)[:22] }

// addFile stores f in the org.
func (oa *oaOrg) addFile(f *oaFile) {
	oa.fmu.Lock()
	oa.files[f.id] = f
	oa.fileList = append(oa.fileList, f)
	oa.fmu.Unlock()
}

func (s *Server) oaFilesRoute(c *oaCall) {
	rest := strings.TrimPrefix(c.r.URL.Path, openai.PathFiles)
	if rest == "" || rest == "/" {
		switch c.r.Method {
		case http.MethodPost:
			s.oaUpload(c)
		case http.MethodGet:
			s.oaListFiles(c)
		default:
			s.oaMethod(c, "POST or GET")
		}
		return
	}
	id, action, _ := strings.Cut(rest[1:], "/")
	oa := c.ks.org.oa
	oa.fmu.Lock()
	f := oa.files[id]
	oa.fmu.Unlock()
	if f == nil || (action != "" && action != "content") {
		s.oaWriteError(c, &oaError{status: http.StatusNotFound, typ: openai.ErrInvalidRequest, msg: "No such File object: " + id, param: "id"})
		return
	}
	switch {
	case action == "" && c.r.Method == http.MethodGet:
		s.oaWriteJSON(c, http.StatusOK, appendOAFile(nil, f))
	case action == "" && c.r.Method == http.MethodDelete:
		oa.fmu.Lock()
		delete(oa.files, id)
		for i, g := range oa.fileList {
			if g == f {
				oa.fileList = append(oa.fileList[:i], oa.fileList[i+1:]...)
				break
			}
		}
		oa.fmu.Unlock()
		b := append([]byte(`{"id":`), appendJSONString(nil, id)...)
		s.oaWriteJSON(c, http.StatusOK, append(b, `,"object":"file","deleted":true}`...))
	case action == "content" && c.r.Method == http.MethodGet:
		c.processing()
		c.h[hContentType] = []string{"application/octet-stream"}
		// batch_results_cut strikes each download on its own, as a
		// network cut would: the file itself stays whole.
		if f.results && s.faults.Load().match(FaultBatchResultsCut, c.ks.org.idx, "", c.ks.fp, s.apiNow(), &c.rng) != nil {
			c.w.WriteHeader(http.StatusOK)
			c.w.Write(f.data[:len(f.data)/2])
			http.NewResponseController(c.w).Flush()
			panic(http.ErrAbortHandler) // the connection closes mid-file
		}
		c.h[hContentLen] = []string{strconv.Itoa(len(f.data))}
		c.w.WriteHeader(http.StatusOK)
		c.w.Write(f.data)
	case action == "":
		s.oaMethod(c, "GET or DELETE")
	default:
		s.oaMethod(c, "GET")
	}
}

// oaUpload serves POST /v1/files: multipart/form-data with "purpose" and
// "file" (and an optional expires_after, accepted).
func (s *Server) oaUpload(c *oaCall) {
	mt, params, err := mime.ParseMediaType(c.r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		s.oaWriteError(c, oaInvalid("", "", "Invalid Content-Type: POST /v1/files expects multipart/form-data."))
		return
	}
	mr := c.r.MultipartReader
	reader, err := mr()
	if err != nil {
		s.oaWriteError(c, oaInvalid("", "", "could not read the multipart body: %v", err))
		return
	}
	var purpose, filename string
	var data []byte
	var haveFile bool
	for {
		part, err := reader.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			s.oaWriteError(c, oaInvalid("", "", "could not read the multipart body: %v", err))
			return
		}
		b, err := io.ReadAll(io.LimitReader(part, openai.MaxBatchFileBytes+1))
		if err != nil {
			s.oaWriteError(c, oaInvalid("", "", "could not read the multipart body: %v", err))
			return
		}
		switch part.FormName() {
		case "purpose":
			purpose = string(b)
		case "file":
			haveFile, data, filename = true, b, path.Base(part.FileName())
		}
	}
	switch {
	case !haveFile:
		s.oaWriteError(c, oaInvalid("file", "missing_required_parameter", "Missing required parameter: 'file'."))
		return
	case purpose == "":
		s.oaWriteError(c, oaInvalid("purpose", "missing_required_parameter", "Missing required parameter: 'purpose'."))
		return
	case !oaPurposes[purpose]:
		s.oaWriteError(c, oaInvalid("purpose", "invalid_value", "'%s' is not one of ['fine-tune', 'assistants', 'batch', 'user_data', 'vision', 'evals'] - 'purpose'", purpose))
		return
	case len(data) > openai.MaxBatchFileBytes:
		s.oaWriteError(c, &oaError{status: http.StatusRequestEntityTooLarge, typ: openai.ErrInvalidRequest,
			msg: fmt.Sprintf("File is too large: the maximum size of a batch input file is %d MB.", openai.MaxBatchFileBytes>>20), param: "file"})
		return
	case purpose == openai.PurposeBatch && !strings.HasSuffix(filename, ".jsonl"):
		s.oaWriteError(c, oaInvalid("file", "invalid_file_format", "Invalid file format for Batch API. Must be .jsonl"))
		return
	}
	now := time.Now()
	f := &oaFile{id: s.oaNewFileID(c.n), filename: filename, purpose: purpose, data: data, created: now.Unix()}
	if purpose == openai.PurposeBatch {
		f.expires = now.Add(s.real(oaFileRetention)).Unix()
	}
	c.ks.org.oa.addFile(f)
	s.oaWriteJSON(c, http.StatusOK, appendOAFile(nil, f))
}

// oaListFiles serves GET /v1/files: newest first, purpose filter, after
// and limit.
func (s *Server) oaListFiles(c *oaCall) {
	q := c.r.URL.Query()
	limit, aerr := oaLimit(q.Get("limit"), oaMaxListedFiles, oaMaxListedFiles)
	if aerr != nil {
		s.oaWriteError(c, aerr)
		return
	}
	oa := c.ks.org.oa
	oa.fmu.Lock()
	var all []*oaFile
	for i := len(oa.fileList) - 1; i >= 0; i-- {
		if p := q.Get("purpose"); p == "" || oa.fileList[i].purpose == p {
			all = append(all, oa.fileList[i])
		}
	}
	oa.fmu.Unlock()
	page, more, ok := oaPage(all, q.Get("after"), limit, func(f *oaFile) string { return f.id })
	if !ok {
		s.oaWriteError(c, oaInvalid("after", "invalid_value", "Invalid 'after': no file %q", q.Get("after")))
		return
	}
	b := []byte(`{"object":"list","data":[`)
	for i, f := range page {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendOAFile(b, f)
	}
	s.oaWriteJSON(c, http.StatusOK, appendListTail(b, page, more, func(f *oaFile) string { return f.id }))
}

func oaLimit(v string, def, most int) (int, *oaError) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > most {
		return 0, oaInvalid("limit", "integer_above_max_value", "Invalid 'limit': expected an integer between 1 and %d, but got %q instead.", most, v)
	}
	return n, nil
}

// oaPage is the page of all (newest first) after the item named after.
func oaPage[T any](all []T, after string, limit int, id func(T) string) (page []T, more, ok bool) {
	if after != "" {
		i := 0
		for i < len(all) && id(all[i]) != after {
			i++
		}
		if i == len(all) {
			return nil, false, false
		}
		all = all[i+1:]
	}
	return all[:min(limit, len(all))], len(all) > limit, true
}

func appendListTail[T any](b []byte, page []T, more bool, id func(T) string) []byte {
	b = append(b, `],"first_id":`...)
	if len(page) == 0 {
		b = append(b, `null,"last_id":null`...)
	} else {
		b = appendJSONString(b, id(page[0]))
		b = append(b, `,"last_id":`...)
		b = appendJSONString(b, id(page[len(page)-1]))
	}
	b = append(b, `,"has_more":`...)
	b = strconv.AppendBool(b, more)
	return append(b, '}')
}

// --- batches ------------------------------------------------------------------

// oaItem is one line of a batch's input file.
type oaItem struct {
	cid  string
	body []byte
	req  oaRequest
	perr *oaError // the line's body is refused when processed (400)
}

// oaOutcome of one request once its batch has ended.
type oaOutcome uint8

const (
	oaPending oaOutcome = iota
	oaOK
	oaBad     // its body was refused: a 400 in the error file
	oaFault   // a batch_errored_* fault: a 500 in the error file
	oaExpired // not executed within 24 h
	oaCanceled
)

// oaBatch is one batch. Fields above mu are fixed at creation.
type oaBatch struct {
	id, endpoint, window string
	seq                  uint64
	ks                   *keyState
	input                *oaFile
	metadata             []byte // raw JSON object or nil
	model                *oaModel
	items                []oaItem
	tokens               int64         // enqueued prompt tokens
	errs                 []byte        // errors.data of a failed batch (JSON array) or nil
	created              time.Duration // API time
	wall0                time.Time     // wall time of created
	validEnd             time.Duration
	start                time.Duration
	rate                 float64 // requests per API second
	stallAt              int
	expires              time.Duration
	hidden               time.Duration // batch_not_found: invisible until then
	cancelD              time.Duration

	mu       sync.Mutex
	cancelAt time.Duration // -1: never
	procEnd  time.Duration // the last request is processed (or cancel/expiry stops it)
	final    bool
	outcomes []oaOutcome
	outFile  *oaFile
	errFile  *oaFile
	usage    oaUsage // of the succeeded requests, once final
}

func (b *oaBatch) procTime(k int) time.Duration {
	return b.start + time.Duration(float64(k+1)/b.rate*float64(time.Second))
}

// processedAt is how many requests are processed by API time t.
func (b *oaBatch) processedAt(t time.Duration) int {
	if b.errs != nil || t < b.start {
		return 0
	}
	p := int(math.Floor((t - b.start).Seconds() * b.rate))
	p = min(max(p, 0), b.stallAt)
	for p < b.stallAt && b.procTime(p) <= t {
		p++
	}
	for p > 0 && b.procTime(p-1) > t {
		p--
	}
	return p
}

// status is b's status at API time t and when it entered it. b.mu held.
func (b *oaBatch) status(t time.Duration) (string, time.Duration) {
	switch {
	case b.cancelAt >= 0 && t < b.cancelAt+b.cancelD:
		return openai.BatchCancelling, b.cancelAt
	case b.cancelAt >= 0:
		return openai.BatchCancelled, b.cancelAt + b.cancelD
	case t < b.validEnd:
		return openai.BatchValidating, b.created
	case b.errs != nil:
		return openai.BatchFailed, b.validEnd
	case b.procEnd > b.expires && t >= b.expires:
		return openai.BatchExpired, b.expires
	case t < b.procEnd:
		return openai.BatchInProgress, b.start
	case t < b.procEnd+oaFinalizeTime:
		return openai.BatchFinalizing, b.procEnd
	}
	return openai.BatchCompleted, b.procEnd + oaFinalizeTime
}

func (s *Server) oaBatchRoute(c *oaCall) {
	rest := strings.TrimPrefix(c.r.URL.Path, openai.PathBatches)
	if rest == "" || rest == "/" {
		switch c.r.Method {
		case http.MethodPost:
			s.oaCreateBatch(c)
		case http.MethodGet:
			s.oaListBatches(c)
		default:
			s.oaMethod(c, "POST or GET")
		}
		return
	}
	id, action, _ := strings.Cut(rest[1:], "/")
	switch {
	case action == "" && c.r.Method == http.MethodGet:
		s.oaRetrieveBatch(c, id)
	case action == "cancel" && c.r.Method == http.MethodPost:
		s.oaCancelBatch(c, id)
	case action == "":
		s.oaMethod(c, "GET")
	case action == "cancel":
		s.oaMethod(c, "POST")
	default:
		s.oaWriteError(c, &oaError{status: http.StatusNotFound, typ: openai.ErrInvalidRequest, msg: "Invalid URL (" + c.r.Method + " " + c.r.URL.Path + ")"})
	}
}

// oaLineError is one of a failed batch's errors.data.
func appendLineError(b []byte, code, msg, param string, line int) []byte {
	if len(b) > 1 {
		b = append(b, ',')
	}
	e := oaError{msg: msg, typ: "", param: param, code: code}
	b = append(b, `{"code":`...)
	b = appendJSONString(b, e.code)
	b = append(b, `,"message":`...)
	b = appendJSONString(b, e.msg)
	b = append(b, `,"param":`...)
	if param == "" {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, param)
	}
	b = append(b, `,"line":`...)
	if line > 0 {
		b = strconv.AppendInt(b, int64(line), 10)
	} else {
		b = append(b, "null"...)
	}
	return append(b, '}')
}

// parseBatchInput validates an input file against endpoint: one JSON
// object a line with a unique custom_id, method POST, url the endpoint
// and a body object, every body naming one model. It returns the items
// and the model, or errors.data (a JSON array) for a batch that fails.
func parseBatchInput(data []byte, endpoint string) ([]oaItem, *oaModel, []byte) {
	errs := []byte{'['}
	fail := func(code, msg, param string, line int) ([]oaItem, *oaModel, []byte) {
		return nil, nil, append(appendLineError(errs, code, msg, param, line), ']')
	}
	var items []oaItem
	seen := map[string]int{}
	var model *oaModel
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), openai.MaxBatchFileBytes)
	line := 0
	for sc.Scan() {
		line++
		raw := bytes.TrimSpace(sc.Bytes())
		if len(raw) == 0 {
			continue
		}
		var l struct {
			CustomID *string         `json:"custom_id"`
			Method   *string         `json:"method"`
			URL      *string         `json:"url"`
			Body     json.RawMessage `json:"body"`
		}
		if json.Unmarshal(raw, &l) != nil {
			return fail("invalid_json_line", "This line is not parseable as valid JSON.", "", line)
		}
		switch {
		case l.CustomID == nil || *l.CustomID == "":
			return fail("missing_required_parameter", "Missing required parameter: 'custom_id'.", "custom_id", line)
		case l.Method == nil || *l.Method != http.MethodPost:
			return fail("invalid_value", "Invalid value for 'method': only POST is supported.", "method", line)
		case l.URL == nil || *l.URL != endpoint:
			return fail("mismatched_endpoint", fmt.Sprintf("The url of this line does not match the batch's endpoint %s.", endpoint), "url", line)
		case len(l.Body) == 0 || l.Body[0] != '{':
			return fail("missing_required_parameter", "Missing required parameter: 'body' (an object).", "body", line)
		}
		if j, dup := seen[*l.CustomID]; dup {
			return fail("duplicate_custom_id", fmt.Sprintf("The custom_id '%s' is used by line %d too; custom_id values must be unique within a batch.", *l.CustomID, j), "custom_id", line)
		}
		seen[*l.CustomID] = line
		var head struct {
			Model string `json:"model"`
		}
		json.Unmarshal(l.Body, &head)
		m := oaModelByID[head.Model]
		if m == nil {
			return fail("model_not_found", fmt.Sprintf("The model '%s' does not exist or you do not have access to it.", head.Model), "body.model", line)
		}
		if model == nil {
			model = m
		} else if m != model {
			return fail("mixed_models", fmt.Sprintf("A batch may use one model only: this line uses '%s' and line 1 '%s'.", m.id, model.id), "body.model", line)
		}
		it := oaItem{cid: *l.CustomID, body: append([]byte(nil), l.Body...)}
		it.req, it.perr = parseOpenAIChat(it.body)
		if it.perr == nil && it.req.stream {
			it.perr = oaInvalid("stream", "invalid_value", "Streaming is not supported in the Batch API.")
		}
		items = append(items, it)
		if len(items) > openai.MaxBatchRequests {
			return fail("too_many_requests", fmt.Sprintf("The input file has more than %s requests, the most a batch may hold.", numfmt.Commas(openai.MaxBatchRequests)), "", 0)
		}
	}
	if sc.Err() != nil {
		return fail("invalid_json_line", "A line is longer than the largest file allowed.", "", line)
	}
	if len(items) == 0 {
		return fail("empty_file", "The input file has no requests.", "", 0)
	}
	return items, model, nil
}

func (s *Server) oaCreateBatch(c *oaCall) {
	body, ok := s.oaReadBody(c, nil)
	if !ok {
		return
	}
	var w struct {
		InputFileID        *string         `json:"input_file_id"`
		Endpoint           *string         `json:"endpoint"`
		CompletionWindow   *string         `json:"completion_window"`
		Metadata           json.RawMessage `json:"metadata"`
		OutputExpiresAfter json.RawMessage `json:"output_expires_after"`
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(&w); err != nil {
		s.oaWriteError(c, oaDecodeError(body, err))
		return
	}
	switch {
	case w.InputFileID == nil:
		s.oaWriteError(c, oaInvalid("input_file_id", "missing_required_parameter", "Missing required parameter: 'input_file_id'."))
		return
	case w.Endpoint == nil:
		s.oaWriteError(c, oaInvalid("endpoint", "missing_required_parameter", "Missing required parameter: 'endpoint'."))
		return
	case w.CompletionWindow == nil:
		s.oaWriteError(c, oaInvalid("completion_window", "missing_required_parameter", "Missing required parameter: 'completion_window'."))
		return
	case *w.CompletionWindow != openai.CompletionWindow:
		s.oaWriteError(c, oaInvalid("completion_window", "invalid_value", "Invalid value: '%s'. Supported values are: '24h'.", *w.CompletionWindow))
		return
	case *w.Endpoint != openai.PathChatCompletions:
		s.oaWriteError(c, oaInvalid("endpoint", "invalid_value", "Invalid value: '%s'. The simulator's batches support '/v1/chat/completions' only.", *w.Endpoint))
		return
	}
	ks := c.ks
	o := ks.org
	oa := o.oa
	oa.fmu.Lock()
	in := oa.files[*w.InputFileID]
	oa.fmu.Unlock()
	if in == nil {
		s.oaWriteError(c, &oaError{status: http.StatusNotFound, typ: openai.ErrInvalidRequest, msg: "No such File object: " + *w.InputFileID, param: "input_file_id"})
		return
	}
	if in.purpose != openai.PurposeBatch {
		s.oaWriteError(c, oaInvalid("input_file_id", "invalid_value", "The input file %s must have purpose 'batch', not '%s'.", in.id, in.purpose))
		return
	}
	var meta []byte
	if m := bytes.TrimSpace(w.Metadata); len(m) > 0 && !bytes.Equal(m, []byte("null")) {
		var kv map[string]string
		if json.Unmarshal(m, &kv) != nil || len(kv) > 16 {
			s.oaWriteError(c, oaInvalid("metadata", "invalid_type", "Invalid 'metadata': expected an object of at most 16 string values."))
			return
		}
		meta = append([]byte(nil), m...)
	}
	ob := s.orgBatches(o)
	now := s.apiNow()
	fs := s.faults.Load()
	if f := fs.match(FaultSpendCap, o.idx, "", ks.fp, now, &c.rng); f != nil && o.costNanos.Load() >= f.capNanos {
		// An org out of quota creates no batch: the billing 429.
		s.oaWriteError(c, insufficientQuota)
		return
	}
	b := &oaBatch{
		endpoint: *w.Endpoint, window: *w.CompletionWindow, seq: s.batches.seq.Add(1), ks: ks, input: in, metadata: meta,
		created: now, wall0: s.start.Add(s.real(now)), validEnd: now + oaValidateTime,
		rate: float64(ob.lim.PerMinute) / 60, expires: now + batchExpiry, cancelD: seconds(ob.lim.CancelS), cancelAt: -1,
	}
	b.id = "batch_" + s.newID("", b.seq, saltOABatch)
	b.items, b.model, b.errs = parseBatchInput(in.data, b.endpoint)
	if b.errs == nil {
		if _, served := o.pools[b.model.pool()]; !served {
			b.errs = append(appendLineError([]byte{'['}, "model_not_found", fmt.Sprintf("The model '%s' does not exist or you do not have access to it.", b.model.id), "body.model", 1), ']')
		}
	}
	if f := fs.match(FaultBatchStall, o.idx, "", ks.fp, now, &c.rng); f != nil {
		b.stallAt = int(f.Fraction * float64(len(b.items)))
	} else {
		b.stallAt = len(b.items)
	}
	if f := fs.match(FaultBatchNotFound, o.idx, "", ks.fp, now, &c.rng); f != nil {
		wd := f.Window
		if wd <= 0 {
			wd = 60 * time.Second
		}
		b.hidden = now + wd
	}
	for _, it := range b.items {
		b.tokens += it.req.prompt
	}
	oa.mu.Lock()
	if b.errs == nil {
		queued := oa.queuedTokens(b.model, now)
		if lim := oa.queueCap[b.model.id]; queued+b.tokens > lim {
			b.errs = append(appendLineError([]byte{'['}, openai.CodeTokenLimitExceeded,
				fmt.Sprintf("Enqueued token limit reached for %s in organization %s. Limit: %s enqueued tokens. Please try again once some in_progress batches have been completed.", b.model.id, o.id, numfmt.Commas(lim)), "", 0), ']')
		}
	}
	if b.errs == nil {
		b.start = max(b.validEnd, oa.busy)
		b.procEnd = b.naturalEnd()
		oa.busy = b.procEnd
	} else {
		b.start, b.procEnd = b.validEnd, b.validEnd
	}
	oa.batches = append(oa.batches, b)
	oa.batchBy[b.id] = b
	oa.mu.Unlock()

	// The batch exists; the answer may still be lost.
	if fs.match(FaultBatchCreateLost500, o.idx, "", ks.fp, now, &c.rng) != nil {
		s.oaWriteError(c, &oaError{status: http.StatusInternalServerError, typ: openai.ErrServer, msg: "The server had an error while processing your request. Sorry about that!"})
		return
	}
	if fs.match(FaultBatchCreateLostReset, o.idx, "", ks.fp, now, &c.rng) != nil {
		hijackAndClose(c.call, nil, 0)
		return
	}
	s.oaWriteBatch(c, b, now)
}

// naturalEnd is when processing ends without a cancel: after the last
// request, or never (a stall) — then expiry stops it.
func (b *oaBatch) naturalEnd() time.Duration {
	if b.stallAt < len(b.items) {
		return b.expires + time.Nanosecond
	}
	return b.procTime(len(b.items) - 1)
}

// queuedTokens is the prompt tokens of the org's batches for m not yet
// processed at API time now. oa.mu is held.
func (oa *oaOrg) queuedTokens(m *oaModel, now time.Duration) int64 {
	var q int64
	for _, b := range oa.batches {
		if b.model != m || b.errs != nil {
			continue
		}
		b.mu.Lock()
		if now < min(b.procEnd, b.expires) {
			done := b.processedAt(now)
			for k := done; k < len(b.items); k++ {
				q += b.items[k].req.prompt
			}
		}
		b.mu.Unlock()
	}
	return q
}

// oaFind returns the org's batch id visible at API time now, or answers
// 404 and returns nil.
func (s *Server) oaFind(c *oaCall, id string, now time.Duration) *oaBatch {
	oa := c.ks.org.oa
	oa.mu.Lock()
	b := oa.batchBy[id]
	oa.mu.Unlock()
	if b == nil || now < b.hidden {
		s.oaWriteError(c, &oaError{status: http.StatusNotFound, typ: openai.ErrInvalidRequest, msg: "No batch found with id '" + id + "'.", param: "batch_id"})
		return nil
	}
	return b
}

func (s *Server) oaRetrieveBatch(c *oaCall, id string) {
	now := s.apiNow()
	b := s.oaFind(c, id, now)
	if b == nil {
		return
	}
	if s.faults.Load().match(FaultBatchPoll404, c.ks.org.idx, "", c.ks.fp, now, &c.rng) != nil {
		s.oaWriteError(c, &oaError{status: http.StatusNotFound, typ: openai.ErrInvalidRequest, msg: "No batch found with id '" + id + "'.", param: "batch_id"})
		return
	}
	s.oaWriteBatch(c, b, now)
}

func (s *Server) oaCancelBatch(c *oaCall, id string) {
	now := s.apiNow()
	b := s.oaFind(c, id, now)
	if b == nil {
		return
	}
	oa := c.ks.org.oa
	oa.mu.Lock()
	b.mu.Lock()
	st, _ := b.status(now)
	ok := st == openai.BatchValidating || st == openai.BatchInProgress
	if ok {
		old := b.procEnd
		b.cancelAt = now
		b.procEnd = min(b.procEnd, now)
		if b.errs != nil || now < b.validEnd {
			b.errs = nil // a batch cancelled while validating never fails
			b.start = max(b.start, now)
		}
		if oa.busy == old {
			oa.busy = max(now, b.procEnd)
		}
	}
	b.mu.Unlock()
	oa.mu.Unlock()
	if !ok {
		s.oaWriteError(c, oaInvalid("", "", "Cannot cancel a batch with status '%s'.", st))
		return
	}
	s.oaWriteBatch(c, b, now)
}

// oaListBatches serves GET /v1/batches: newest first, after and limit
// (1–100, default 20).
func (s *Server) oaListBatches(c *oaCall) {
	q := c.r.URL.Query()
	limit, aerr := oaLimit(q.Get("limit"), 20, 100)
	if aerr != nil {
		s.oaWriteError(c, aerr)
		return
	}
	now := s.apiNow()
	oa := c.ks.org.oa
	oa.mu.Lock()
	var all []*oaBatch
	for i := len(oa.batches) - 1; i >= 0; i-- {
		if now >= oa.batches[i].hidden {
			all = append(all, oa.batches[i])
		}
	}
	oa.mu.Unlock()
	page, more, ok := oaPage(all, q.Get("after"), limit, func(b *oaBatch) string { return b.id })
	if !ok {
		s.oaWriteError(c, oaInvalid("after", "invalid_value", "Invalid 'after': no batch %q", q.Get("after")))
		return
	}
	out := []byte(`{"object":"list","data":[`)
	for i, b := range page {
		if i > 0 {
			out = append(out, ',')
		}
		b.mu.Lock()
		s.oaFinalize(b, now)
		out = s.appendOABatch(out, b, now)
		b.mu.Unlock()
	}
	s.oaWriteJSON(c, http.StatusOK, appendListTail(out, page, more, func(b *oaBatch) string { return b.id }))
}

func (s *Server) oaWriteBatch(c *oaCall, b *oaBatch, now time.Duration) {
	b.mu.Lock()
	s.oaFinalize(b, now)
	out := s.appendOABatch(nil, b, now)
	b.mu.Unlock()
	s.oaWriteJSON(c, http.StatusOK, out)
}

// unix is the Unix time of API time t on b's clock.
func (s *Server) unix(b *oaBatch, t time.Duration) int64 {
	return b.wall0.Add(s.real(t - b.created)).Unix()
}

// appendOABatch appends b's batch object at API time now. b.mu is held
// and b is finalized when ended.
func (s *Server) appendOABatch(buf []byte, b *oaBatch, now time.Duration) []byte {
	st, _ := b.status(now)
	ts := func(buf []byte, key string, set bool, t time.Duration) []byte {
		buf = append(buf, `,"`...)
		buf = append(buf, key...)
		buf = append(buf, `":`...)
		if !set {
			return append(buf, "null"...)
		}
		return strconv.AppendInt(buf, s.unix(b, t), 10)
	}
	buf = append(buf, `{"id":`...)
	buf = appendJSONString(buf, b.id)
	buf = append(buf, `,"object":"batch","endpoint":`...)
	buf = appendJSONString(buf, b.endpoint)
	buf = append(buf, `,"errors":`...)
	if st == openai.BatchFailed {
		buf = append(buf, `{"object":"list","data":`...)
		buf = append(buf, b.errs...)
		buf = append(buf, '}')
	} else {
		buf = append(buf, "null"...)
	}
	buf = append(buf, `,"input_file_id":`...)
	buf = appendJSONString(buf, b.input.id)
	buf = append(buf, `,"completion_window":`...)
	buf = appendJSONString(buf, b.window)
	buf = append(buf, `,"status":`...)
	buf = appendJSONString(buf, st)
	buf = append(buf, `,"output_file_id":`...)
	if b.outFile != nil {
		buf = appendJSONString(buf, b.outFile.id)
	} else {
		buf = append(buf, "null"...)
	}
	buf = append(buf, `,"error_file_id":`...)
	if b.errFile != nil {
		buf = appendJSONString(buf, b.errFile.id)
	} else {
		buf = append(buf, "null"...)
	}
	buf = append(buf, `,"created_at":`...)
	buf = strconv.AppendInt(buf, s.unix(b, b.created), 10)
	ran := b.errs == nil && now >= b.start && b.start < b.expires && (b.cancelAt < 0 || b.cancelAt > b.start)
	buf = ts(buf, "in_progress_at", ran, b.start)
	buf = ts(buf, "expires_at", true, b.expires)
	fin := st == openai.BatchFinalizing || st == openai.BatchCompleted
	buf = ts(buf, "finalizing_at", fin, b.procEnd)
	buf = ts(buf, "completed_at", st == openai.BatchCompleted, b.procEnd+oaFinalizeTime)
	buf = ts(buf, "failed_at", st == openai.BatchFailed, b.validEnd)
	buf = ts(buf, "expired_at", st == openai.BatchExpired, b.expires)
	buf = ts(buf, "cancelling_at", b.cancelAt >= 0, b.cancelAt)
	buf = ts(buf, "cancelled_at", st == openai.BatchCancelled, b.cancelAt+b.cancelD)
	var done, failed int64
	if b.final {
		for _, oc := range b.outcomes {
			if oc == oaOK {
				done++
			} else {
				failed++
			}
		}
	} else if b.errs == nil {
		p := b.processedAt(min(now, b.procEnd))
		for k := range p {
			if b.items[k].perr == nil {
				done++
			} else {
				failed++
			}
		}
	}
	total := int64(len(b.items))
	buf = append(buf, `,"request_counts":{"total":`...)
	buf = strconv.AppendInt(buf, total, 10)
	buf = append(buf, `,"completed":`...)
	buf = strconv.AppendInt(buf, done, 10)
	buf = append(buf, `,"failed":`...)
	buf = strconv.AppendInt(buf, failed, 10)
	buf = append(buf, `},"model":`...)
	if b.model != nil {
		buf = appendJSONString(buf, b.model.snapshot)
	} else {
		buf = append(buf, "null"...)
	}
	u := b.usage
	buf = append(buf, `,"usage":{"input_tokens":`...)
	buf = strconv.AppendInt(buf, u.prompt, 10)
	buf = append(buf, `,"input_tokens_details":{"cached_tokens":`...)
	buf = strconv.AppendInt(buf, u.cached, 10)
	buf = append(buf, `},"output_tokens":`...)
	buf = strconv.AppendInt(buf, u.completion, 10)
	buf = append(buf, `,"output_tokens_details":{"reasoning_tokens":`...)
	buf = strconv.AppendInt(buf, u.reasoning, 10)
	buf = append(buf, `},"total_tokens":`...)
	buf = strconv.AppendInt(buf, u.prompt+u.completion, 10)
	buf = append(buf, `},"metadata":`...)
	if b.metadata != nil {
		buf = append(buf, b.metadata...)
	} else {
		buf = append(buf, "null"...)
	}
	return append(buf, '}')
}

// oaFinalize fixes the outcome of every request of a batch that has ended
// at API time now, writes its output and error files and bills its
// succeeded requests at half price, once. b.mu is held.
func (s *Server) oaFinalize(b *oaBatch, now time.Duration) {
	if b.final {
		return
	}
	st, _ := b.status(now)
	if !openai.BatchTerminal(st) {
		return
	}
	b.final = true
	if st == openai.BatchFailed {
		return
	}
	ks := b.ks
	o := ks.org
	fs := s.faults.Load()
	end := min(b.procEnd, b.expires)
	done := b.processedAt(end)
	rest := oaExpired
	if st == openai.BatchCancelled {
		rest = oaCanceled
	}
	b.outcomes = make([]oaOutcome, len(b.items))
	wall := time.Now()
	real := wall.Sub(s.start)
	var out, errs []byte
	for k := range b.items {
		it := &b.items[k]
		key := b.seq*1_000_003 + uint64(k)
		lineID := "batch_req_" + s.newID("", key, saltOABatchLineID)
		rid := s.newID("req_", key, saltOABatchReq)
		line := func(dst []byte, status int, body []byte) []byte {
			dst = append(dst, `{"id":`...)
			dst = appendJSONString(dst, lineID)
			dst = append(dst, `,"custom_id":`...)
			dst = appendJSONString(dst, it.cid)
			dst = append(dst, `,"response":{"status_code":`...)
			dst = strconv.AppendInt(dst, int64(status), 10)
			dst = append(dst, `,"request_id":`...)
			dst = appendJSONString(dst, rid)
			dst = append(dst, `,"body":`...)
			dst = append(dst, body...)
			return append(dst, "},\"error\":null}\n"...)
		}
		switch {
		case k >= done:
			b.outcomes[k] = rest
			code, msg := openai.CodeBatchExpired, "This request could not be executed before the completion window expired."
			if rest == oaCanceled {
				code, msg = openai.CodeBatchCancelled, "This request was not executed because the batch was cancelled."
			}
			errs = append(errs, `{"id":`...)
			errs = appendJSONString(errs, lineID)
			errs = append(errs, `,"custom_id":`...)
			errs = appendJSONString(errs, it.cid)
			errs = append(errs, `,"response":null,"error":{"code":`...)
			errs = appendJSONString(errs, code)
			errs = append(errs, `,"message":`...)
			errs = appendJSONString(errs, msg)
			errs = append(errs, "}}\n"...)
			continue
		case it.perr != nil:
			b.outcomes[k] = oaBad
			errs = line(errs, it.perr.status, it.perr.appendJSON(nil))
			continue
		}
		at := b.procTime(k)
		r := rng{s: s.seed ^ mix64(key^saltBatchErr)}
		pool := b.model.pool()
		if fs.match(FaultBatchErroredAPI, o.idx, pool, ks.fp, at, &r) != nil ||
			fs.match(FaultBatchErroredOverloaded, o.idx, pool, ks.fp, at, &r) != nil ||
			fs.match(FaultBatchErroredInvalid, o.idx, pool, ks.fp, at, &r) != nil {
			b.outcomes[k] = oaFault
			e := &oaError{status: http.StatusInternalServerError, typ: openai.ErrServer, msg: "The server had an error while processing your request. Sorry about that!"}
			errs = line(errs, e.status, e.appendJSON(nil))
			continue
		}
		b.outcomes[k] = oaOK
		sum := sha256.Sum256(withoutStreamKeys(it.body))
		cs, completion, reasoning := planChoices(sum, &it.req)
		u := oaUsage{prompt: it.req.prompt, completion: completion, reasoning: reasoning}
		id := "chatcmpl-" + s.newID("", key, saltOABatchCmpl)
		created := s.unix(b, at)
		out = line(out, http.StatusOK, appendCompletion(nil, id, created, &it.req, cs, u))
		b.usage.prompt += u.prompt
		b.usage.completion += u.completion
		b.usage.reasoning += u.reasoning
		cost := b.model.cost(u.prompt, 0, u.completion, "batch")
		s.recordBatch(o, ks, &LedgerEntry{
			RequestID: rid, MessageID: id, Org: o.name, KeyFingerprint: ks.fp, Model: it.req.echo, BodySHA256: sum,
			InputTokens: u.prompt, OutputTokens: u.completion, ReasoningTokens: u.reasoning, CostNanos: cost, CostUSD: nanosToUSD(cost),
			Time: wall, APISeconds: float64(at.Microseconds()) / 1e6, Status: http.StatusOK, Delivery: DeliveryOK,
			ServiceTier: "batch", BatchID: b.id, CustomID: it.cid, Provider: ProviderOpenAI,
		}, real)
	}
	oa := o.oa
	mk := func(data []byte, salt uint64, suffix string) *oaFile {
		f := &oaFile{id: s.oaNewFileID(b.seq ^ salt), filename: b.id + suffix, purpose: openai.PurposeBatchOutput, data: data,
			created: wall.Unix(), expires: wall.Add(s.real(oaFileRetention)).Unix(), results: true}
		oa.addFile(f)
		return f
	}
	if len(out) > 0 {
		b.outFile = mk(out, 0x6a09e667f3bcc908, "_output.jsonl")
	}
	if len(errs) > 0 {
		b.errFile = mk(errs, 0xbb67ae8584caa73b, "_error.jsonl")
	}
}

// oaSettleBatches finalizes (and so bills) every OpenAI batch that has
// ended, so that the ledger counts a batch when it ends.
func (s *Server) oaSettleBatches() {
	now := s.apiNow()
	for _, o := range s.orgs {
		if o.oa == nil {
			continue
		}
		o.oa.mu.Lock()
		list := append([]*oaBatch(nil), o.oa.batches...)
		o.oa.mu.Unlock()
		for _, b := range list {
			b.mu.Lock()
			s.oaFinalize(b, now)
			b.mu.Unlock()
		}
	}
}
