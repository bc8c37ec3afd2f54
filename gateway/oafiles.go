package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/apidispatch/apidispatch/openai"
	"github.com/apidispatch/apidispatch/rundir"
)

// The OpenAI Files API, as far as the Batch API needs it: a client
// uploads a batch input file (POST /v1/files, multipart, purpose
// "batch"), reads it back, deletes it, and reads its batches' output and
// error files. Files are on disk under StateDir/files, 0600, one record
// (<id>.json) and, for an upload, its content (<id>.jsonl) each; a
// batch's output and error files stay in the batch's directory and are
// only recorded here. A client sees its own files only: another's is not
// found (404), as an id that does not exist.
//
// Storage is bounded: an upload holds at most MaxFileBytes, and a client's
// files together (its uploads, and the output and error files of its
// batches) at most MaxClientFileBytes in at most MaxClientFiles files;
// past those an upload is refused until the client deletes some or they
// expire. A batch's output and error files are never refused (the batch
// has run and been billed): they may take a client past the bounds.
//
// Files expire as the API's do: an upload after its expires_after
// (anchor created_at, 3,600 s to 30 days), by default 30 days after its
// upload; a batch's output and error files after its create's
// output_expires_after, by default 30 days after they were written (all
// in API time: divided by the speed factor). An expired file is not found,
// and is removed when the store next meets it (a retrieve, a list, an
// upload, a start).

// Bounds of the files the gateway keeps.
const (
	MaxFileBytes       = openai.MaxBatchFileBytes // one upload (the API's own limit)
	MaxClientFileBytes = 2 << 30                  // a client's files together
	MaxClientFiles     = 1000                     // a client's files
	filesDir           = "files"
	// formOverhead bounds an upload's multipart framing and small fields.
	formOverhead = 1 << 20
	// The API's file expiry: expires_after's bounds, and the default of
	// a batch file (an upload of purpose batch, a batch's results).
	minFileExpiry     = time.Hour
	maxFileExpiry     = 30 * 24 * time.Hour
	defaultFileExpiry = maxFileExpiry
)

// fileDoc is a file's durable record.
type fileDoc struct {
	ID        string `json:"id"`
	Seq       int64  `json:"seq"` // orders lists (newest first)
	Client    string `json:"client"`
	Filename  string `json:"filename"`
	Purpose   string `json:"purpose"`
	Bytes     int64  `json:"bytes"`
	CreatedAt int64  `json:"created_at"` // Unix seconds
	// ExpiresAt is when the file expires, Unix nanoseconds (0: never, a
	// record of an older gateway).
	ExpiresAt int64 `json:"expires_at_ns,omitempty"`
	// Data is the content's path, relative to the state directory.
	Data string `json:"data"`
}

// expired says d has expired at now.
func (d *fileDoc) expired(now time.Time) bool {
	return d.ExpiresAt != 0 && now.UnixNano() >= d.ExpiresAt
}

// fileStore is the gateway's files.
type fileStore struct {
	state, dir string
	speed      float64 // the gateway's speed factor: expiries are in API time
	// The bounds (MaxFileBytes, MaxClientFileBytes, MaxClientFiles).
	maxFile, maxClientBytes, maxClientFiles int64

	mu   sync.Mutex
	byID map[string]*fileDoc
}

// openFileStore reads the records under stateDir/files. Uploads cut
// before they were recorded (their temporary files, or content without
// a record) are removed.
func openFileStore(stateDir string, speed float64) (*fileStore, error) {
	s := &fileStore{state: stateDir, speed: speed, dir: filepath.Join(stateDir, filesDir), byID: map[string]*fileDoc{},
		maxFile: MaxFileBytes, maxClientBytes: MaxClientFileBytes, maxClientFiles: MaxClientFiles}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("gateway: files: %w", err)
	}
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("gateway: files: %w", err)
	}
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.dir, name))
		if err != nil {
			return nil, fmt.Errorf("gateway: file %s: %w", name, err)
		}
		var d fileDoc
		if err := json.Unmarshal(b, &d); err != nil || d.ID+".json" != name {
			return nil, fmt.Errorf("gateway: file record %s is damaged: %v", filepath.Join(s.dir, name), err)
		}
		s.byID[d.ID] = &d
	}
	for _, e := range ents {
		name := e.Name()
		id, isData := strings.CutSuffix(name, ".jsonl")
		if strings.HasSuffix(name, ".tmp") || isData && s.byID[id] == nil {
			os.Remove(filepath.Join(s.dir, name))
		}
	}
	s.mu.Lock()
	err = s.expireLocked(time.Now())
	s.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("gateway: files: removing an expired file: %w", err)
	}
	return s, nil
}

