package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/anthropic"
	"github.com/apidispatch/apidispatch/internal/numfmt"
)

// Salts of the ids derived from (batch, request index).
const (
	saltBatchID  = 0x6a09e667f3bcc908
	saltBatchMsg = 0xbb67ae8584caa73b
	saltBatchReq = 0x3c6ef372fe94f82b ^ 0xa54ff53a5f1d36f1
	saltBatchErr = 0x510e527fade682d1
)

// itemKey numbers request k of b for ids and draws.
func itemKey(b *simBatch, k int) uint64 { return b.seq*1_000_003 + uint64(k) }

// batchRoute serves /v1/messages/batches and everything under it. Every
// call is authenticated and charged to the org's batch RPM bucket, which is
// its own: batch calls never touch the Messages buckets.
func (s *Server) batchRoute(c *call) {
	ks := s.authenticate(c)
	if ks == nil {
		return
	}
	o := ks.org
	ob := s.orgBatches(o)
	if ob.rpm == nil {
		ob.mu.Lock()
		ob.countCall(s.apiNow(), false)
		ob.mu.Unlock()
	}
	if ob.rpm != nil {
		refused, wait, view := ob.rpm.admit(time.Since(s.start), load{}, 0, 0)
		ob.mu.Lock()
		ob.countCall(s.apiNow(), refused != dimNone)
		ob.mu.Unlock()
		if refused != dimNone {
			s.rateHeaders(c.h, view)
			s.rateLimited(c, o, true, wait, fmt.Sprintf("This request would exceed your organization's rate limit of %s requests per minute for the Message Batches API (org: %s). For details, refer to: https://docs.claude.com/en/api/rate-limits. Please reduce the rate of requests, or try again later.", numfmt.Commas(ob.lim.RPM), o.id))
			return
		}
	}
	method := c.r.Method
	notAllowed := func(use string) {
		s.writeError(c, o, &apiError{status: http.StatusMethodNotAllowed, typ: anthropic.ErrInvalidRequest, msg: "Method Not Allowed: use " + use})
	}
	rest := strings.TrimPrefix(c.r.URL.Path, "/v1/messages/batches")
	if rest == "" || rest == "/" {
		switch method {
		case http.MethodPost:
			s.createBatch(c, ks, ob)
		case http.MethodGet:
			s.listBatches(c, o, ob)
		default:
			notAllowed("POST or GET")
		}
		return
	}
	id, action, _ := strings.Cut(rest[1:], "/")
	switch {
	case action == "" && method == http.MethodGet:
		s.retrieveBatch(c, o, ob, id)
	case action == "" && method == http.MethodDelete:
		s.deleteBatch(c, o, ob, id)
	case action == "cancel" && method == http.MethodPost:
		s.cancelBatch(c, o, ob, id)
	case action == "results" && method == http.MethodGet:
		s.batchResults(c, ks, ob, id)
	case action == "":
		notAllowed("GET or DELETE")
	case action == "cancel":
		notAllowed("POST")
	case action == "results":
		notAllowed("GET")
	default:
		s.writeError(c, o, &apiError{status: http.StatusNotFound, typ: anthropic.ErrNotFound, msg: "Not Found"})
	}
}

// readBatchBody reads a create body up to MaxBatchBodyBytes (413 above),
// into a buffer of its announced length, which becomes the batch's arena.
func (s *Server) readBatchBody(c *call, o *orgState) ([]byte, bool) {
	tooLarge := &apiError{status: http.StatusRequestEntityTooLarge, typ: anthropic.ErrRequestTooLarge, msg: "Request exceeds the maximum allowed number of bytes."}
	if c.r.ContentLength > MaxBatchBodyBytes {
		s.writeError(c, o, tooLarge)
		return nil, false
	}
	hint := int64(4096)
	if c.r.ContentLength > 0 {
		hint = c.r.ContentLength
	}
	buf := bytes.NewBuffer(make([]byte, 0, hint+bytes.MinRead))
	n, err := buf.ReadFrom(io.LimitReader(c.r.Body, MaxBatchBodyBytes+1))
	if n > MaxBatchBodyBytes {
		s.writeError(c, o, tooLarge)
		return nil, false
	}
	if err != nil {
		s.writeError(c, o, invalid("could not read the request body: %v", err))
		return nil, false
	}
	return buf.Bytes(), true
}

