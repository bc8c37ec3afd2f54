package rundir

import (
	"bufio"
	"encoding/json"
	"os"
	"sync"
	"time"
)

// Event kinds written to events.jsonl.
const (
	EventStarted    = "started"
	EventProgress   = "progress"
	EventLane       = "lane"
	EventSample     = "sample"
	EventWarning    = "warning"
	EventCompleted  = "completed"
	EventIncomplete = "incomplete"
	EventBlocked    = "blocked"
	EventFailure    = "failure"
	// EventBatch is a step of the batch route: a batch created, adopted,
	// abandoned, cancelled or harvested, or a decision of the router.
	EventBatch = "batch"
)

// Event is one line of events.jsonl.
type Event struct {
	TS   time.Time `json:"ts"`
	Kind string    `json:"kind"`
	Note string    `json:"note"`
	Data any       `json:"data,omitempty"`
}

// EventLog appends events to a JSONL file. It is safe for concurrent use; a
// nil *EventLog discards events.
type EventLog struct {
	mu sync.Mutex
	f  *os.File
	w  *bufio.Writer
}

// OpenEventLog opens (appending) or creates path.
func OpenEventLog(path string) (*EventLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, FilePerm)
	if err != nil {
		return nil, err
	}
	return &EventLog{f: f, w: bufio.NewWriterSize(f, 64<<10)}, nil
}

// Emit writes one event now.
func (l *EventLog) Emit(kind, note string, data any) {
	if l == nil {
		return
	}
	b, err := json.Marshal(Event{TS: time.Now().UTC(), Kind: kind, Note: note, Data: data})
	if err != nil {
		b, _ = json.Marshal(Event{TS: time.Now().UTC(), Kind: kind, Note: note + " (data not encodable: " + err.Error() + ")"})
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.w.Write(b)
	l.w.WriteByte('\n')
}

// Flush writes buffered events to the file.
func (l *EventLog) Flush() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Flush()
}

// Close flushes and closes.
func (l *EventLog) Close() error {
	if l == nil {
		return nil
	}
	err := l.Flush()
	l.mu.Lock()
	defer l.mu.Unlock()
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	return err
}