// expiresAt is when a file made at now expires after d of API time.
func (s *fileStore) expiresAt(now time.Time, d time.Duration) int64 {
	return now.Add(time.Duration(float64(d) / s.speed)).UnixNano()
}

// expireLocked removes every file expired at now. s.mu is held.
func (s *fileStore) expireLocked(now time.Time) error {
	for _, d := range s.byID {
		if d.expired(now) {
			if err := s.removeLocked(d); err != nil {
				return err
			}
		}
	}
	return nil
}

// own returns client's file id (nil: none, another client's, or expired:
// then removed).
func (s *fileStore) own(client, id string) *fileDoc {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.byID[id]
	if d == nil || d.Client != client {
		return nil
	}
	if d.expired(time.Now()) {
		s.removeLocked(d) // not found either way; a failure is retried at the next meeting
		return nil
	}
	return d
}

// path is d's content on disk.
func (s *fileStore) path(d *fileDoc) string { return filepath.Join(s.state, d.Data) }

// errFileLimit: the client's uploads are at a bound.
var errFileLimit = errors.New("file storage limit")

// addUpload records the upload at tmp (size bytes) as a new file of
// client expiring after expiry (API time), unless its files would pass a
// bound.
func (s *fileStore) addUpload(client, filename, purpose, tmp string, size int64, expiry time.Duration) (*fileDoc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if err := s.expireLocked(now); err != nil {
		return nil, err
	}
	var n, total int64
	for _, d := range s.byID {
		if d.Client == client {
			n++
			total += d.Bytes
		}
	}
	if n+1 > s.maxClientFiles || total+size > s.maxClientBytes {
		return nil, fmt.Errorf("%w: this client's files (its uploads, and its batches' output and error files) hold %d files and %d bytes, and may hold at most %d files and %d bytes: delete files it no longer needs (DELETE /v1/files/{id})",
			errFileLimit, n, total, s.maxClientFiles, s.maxClientBytes)
	}
	id := "file-" + randomHex(12)
	d := &fileDoc{ID: id, Seq: now.UnixNano(), Client: client, Filename: filename, Purpose: purpose, Bytes: size,
		CreatedAt: now.Unix(), ExpiresAt: s.expiresAt(now, expiry), Data: filepath.Join(filesDir, id+".jsonl")}
	if err := os.Rename(tmp, s.path(d)); err != nil {
		return nil, err
	}
	if err := s.writeLocked(d); err != nil {
		os.Remove(s.path(d))
		return nil, err
	}
	return d, nil
}

// put records d (a batch's output or error file), replacing a record of
// the same id.
func (s *fileStore) put(d *fileDoc) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writeLocked(d)
}

func (s *fileStore) writeLocked(d *fileDoc) error {
	b, _ := json.Marshal(d)
	if err := rundir.WriteFileAtomic(filepath.Join(s.dir, d.ID+".json"), b, 0o600); err != nil {
		return err
	}
	s.byID[d.ID] = d
	return nil
}

// remove deletes d's record, then its content.
func (s *fileStore) remove(d *fileDoc) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.removeLocked(d)
}