// parseBatchCreate validates a create body, {"requests":[{"custom_id":…,
// "params":{…}}, …]}, as the API does at create: 1–100,000 requests, each
// custom_id matching ^[a-zA-Z0-9_-]{1,64}$ and unique, each params an
// object (its content is validated later, when it is processed). It returns
// the arena (body itself on the fast path, a compact copy otherwise) and
// the items as spans of it.
func parseBatchCreate(body []byte) ([]byte, []batchItem, *apiError) {
	arena, items, ok := fastParseBatch(body)
	if !ok {
		var aerr *apiError
		if arena, items, aerr = slowParseBatch(body); aerr != nil {
			return nil, nil, aerr
		}
	}
	if len(items) == 0 {
		return nil, nil, invalid("requests: List should have at least 1 item after validation, not 0")
	}
	if len(items) > MaxBatchRequests {
		return nil, nil, invalid("requests: List should have at most %d items after validation, not %d", MaxBatchRequests, len(items))
	}
	seen := make(map[string]int, len(items))
	for i, it := range items {
		cid := arena[it.cid.off:it.cid.end]
		if !validCustomID(cid) {
			return nil, nil, invalid("requests.%d.custom_id: String should match pattern '^[a-zA-Z0-9_-]{1,64}$'", i)
		}
		if j, dup := seen[string(cid)]; dup {
			return nil, nil, invalid("requests.%d.custom_id: custom_id %q is used by requests.%d too; custom_id values must be unique within a batch", i, cid, j)
		}
		seen[string(cid)] = i
	}
	return arena, items, nil
}

