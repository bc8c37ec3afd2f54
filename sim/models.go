package sim

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/apidispatch/apidispatch/anthropic"
)

// GET /v1/models and GET /v1/models/{id}: the models the key's org can
// call (those of the pools it serves), newest first, paginated like every
// list of the API (limit 1–1000, default 20; after_id, before_id;
// has_more, first_id, last_id).

// modelJSON is each model's object, built once.
var modelJSON = func() map[string][]byte {
	m := make(map[string][]byte, len(models))
	for i := range models {
		m[models[i].id] = appendModel(nil, &models[i])
	}
	return m
}()

func appendModel(b []byte, m *modelInfo) []byte {
	yes := func(b []byte, key string, v bool) []byte {
		b = appendJSONString(b, key)
		return append(b, `:{"supported":`+strconv.FormatBool(v)+`}`...)
	}
	modern := m.pool != anthropic.PoolHaiku35
	line := "sonnet"
	switch {
	case strings.Contains(m.id, "opus"):
		line = "opus"
	case strings.Contains(m.id, "haiku"):
		line = "haiku"
	case strings.Contains(m.id, "fable"):
		line = "fable"
	}
	b = append(b, `{"type":"model","id":`...)
	b = appendJSONString(b, m.id)
	b = append(b, `,"display_name":`...)
	b = appendJSONString(b, m.display)
	b = append(b, `,"created_at":`...)
	b = appendJSONString(b, m.created)
	b = append(b, `,"max_input_tokens":`...)
	b = strconv.AppendInt(b, m.context, 10)
	b = append(b, `,"max_tokens":`...)
	b = strconv.AppendInt(b, m.maxOutput, 10)
	b = append(b, `,"lifecycle":"active","deprecated_at":null,"retires_at":null,"line":`...)
	b = appendJSONString(b, line)
	b = append(b, `,"capabilities":{`...)
	b = yes(b, "batch", true)
	b = append(b, ',')
	b = yes(b, "citations", true)
	b = append(b, ',')
	b = yes(b, "code_execution", modern)
	b = append(b, `,"context_management":{`...)
	b = yes(b, "clear_thinking_20251015", modern)
	b = append(b, ',')
	b = yes(b, "clear_tool_uses_20250919", modern)
	b = append(b, ',')
	b = yes(b, "compact_20260112", m.geo)
	b = append(b, `,"supported":`+strconv.FormatBool(modern)+`},"effort":{`...)
	for _, e := range []string{"low", "medium", "high", "xhigh", "max"} {
		b = yes(b, e, m.geo)
		b = append(b, ',')
	}
	b = append(b, `"supported":`+strconv.FormatBool(m.geo)+`},`...)
	b = yes(b, "image_input", true)
	b = append(b, ',')
	b = yes(b, "pdf_input", true)
	b = append(b, `,"server_tools":{`...)
	b = yes(b, "code_execution", modern)
	b = append(b, ',')
	b = yes(b, "web_search", modern)
	b = append(b, `,"supported":`+strconv.FormatBool(modern)+`},`...)
	b = yes(b, "structured_outputs", modern)
	b = append(b, `,"thinking":{"supported":`+strconv.FormatBool(modern)+`,"types":{`...)
	b = yes(b, "adaptive", m.geo)
	b = append(b, ',')
	b = yes(b, "between_tools", false)
	b = append(b, ',')
	b = yes(b, "disabled", true)
	b = append(b, ',')
	b = yes(b, "enabled", modern)
	return append(b, `}}}}`...)
}

// orgModels are the models o can call, newest first.
func (o *orgState) models() []*modelInfo {
	var out []*modelInfo
	for i := range models {
		if _, ok := o.pools[models[i].pool]; ok {
			out = append(out, &models[i])
		}
	}
	return out
}

// authenticatedGET refuses a method other than GET and an unknown key,
// answering the error itself (nil then), or returns the key.
func (s *Server) authenticatedGET(c *call) *keyState {
	if c.r.Method != http.MethodGet {
		s.writeError(c, nil, &apiError{status: http.StatusMethodNotAllowed, typ: anthropic.ErrInvalidRequest, msg: "Method Not Allowed: use GET"})
		return nil
	}
	return s.authenticate(c)
}

func (s *Server) listModels(c *call) {
	ks := s.authenticatedGET(c)
	if ks == nil {
		return
	}
	q := c.r.URL.Query()
	page, aerr := paginate(ks.org.models(), q)
	if aerr != nil {
		s.writeError(c, ks.org, aerr)
		return
	}
	b := []byte(`{"data":[`)
	for i, m := range page.items {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, modelJSON[m.id]...)
	}
	b = append(b, `],"has_more":`+strconv.FormatBool(page.hasMore)+`,"first_id":`...)
	if len(page.items) == 0 {
		b = append(b, `null,"last_id":null}`...)
	} else {
		b = appendJSONString(b, page.items[0].id)
		b = append(b, `,"last_id":`...)
		b = appendJSONString(b, page.items[len(page.items)-1].id)
		b = append(b, '}')
	}
	writeJSON(c, http.StatusOK, b)
}

type modelPage struct {
	items   []*modelInfo
	hasMore bool
}

// paginate applies limit, after_id, before_id and lifecycle to all.
func paginate(all []*modelInfo, q url.Values) (modelPage, *apiError) {
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return modelPage{}, invalid("limit: Input should be an integer between 1 and 1000")
		}
		limit = n
	}
	after, before := q.Get("after_id"), q.Get("before_id")
	if after != "" && before != "" {
		return modelPage{}, invalid("after_id and before_id cannot be used together")
	}
	switch lc := q.Get("lifecycle"); lc {
	case "", "active":
	case "deprecated", "retired":
		return modelPage{}, nil // every simulated model is active
	default:
		return modelPage{}, invalid("lifecycle: Input should be 'active', 'deprecated' or 'retired'")
	}
	index := func(id string) (int, *apiError) {
		for i, m := range all {
			if m.id == id {
				return i, nil
			}
		}
		return 0, invalid("%s: model %q not found in the list", map[bool]string{true: "after_id", false: "before_id"}[id == after], id)
	}
	switch {
	case after != "":
		i, e := index(after)
		if e != nil {
			return modelPage{}, e
		}
		rest := all[i+1:]
		return modelPage{items: rest[:min(limit, len(rest))], hasMore: len(rest) > limit}, nil
	case before != "":
		i, e := index(before)
		if e != nil {
			return modelPage{}, e
		}
		head := all[:i]
		from := max(0, len(head)-limit)
		return modelPage{items: head[from:], hasMore: from > 0}, nil
	}
	return modelPage{items: all[:min(limit, len(all))], hasMore: len(all) > limit}, nil
}

func (s *Server) getModel(c *call) {
	ks := s.authenticatedGET(c)
	if ks == nil {
		return
	}
	id, err := url.PathUnescape(strings.TrimPrefix(c.r.URL.EscapedPath(), "/v1/models/"))
	m := modelByID[id]
	if err == nil && m != nil {
		if _, ok := ks.org.pools[m.pool]; ok {
			writeJSON(c, http.StatusOK, modelJSON[m.id])
			return
		}
	}
	s.writeError(c, ks.org, &apiError{status: http.StatusNotFound, typ: anthropic.ErrNotFound, msg: "model: " + id})
}