func (s *fileStore) removeLocked(d *fileDoc) error {
	if err := os.Remove(filepath.Join(s.dir, d.ID+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	delete(s.byID, d.ID)
	if err := os.Remove(s.path(d)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// appendFileObject appends d's file object.
func appendFileObject(b []byte, d *fileDoc) []byte {
	f := openai.File{ID: d.ID, Object: "file", Bytes: d.Bytes, CreatedAt: d.CreatedAt, Filename: d.Filename, Purpose: d.Purpose, Status: "processed"}
	if d.ExpiresAt != 0 {
		// In whole seconds, rounded up: the file is found until then.
		u := (d.ExpiresAt + int64(time.Second) - 1) / int64(time.Second)
		f.ExpiresAt = &u
	}
	o, _ := json.Marshal(struct {
		openai.File
		StatusDetails *string `json:"status_details"`
	}{File: f})
	return append(b, o...)
}

// parseExpiresAfter reads the API's expires_after (anchor created_at,
// seconds 3,600 to 30 days; both or neither), def when absent, or the
// param it refuses, its code and message.
func parseExpiresAfter(anchor, seconds *string, def time.Duration) (d time.Duration, param, code, msg string) {
	switch {
	case anchor == nil && seconds == nil:
		return def, "", "", ""
	case anchor == nil:
		return 0, "expires_after.anchor", "missing_required_parameter", "Missing required parameter: 'expires_after.anchor'."
	case seconds == nil:
		return 0, "expires_after.seconds", "missing_required_parameter", "Missing required parameter: 'expires_after.seconds'."
	case *anchor != "created_at":
		return 0, "expires_after.anchor", "invalid_value", fmt.Sprintf("Invalid value: '%s'. Supported values are: 'created_at'.", *anchor)
	}
	n, err := strconv.ParseInt(*seconds, 10, 64)
	switch {
	case err != nil:
		return 0, "expires_after.seconds", "invalid_type", fmt.Sprintf("Invalid type for 'expires_after.seconds': expected an integer, but got %q instead.", *seconds)
	case n < int64(minFileExpiry/time.Second):
		return 0, "expires_after.seconds", "integer_below_min_value", fmt.Sprintf("Invalid 'expires_after.seconds': integer below minimum value. Expected a value greater than or equal to %d, but got %d instead.", minFileExpiry/time.Second, n)
	case n > int64(maxFileExpiry/time.Second):
		return 0, "expires_after.seconds", "integer_above_max_value", fmt.Sprintf("Invalid 'expires_after.seconds': integer above maximum value. Expected a value less than or equal to %d, but got %d instead.", maxFileExpiry/time.Second, n)
	}
	return time.Duration(n) * time.Second, "", "", ""
}

func writeOAJSON(w http.ResponseWriter, b []byte) {
	w.Header().Set("content-type", "application/json")
	w.Header().Set(openai.HeaderRequestID, newRequestID())
	w.Write(b)
}

// noSuchFile answers the API's 404 for a file id the client has not.
func noSuchFile(w http.ResponseWriter, id, param string) {
	writeOAErrorParam(w, http.StatusNotFound, openai.ErrInvalidRequest, "", param, "No such File object: "+id)
}

// uploadFile serves POST /v1/files: multipart/form-data with "purpose"
// (batch) and "file" (a .jsonl file), streamed to disk.
func (g *Gateway) uploadFile(w http.ResponseWriter, r *http.Request, client string) {
	bad := func(param, code, msg string) {
		writeOAErrorParam(w, http.StatusBadRequest, openai.ErrInvalidRequest, code, param, msg)
	}
	tooLarge := func() {
		writeOAErrorParam(w, http.StatusRequestEntityTooLarge, openai.ErrInvalidRequest, "", "file",
			fmt.Sprintf("File is too large: the maximum size of a batch input file is %d bytes.", g.files.maxFile))
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		bad("", "", "Invalid Content-Type: POST /v1/files expects multipart/form-data.")
		return
	}
	if r.ContentLength > g.files.maxFile+formOverhead {
		tooLarge()
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, g.files.maxFile+formOverhead)
	readFailed := func(err error) {
		var mb *http.MaxBytesError
		switch {
		case errors.As(err, &mb):
			tooLarge()
		case errors.Is(err, os.ErrDeadlineExceeded):
			writeOAError(w, http.StatusRequestTimeout, openai.ErrInvalidRequest, "the request body was not received within the gateway's body timeout")
		default:
			bad("", "", "could not read the multipart body: "+err.Error())
		}
	}
	mr, err := r.MultipartReader()
	if err != nil {
		readFailed(err)
		return
	}
	var purpose, filename, tmp string
	var expAnchor, expSeconds *string
	var size int64
	defer func() {
		if tmp != "" {
			os.Remove(tmp)
		}
	}()
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			readFailed(err)
			return
		}
		switch part.FormName() {
		case "purpose":
			b, err := io.ReadAll(io.LimitReader(part, 64))
			if err != nil {
				readFailed(err)
				return
			}
			purpose = string(b)
		case "file":
			if tmp != "" {
				bad("file", "invalid_value", "The request has more than one 'file'.")
				return
			}
			f, err := os.CreateTemp(g.files.dir, "upload-*.tmp") // 0600
			if err != nil {
				writeOAError(w, http.StatusInternalServerError, openai.ErrServer, "apidispatch gateway: storing the file: "+err.Error())
				return
			}
			tmp = f.Name()
			size, err = io.Copy(f, io.LimitReader(part, g.files.maxFile+1))
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				readFailed(err)
				return
			}
			if size > g.files.maxFile {
				tooLarge()
				return
			}
			filename = path.Base(part.FileName())
		case "expires_after[anchor]", "expires_after[seconds]":
			b, err := io.ReadAll(io.LimitReader(part, 64))
			if err != nil {
				readFailed(err)
				return
			}
			v := string(b)
			if part.FormName() == "expires_after[anchor]" {
				expAnchor = &v
			} else {
				expSeconds = &v
			}
		default: // other fields: accepted, not kept
			if _, err := io.Copy(io.Discard, part); err != nil {
				readFailed(err)
				return
			}
		}
	}
	switch {
	case tmp == "":
		bad("file", "missing_required_parameter", "Missing required parameter: 'file'.")
		return
	case purpose == "":
		bad("purpose", "missing_required_parameter", "Missing required parameter: 'purpose'.")
		return
	case purpose != openai.PurposeBatch:
		bad("purpose", "invalid_value", fmt.Sprintf("apidispatch gateway: purpose '%s' is not served; the gateway keeps files of purpose 'batch' only (batch input files).", purpose))
		return
	case !strings.HasSuffix(filename, ".jsonl"):
		bad("file", "invalid_file_format", "Invalid file format for Batch API. Must be .jsonl")
		return
	}
	expiry, param, code, msg := parseExpiresAfter(expAnchor, expSeconds, defaultFileExpiry)
	if param != "" {
		bad(param, code, msg)
		return
	}
	d, err := g.files.addUpload(client, filename, purpose, tmp, size, expiry)
	if err != nil {
		if errors.Is(err, errFileLimit) {
			bad("file", "storage_limit_exceeded", "apidispatch gateway: "+err.Error())
			return
		}
		writeOAError(w, http.StatusInternalServerError, openai.ErrServer, "apidispatch gateway: storing the file: "+err.Error())
		return
	}
	tmp = ""
	writeOAJSON(w, appendFileObject(nil, d))
}

func (g *Gateway) getFile(w http.ResponseWriter, r *http.Request, client string) {
	id := r.PathValue("id")
	d := g.files.own(client, id)
	if d == nil {
		noSuchFile(w, id, "id")
		return
	}
	writeOAJSON(w, appendFileObject(nil, d))
}

func (g *Gateway) fileContent(w http.ResponseWriter, r *http.Request, client string) {
	id := r.PathValue("id")
	d := g.files.own(client, id)
	if d == nil {
		noSuchFile(w, id, "id")
		return
	}
	f, err := os.Open(g.files.path(d))
	if err != nil {
		writeOAError(w, http.StatusInternalServerError, openai.ErrServer, "apidispatch gateway: reading the file: "+err.Error())
		return
	}
	defer f.Close()
	w.Header().Set("content-type", "application/octet-stream")
	w.Header().Set("content-length", strconv.FormatInt(d.Bytes, 10))
	w.Header().Set(openai.HeaderRequestID, newRequestID())
	io.Copy(w, f)
}

func (g *Gateway) deleteFile(w http.ResponseWriter, r *http.Request, client string) {
	id := r.PathValue("id")
	d := g.files.own(client, id)
	if d == nil {
		noSuchFile(w, id, "id")
		return
	}
	if err := g.files.remove(d); err != nil {
		writeOAError(w, http.StatusInternalServerError, openai.ErrServer, "apidispatch gateway: deleting the file: "+err.Error())
		return
	}
	b, _ := json.Marshal(struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Deleted bool   `json:"deleted"`
	}{id, "file", true})
	writeOAJSON(w, b)
}