func validCustomID(b []byte) bool {
	if len(b) < 1 || len(b) > 64 {
		return false
	}
	for _, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// fastParseBatch scans the common shape without copying: plain custom_ids
// and params that the scanner handles. Anything else reports false and the
// slow path decides.
func fastParseBatch(body []byte) ([]byte, []batchItem, bool) {
	if len(body) > 1<<32-1 {
		return nil, nil, false
	}
	s := &jsonScanner{b: body}
	var items []batchItem
	seen := false
	ok := s.object(func(key string) bool {
		if key != "requests" {
			return false
		}
		seen = true
		return s.array(func() bool {
			var it batchItem
			var hasCID, hasParams bool
			ok := s.object(func(key string) bool {
				switch key {
				case "custom_id":
					raw, plain, ok := s.str()
					if !ok || !plain {
						return false
					}
					end := s.i - 1
					it.cid = span{uint32(end - (len(raw) - 2)), uint32(end)}
					hasCID = true
					return true
				case "params":
					raw, ok := s.value()
					if !ok || raw[0] != '{' {
						return false
					}
					it.params = span{uint32(s.i - len(raw)), uint32(s.i)}
					hasParams = true
					return true
				}
				return false
			})
			items = append(items, it)
			return ok && hasCID && hasParams
		})
	})
	return body, items, ok && seen && s.peek() == 0 && s.i == len(body)
}

// slowParseBatch decodes with encoding/json, words the errors, and copies
// custom_ids and params into a fresh arena.
func slowParseBatch(body []byte) ([]byte, []batchItem, *apiError) {
	var w struct {
		Requests *[]struct {
			CustomID *string         `json:"custom_id"`
			Params   json.RawMessage `json:"params"`
		} `json:"requests"`
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(&w); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &te) && te.Field != "":
			return nil, nil, invalid("%s: Input should be a valid %s", te.Field, jsonKind(te.Type.Kind().String()))
		case errors.As(err, &te), errors.As(err, &se), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return nil, nil, invalid("There was an error parsing the body of your request: invalid JSON")
		}
		// An unknown field: encoding/json names it in its message.
		return nil, nil, invalid("%s: Extra inputs are not permitted", strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	if rest := bytes.TrimSpace(body[d.InputOffset():]); len(rest) > 0 {
		return nil, nil, invalid("There was an error parsing the body of your request: unexpected data after the JSON object")
	}
	if w.Requests == nil {
		return nil, nil, invalid("requests: Field required")
	}
	reqs := *w.Requests
	if len(reqs) > MaxBatchRequests {
		return nil, nil, invalid("requests: List should have at most %d items after validation, not %d", MaxBatchRequests, len(reqs))
	}
	size := 0
	for _, r := range reqs {
		if r.CustomID != nil {
			size += len(*r.CustomID)
		}
		size += len(r.Params)
	}
	arena := make([]byte, 0, size)
	items := make([]batchItem, len(reqs))
	for i, r := range reqs {
		if r.CustomID == nil {
			return nil, nil, invalid("requests.%d.custom_id: Field required", i)
		}
		p := bytes.TrimSpace(r.Params)
		if len(p) == 0 || bytes.Equal(p, []byte("null")) {
			return nil, nil, invalid("requests.%d.params: Field required", i)
		}
		if p[0] != '{' {
			return nil, nil, invalid("requests.%d.params: Input should be a valid dictionary", i)
		}
		items[i].cid = span{uint32(len(arena)), 0}
		arena = append(arena, *r.CustomID...)
		items[i].cid.end = uint32(len(arena))
		items[i].params = span{uint32(len(arena)), 0}
		arena = append(arena, p...)
		items[i].params.end = uint32(len(arena))
	}
	return arena, items, nil
}

func (s *Server) createBatch(c *call, ks *keyState, ob *orgBatches) {
	o := ks.org
	body, ok := s.readBatchBody(c, o)
	if !ok {
		return
	}
	arena, items, aerr := parseBatchCreate(body)
	if aerr != nil {
		s.writeError(c, o, aerr)
		return
	}
	n := len(items)
	now := s.apiNow()
	fs := s.faults.Load()
	b := &simBatch{
		seq:      s.batches.seq.Add(1),
		ks:       ks,
		beta:     strings.Contains(c.r.Header.Get("Anthropic-Beta"), "context-1m"),
		arena:    arena,
		items:    items,
		created:  now,
		wall0:    s.start.Add(s.real(now)),
		rate:     float64(ob.lim.PerMinute) / 60,
		stallAt:  n,
		expires:  now + batchExpiry,
		archive:  now + seconds(ob.lim.RetentionS),
		cancelD:  seconds(ob.lim.CancelS),
		cancelAt: -1,
	}
	b.id = "msgbatch_" + s.newID("", b.seq, saltBatchID)
	if f := fs.match(FaultBatchStall, o.idx, "", ks.fp, now, &c.rng); f != nil {
		b.stallAt = int(f.Fraction * float64(n))
	}
	if f := fs.match(FaultBatchNotFound, o.idx, "", ks.fp, now, &c.rng); f != nil {
		w := f.Window
		if w <= 0 {
			w = 60 * time.Second
		}
		b.hidden = now + w
	}

	ob.mu.Lock()
	queued := ob.queuedLocked(now)
	if queued+int64(n) > ob.lim.Queue {
		ob.refused++
		ob.mu.Unlock()
		// The queue drains at the org's throughput: wait for the excess.
		excess := queued + int64(n) - ob.lim.Queue
		wait := s.real(time.Duration(float64(excess) / b.rate * float64(time.Second)))
		s.rateLimited(c, o, true, wait, fmt.Sprintf("Number of batch requests in the processing queue would exceed your organization's limit of %s requests (org: %s): %s are queued and this batch has %s. For details, refer to: https://docs.claude.com/en/api/rate-limits.",
			numfmt.Commas(ob.lim.Queue), o.id, numfmt.Commas(queued), numfmt.Commas(int64(n))))
		return
	}
	b.start = max(now+seconds(ob.lim.QueueWaitS), ob.busyUntil)
	b.end = b.naturalEnd()
	ob.busyUntil = b.end
	ob.list = append(ob.list, b)
	ob.created++
	ob.requests += int64(n)
	ob.maxQueued = max(ob.maxQueued, queued+int64(n))
	ob.byID[b.id] = b
	ob.seqOf[b.id] = b.seq
	ob.mu.Unlock()

	// The batch exists; the answer may still be lost.
	if fs.match(FaultBatchCreateLost500, o.idx, "", ks.fp, now, &c.rng) != nil {
		s.writeError(c, o, &apiError{status: http.StatusInternalServerError, typ: anthropic.ErrAPI, msg: "Internal server error"})
		return
	}
	if fs.match(FaultBatchCreateLostReset, o.idx, "", ks.fp, now, &c.rng) != nil {
		hijackAndClose(c, nil, 0)
		return
	}
	s.writeBatch(c, b, now)
}

// writeBatch answers 200 with b's object at API time now, finalizing it
// first if it has ended.
func (s *Server) writeBatch(c *call, b *simBatch, now time.Duration) {
	b.mu.Lock()
	if now >= b.end {
		s.finalizeBatch(b)
	}
	out := s.appendBatch(make([]byte, 0, 640), b, now, c.r.Host)
	b.mu.Unlock()
	writeJSON(c, http.StatusOK, out)
}

// findBatch returns the org's batch id, visible at API time now, or answers
// 404 and returns nil.
func (s *Server) findBatch(c *call, o *orgState, ob *orgBatches, id string, now time.Duration) *simBatch {
	ob.mu.Lock()
	b := ob.byID[id]
	ob.mu.Unlock()
	if b == nil || now < b.hidden {
		s.writeError(c, o, &apiError{status: http.StatusNotFound, typ: anthropic.ErrNotFound, msg: "message_batch " + strconv.Quote(id) + " not found"})
		return nil
	}
	return b
}

func (s *Server) retrieveBatch(c *call, o *orgState, ob *orgBatches, id string) {
	now := s.apiNow()
	b := s.findBatch(c, o, ob, id, now)
	if b == nil {
		return
	}
	if s.faults.Load().match(FaultBatchPoll404, o.idx, "", b.ks.fp, now, &c.rng) != nil {
		s.writeError(c, o, &apiError{status: http.StatusNotFound, typ: anthropic.ErrNotFound, msg: "message_batch " + strconv.Quote(id) + " not found"})
		return
	}
	s.writeBatch(c, b, now)
}

func (s *Server) cancelBatch(c *call, o *orgState, ob *orgBatches, id string) {
	now := s.apiNow()
	b := s.findBatch(c, o, ob, id, now)
	if b == nil {
		return
	}
	ob.mu.Lock()
	b.mu.Lock()
	ended := now >= b.end
	if !ended && b.cancelAt < 0 {
		old := b.end
		b.cancelAt = now
		b.end = min(b.end, now+b.cancelD)
		if ob.busyUntil == old {
			ob.busyUntil = b.end // the org's next batch need not wait for it
		}
	}
	b.mu.Unlock()
	ob.mu.Unlock()
	if ended {
		s.writeError(c, o, invalid("message_batch %s has already ended and cannot be canceled", id))
		return
	}
	s.writeBatch(c, b, now)
}

func (s *Server) deleteBatch(c *call, o *orgState, ob *orgBatches, id string) {
	now := s.apiNow()
	b := s.findBatch(c, o, ob, id, now)
	if b == nil {
		return
	}
	ob.mu.Lock()
	b.mu.Lock()
	ended := now >= b.end
	if ended {
		s.finalizeBatch(b) // bill before the batch goes
	}
	b.mu.Unlock()
	if ended && ob.byID[id] == b {
		delete(ob.byID, id)
		for i, x := range ob.list {
			if x == b {
				ob.list = append(ob.list[:i], ob.list[i+1:]...)
				break
			}
		}
	}
	ob.mu.Unlock()
	if !ended {
		s.writeError(c, o, invalid("message_batch %s cannot be deleted while it is processing; cancel it first", id))
		return
	}
	out := append([]byte(`{"id":`), appendJSONString(nil, id)...)
	writeJSON(c, http.StatusOK, append(out, `,"type":"message_batch_deleted"}`...))
}

// listBatches serves GET /v1/messages/batches: newest first, limit 1–1000
// (default 20), after_id (older than) or before_id (newer than).
func (s *Server) listBatches(c *call, o *orgState, ob *orgBatches) {
	q := c.r.URL.Query()
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			s.writeError(c, o, invalid("limit: Input should be an integer between 1 and 1000"))
			return
		}
		limit = n
	}
	after, before := q.Get("after_id"), q.Get("before_id")
	if after != "" && before != "" {
		s.writeError(c, o, invalid("after_id and before_id cannot both be given"))
		return
	}
	now := s.apiNow()
	ob.mu.Lock()
	var cursor uint64
	for _, p := range [...][2]string{{"after_id", after}, {"before_id", before}} {
		if p[1] == "" {
			continue
		}
		var known bool
		if cursor, known = ob.seqOf[p[1]]; !known {
			ob.mu.Unlock()
			s.writeError(c, o, invalid("%s: no message_batch %q", p[0], p[1]))
			return
		}
	}
	// visible is newest first; page is a window of it.
	var visible []*simBatch
	for i := len(ob.list) - 1; i >= 0; i-- {
		if b := ob.list[i]; now >= b.hidden {
			visible = append(visible, b)
		}
	}
	ob.mu.Unlock()
	var page []*simBatch
	hasMore := false
	switch {
	case after != "":
		i := 0
		for i < len(visible) && visible[i].seq >= cursor {
			i++
		}
		rest := visible[i:]
		page, hasMore = rest[:min(limit, len(rest))], len(rest) > limit
	case before != "":
		j := len(visible)
		for j > 0 && visible[j-1].seq <= cursor {
			j--
		}
		newer := visible[:j] // the nearest to the cursor are last
		page, hasMore = newer[max(0, j-limit):], j > limit
	default:
		page, hasMore = visible[:min(limit, len(visible))], len(visible) > limit
	}
	out := make([]byte, 0, 64+len(page)*640)
	out = append(out, `{"data":[`...)
	for i, b := range page {
		if i > 0 {
			out = append(out, ',')
		}
		b.mu.Lock()
		if now >= b.end {
			s.finalizeBatch(b)
		}
		out = s.appendBatch(out, b, now, c.r.Host)
		b.mu.Unlock()
	}
	out = append(out, `],"has_more":`...)
	out = strconv.AppendBool(out, hasMore)
	out = append(out, `,"first_id":`...)
	if len(page) > 0 {
		out = appendJSONString(out, page[0].id)
	} else {
		out = append(out, "null"...)
	}
	out = append(out, `,"last_id":`...)
	if len(page) > 0 {
		out = appendJSONString(out, page[len(page)-1].id)
	} else {
		out = append(out, "null"...)
	}
	writeJSON(c, http.StatusOK, append(out, '}'))
}

