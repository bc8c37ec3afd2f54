package gateway

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/rundir"
)

// Crash-safe spend. The spend gates live in memory and the ledger is
// written in groups every 100 ms, so a gateway killed with requests in
// flight would forget every reservation of theirs: the API bills them (it
// bills what it received, whoever hung up), and a restart seeded from the
// ledger alone lets the client spend that money again. So every attempt
// is journaled (the run directory's attempt journal, in the state
// directory) before its request is sent, durably (fsync'd, one fsync for
// every attempt sent meanwhile), naming its spend: its client, org, model
// and worst case. An attempt's end is journaled only after its ledger
// entry is on disk (after the ledger's group write and its fsync), so
// every journal record is either settled in the ledger or still open. A
// gateway that starts on a state directory counts every attempt the
// journals of a dead one hold open, at its worst case, in the ledger, for
// good (its answer can never be known now) and then deletes them: the caps
// hold across kill -9. (A kill between a ledger write and the end records
// after it counts those attempts twice: on the side of the caps.)
//
// A journal record is a whole reservation, so another replica of the
// gateway sharing the spend could reconcile it against the ledger as this
// one does at its start.

// spendJournal is the gateway's journal of attempts. Its methods are safe
// for concurrent use.
type spendJournal struct {
	j    *rundir.Journal
	next atomic.Int64 // the last exchange id given
	// open counts attempts journaled as sent whose end is not journaled.
	open atomic.Int64
	mu   sync.Mutex
	ends []attemptID // attempts ended whose ledger entries may not be on disk yet
}

// attemptID names one attempt of one exchange in the journal.
type attemptID struct{ seq, att int64 }

// spendTag is who an attempt's spend belongs to, the tag of its journal
// record.
type spendTag struct {
	Client string `json:"client"`
	Org    string `json:"org,omitempty"`
	Model  string `json:"model,omitempty"`
	// MaxTokens bounds how long the API may run the attempt (deadHold).
	MaxTokens int64 `json:"max_tokens,omitempty"`
}

// openSpendJournal counts in l what the journals a dead gateway left in
// dir hold open (each at its worst case, as an unread, abandoned entry of
// its client), makes it durable, deletes those journals and opens this
// process's.
//
// It also returns those attempts (their org and model) and the last time
// any of them can have been sent: the journals' last write.
func openSpendJournal(dir string, l *Ledger, log *slog.Logger) (*spendJournal, []spendTag, time.Time, error) {
	paths, open, err := rundir.OpenAttempts(dir)
	if err != nil {
		return nil, nil, time.Time{}, fmt.Errorf("gateway: reading the spend journal of a gateway that died: %w", err)
	}
	var tags []spendTag
	var last time.Time
	if len(open) > 0 {
		for _, p := range paths {
			if fi, err := os.Stat(p); err == nil && fi.ModTime().After(last) {
				last = fi.ModTime()
			}
		}
		var sum cost.Nanos
		for _, a := range open {
			var tag spendTag
			if json.Unmarshal([]byte(a.Tag), &tag) != nil || tag.Client == "" {
				return nil, nil, time.Time{}, fmt.Errorf("gateway: the spend journal in %s holds an attempt without its client (tag %q)", dir, a.Tag)
			}
			l.record(tag.Client, Entry{Cost: a.Worst, Unread: a.Worst, Org: tag.Org, Model: tag.Model, Route: "sync", Abandoned: true})
			sum += a.Worst
			tags = append(tags, tag)
		}
		if err := l.Flush(); err != nil {
			return nil, nil, time.Time{}, fmt.Errorf("gateway: recording the spend journal: %w", err)
		}
		if err := l.sync(); err != nil {
			return nil, nil, time.Time{}, fmt.Errorf("gateway: recording the spend journal: %w", err)
		}
		log.Warn("a gateway died with requests in flight: each counted at its worst case", "requests", len(open), "worst_case_usd", sum.USD())
	}
	if err := rundir.RemoveJournals(paths); err != nil {
		return nil, nil, time.Time{}, fmt.Errorf("gateway: %w", err)
	}
	j, err := rundir.OpenDurableJournal(dir)
	if err != nil {
		return nil, nil, time.Time{}, fmt.Errorf("gateway: %w", err)
	}
	return &spendJournal{j: j}, tags, last, nil
}

// sent journals, durably, that attempt att of exchange seq is about to be
// sent with worst case worst for tag; the request must not go out on an
// error.
func (s *spendJournal) sent(seq, att int64, worst cost.Nanos, tag spendTag) error {
	b, _ := json.Marshal(tag)
	if err := s.j.SentTagged(seq, att, worst, string(b)); err != nil {
		return err
	}
	s.open.Add(1)
	return nil
}

// ended notes that an attempt ended, after whatever it cost was recorded
// in the ledger; its end is journaled after the ledger's next write.
func (s *spendJournal) ended(seq, att int64) {
	s.mu.Lock()
	s.ends = append(s.ends, attemptID{seq, att})
	s.mu.Unlock()
}

// takeEnds returns the attempts ended so far; take them before writing the
// ledger, so that each one's entry is in that write.
func (s *spendJournal) takeEnds() []attemptID {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.ends
	s.ends = nil
	return e
}

// writeEnds journals the ends of attempts whose ledger entries are on disk.
func (s *spendJournal) writeEnds(ends []attemptID) {
	for _, e := range ends {
		s.j.Ended(e.seq, e.att, false)
	}
	s.open.Add(-int64(len(ends)))
}

// close closes the journal, deleting it when every attempt it holds ended.
func (s *spendJournal) close() error {
	return s.j.Close(s.open.Load() == 0)
}

// flushSpend writes the ledger's entries and then the journal's ends of
// the attempts they settle (after an fsync of the ledger, so that no end
// is on disk without its entry).
func (g *Gateway) flushSpend() error {
	ends := g.journal.takeEnds()
	if err := g.ledger.Flush(); err != nil {
		return err // the attempts stay open: a restart counts them at worst
	}
	if len(ends) == 0 {
		return nil
	}
	if err := g.ledger.sync(); err != nil {
		return err
	}
	g.journal.writeEnds(ends)
	return nil
}

// closeSpend writes the ledger and the journal's last ends, and closes
// both (the journal is deleted when no attempt is left open in it).
func (g *Gateway) closeSpend() error {
	err := g.flushSpend()
	if cerr := g.ledger.Close(); err == nil {
		err = cerr
	}
	if jerr := g.journal.close(); err == nil {
		err = jerr
	}
	return err
}

// sync makes what the ledger file holds durable.
func (l *Ledger) sync() error {
	if l.f == nil {
		return nil
	}
	l.fmu.Lock()
	defer l.fmu.Unlock()
	return l.f.Sync()
}