// listFiles serves GET /v1/files: the client's files, newest first,
// purpose filter, after and limit (1–10,000, default 10,000).
func (g *Gateway) listFiles(w http.ResponseWriter, r *http.Request, client string) {
	q := r.URL.Query()
	limit, ok := oaLimit(w, q.Get("limit"), 10_000, 10_000)
	if !ok {
		return
	}
	s := g.files
	s.mu.Lock()
	if err := s.expireLocked(time.Now()); err != nil {
		s.mu.Unlock()
		writeOAError(w, http.StatusInternalServerError, openai.ErrServer, "apidispatch gateway: removing an expired file: "+err.Error())
		return
	}
	var mine []*fileDoc
	for _, d := range s.byID {
		if d.Client == client && (q.Get("purpose") == "" || d.Purpose == q.Get("purpose")) {
			mine = append(mine, d)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(mine, func(a, b *fileDoc) int { return cmpNewest(a.Seq, b.Seq, a.ID, b.ID) })
	page, more, ok := oaPage(mine, q.Get("after"), limit, func(d *fileDoc) string { return d.ID })
	if !ok {
		writeOAErrorParam(w, http.StatusBadRequest, openai.ErrInvalidRequest, "invalid_value", "after", fmt.Sprintf("Invalid 'after': no file %q", q.Get("after")))
		return
	}
	out := []byte(`{"object":"list","data":[`)
	for i, d := range page {
		if i > 0 {
			out = append(out, ',')
		}
		out = appendFileObject(out, d)
	}
	writeOAJSON(w, appendListEnd(out, page, more, func(d *fileDoc) string { return d.ID }))
}

// cmpNewest orders by seq, newest first (then by id).
func cmpNewest(a, b int64, ida, idb string) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return strings.Compare(ida, idb)
}

// oaLimit reads a list's limit (def when absent), or answers the API's 400.
func oaLimit(w http.ResponseWriter, v string, def, most int) (int, bool) {
	if v == "" {
		return def, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > most {
		writeOAErrorParam(w, http.StatusBadRequest, openai.ErrInvalidRequest, "integer_above_max_value", "limit",
			fmt.Sprintf("Invalid 'limit': expected an integer between 1 and %d, but got %q instead.", most, v))
		return 0, false
	}
	return n, true
}

// oaPage is the page of all (newest first) after the entry named after.
func oaPage[T any](all []T, after string, limit int, id func(T) string) (page []T, more, ok bool) {
	if after != "" {
		i := slices.IndexFunc(all, func(x T) bool { return id(x) == after })
		if i < 0 {
			return nil, false, false
		}
		all = all[i+1:]
	}
	return all[:min(limit, len(all))], len(all) > limit, true
}

// appendListEnd closes a list of the OpenAI API.
func appendListEnd[T any](b []byte, page []T, more bool, id func(T) string) []byte {
	first, last := "null", "null"
	if len(page) > 0 {
		first, last = strconv.Quote(id(page[0])), strconv.Quote(id(page[len(page)-1]))
	}
	b = append(b, `],"first_id":`+first+`,"last_id":`+last+`,"has_more":`...)
	b = strconv.AppendBool(b, more)
	return append(b, '}')
}