// batchAdmin serves GET /sim/batches: BatchStats by org name (JSON). Like
// the other /sim routes it needs no key.
func (s *Server) batchAdmin(c *call) {
	if c.r.Method != http.MethodGet {
		s.writeError(c, nil, &apiError{status: http.StatusMethodNotAllowed, typ: anthropic.ErrInvalidRequest, msg: "use GET"})
		return
	}
	b, _ := json.Marshal(struct {
		Orgs map[string]BatchStats `json:"orgs"`
	}{s.BatchStats()})
	writeJSON(c, http.StatusOK, b)
}

// resultStride orders results: request (j·stride) mod n comes j-th, a
// permutation because the stride is a prime above MaxBatchRequests.
const resultStride = 100_003

// batchResults streams the JSONL results of an ended batch, one line per
// request in no particular order, generated from the params as they go.
func (s *Server) batchResults(c *call, ks *keyState, ob *orgBatches, id string) {
	o := ks.org
	now := s.apiNow()
	b := s.findBatch(c, o, ob, id, now)
	if b == nil {
		return
	}
	b.mu.Lock()
	ended := now >= b.end
	if ended {
		s.finalizeBatch(b)
	}
	b.mu.Unlock()
	switch {
	case !ended:
		s.writeError(c, o, invalid("message_batch %s is still processing; its results are available once processing_status is ended", id))
		return
	case now >= b.archive:
		s.writeError(c, o, &apiError{status: http.StatusNotFound, typ: anthropic.ErrNotFound, msg: "the results of message_batch " + id + " are no longer available (archived)"})
		return
	}
	n := len(b.items)
	lines := n
	cut := s.faults.Load().match(FaultBatchResultsCut, o.idx, "", ks.fp, now, &c.rng) != nil
	if cut {
		lines = n / 2
	}
	c.h[hContentType] = []string{"application/x-jsonl"}
	c.w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(c.w, 64<<10)
	var line, scratch []byte
	for j := range lines {
		k := int(uint64(j) * resultStride % uint64(n))
		line, scratch = s.appendResult(line[:0], scratch, b, k)
		if _, err := bw.Write(line); err != nil {
			return // the client went away
		}
	}
	bw.Flush()
	if cut {
		http.NewResponseController(c.w).Flush()
		panic(http.ErrAbortHandler) // the connection closes mid-stream
	}
}
