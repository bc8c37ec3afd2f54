package rundir

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/store/sqlite"
	"github.com/apidispatch/apidispatch/workload"
)

// Files of a run directory.
const (
	StateFile   = "state.db"
	ResultsFile = "results.jsonl"
	EventsFile  = "events.jsonl"
	// LockFile is locked while a process runs in the directory.
	LockFile    = "lock"
	SummaryFile = "summary.json"
)

// ErrRunDirBusy: another process is running in the same run directory.
var ErrRunDirBusy = errors.New("dispatch: run directory in use by another process")

// JobConfig names a run: its input and its directory.
type JobConfig struct {
	InputPath string
	// RunDir defaults to runs/<input stem>.
	RunDir string
	// ResultsPath defaults to RunDir/results.jsonl.
	ResultsPath string
	Prices      *cost.Table
}

// DefaultRunDir is runs/<input file name without extension>.
func DefaultRunDir(input string) string {
	base := filepath.Base(input)
	return filepath.Join("runs", strings.TrimSuffix(base, filepath.Ext(base)))
}

// Job is an opened run directory with a validated input.
type Job struct {
	Dir         string
	InputPath   string
	ResultsPath string
	Input       *os.File
	Store       store.Store
	Workload    *workload.Summary
	Events      *EventLog
	// Existing reports that the run directory already held this input (a resume).
	Existing bool
	lock     *os.File
}

// Validate checks the whole input file before anything else happens: every
// line, every custom_id, and a price for every model.
func Validate(path string, prices *cost.Table) (*workload.Summary, error) {
	return workload.Validate(path, workload.ValidateOptions{KnownModel: func(model string) error {
		_, err := prices.Lookup(model)
		return err
	}})
}

// ValidatePricing is Validate for a run that may price a model by
// estimate. A model missing from prices is a problem, on each line that
// names it, only when exact (a spend cap, which needs the exact price);
// otherwise it is priced as its pool's most expensive known model
// (cost.Table.EstimateFor): the table returned holds those estimates,
// which are listed.
func ValidatePricing(path string, prices *cost.Table, exact bool) (*workload.Summary, *cost.Table, []cost.Estimate, error) {
	var missing []string
	ws, err := workload.Validate(path, workload.ValidateOptions{KnownModel: func(model string) error {
		_, err := prices.Lookup(model)
		switch {
		case err == nil:
		case exact:
			return fmt.Errorf("no price in the price table, and --max-cost needs the exact price of every model to keep its cap (add it with --prices FILE, or run without --max-cost to price it by estimate)")
		default:
			missing = append(missing, model)
			return nil
		}
		return nil
	}})
	if err != nil {
		return ws, prices, nil, err
	}
	ext, est := prices.WithEstimates(missing)
	return ws, ext, est, nil
}

// OpenJob validates the input, then creates or reopens the run directory.
// A run directory made for another input is refused and left untouched, as
// is everything when the input is invalid.
func OpenJob(ctx context.Context, cfg JobConfig, ws *workload.Summary) (*Job, error) {
	if cfg.RunDir == "" {
		cfg.RunDir = DefaultRunDir(cfg.InputPath)
	}
	if cfg.ResultsPath == "" {
		cfg.ResultsPath = filepath.Join(cfg.RunDir, ResultsFile)
	}
	var err error
	if ws == nil {
		if ws, err = Validate(cfg.InputPath, cfg.Prices); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(cfg.RunDir, DirPerm); err != nil {
		return nil, err
	}
	lock, err := lockRunDir(cfg.RunDir)
	if err != nil {
		return nil, err
	}
	st, err := sqlite.Open(filepath.Join(cfg.RunDir, StateFile))
	if err != nil {
		lock.Close()
		return nil, err
	}
	abs, _ := filepath.Abs(cfg.InputPath)
	existing, err := st.Init(ctx, store.Meta{InputPath: abs, InputHash: ws.Hash, N: ws.N, CreatedAt: time.Now().UTC()})
	if err != nil {
		var open string
		if errors.Is(err, store.ErrInputMismatch) {
			open = openBatchesNote(ctx, st, cfg.RunDir)
		}
		st.Close()
		lock.Close()
		if errors.Is(err, store.ErrInputMismatch) {
			return nil, fmt.Errorf("run directory %s was made for a different input file (or the input changed since): %w; use another --run-dir%s", cfg.RunDir, err, open)
		}
		return nil, err
	}
	j := &Job{Dir: cfg.RunDir, InputPath: cfg.InputPath, ResultsPath: cfg.ResultsPath, Store: st, Workload: ws, Existing: existing, lock: lock}
	if err := j.importItems(ctx); err != nil {
		j.Close()
		return nil, err
	}
	if j.Input, err = os.Open(cfg.InputPath); err != nil {
		j.Close()
		return nil, err
	}
	if j.Events, err = OpenEventLog(filepath.Join(cfg.RunDir, EventsFile)); err != nil {
		j.Close()
		return nil, err
	}
	return j, nil
}

// OpenStore opens the store of the run directory dir to read it, without
// its lock ('plan --from-run' measures a finished run). It never creates
// one: when dir holds none, the error is os.Stat's.
func OpenStore(dir string) (store.Store, error) {
	path := filepath.Join(dir, StateFile)
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	return sqlite.Open(path)
}

// openBatchesNote says which batches of the run directory's own input are
// still open on the API (running and billed: a new run directory would
// send and pay for their items again) and how to cancel them; "" when none
// are.
func openBatchesNote(ctx context.Context, st *sqlite.Store, dir string) string {
	input, open, err := st.OpenBatchesOfAnyInput(ctx)
	if err != nil || len(open) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "; but %d batches of that run are still open on the API, and billed:", len(open))
	for _, r := range open {
		id := r.ID
		if id == "" {
			id = "id not known yet (its create's answer was lost)"
		}
		fmt.Fprintf(&b, " batch %d (%s, org %s, %d requests);", r.Local, id, r.Org, r.N)
	}
	in := input
	if in == "" {
		in = "OLD_INPUT"
	}
	fmt.Fprintf(&b, " with the original input file unchanged, cancel them and harvest what they finished with `apidispatch run %s --run-dir %s --route batch --cancel`, or let them finish with `apidispatch run %s --run-dir %s --route batch`, before sending the new input", in, dir, in, dir)
	return b.String()
}

// importItems streams the input into the store once.
func (j *Job) importItems(ctx context.Context) error {
	done, err := j.Store.Imported(ctx)
	if err != nil || done {
		return err
	}
	batch := make([]store.Item, 0, 8192)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := j.Store.AddItems(ctx, batch)
		batch = batch[:0]
		return err
	}
	err = workload.Scan(j.InputPath, func(it store.Item) error {
		batch = append(batch, it)
		if len(batch) == cap(batch) {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return fmt.Errorf("importing %s: %w", j.InputPath, err)
	}
	return j.Store.SetImported(ctx)
}

// BodyReader returns the params object of an item, read from the input file.
type BodyReader func(it store.Item) (json.RawMessage, error)

// Body reads an item's params from the input file.
func (j *Job) Body(it store.Item) (json.RawMessage, error) { return workload.ReadAt(j.Input, it) }

// WriteSummary writes summary.json into the run directory (and to extra
// paths), each atomically.
func (j *Job) WriteSummary(s any, extra ...string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	for _, p := range append([]string{filepath.Join(j.Dir, SummaryFile)}, extra...) {
		if p == "" {
			continue
		}
		if err := WriteFileAtomic(p, b, FilePerm); err != nil {
			return err
		}
	}
	return nil
}

// Close releases the job's files.
func (j *Job) Close() error {
	var errs []error
	if j.Events != nil {
		errs = append(errs, j.Events.Close())
	}
	if j.Input != nil {
		errs = append(errs, j.Input.Close())
	}
	if j.Store != nil {
		errs = append(errs, j.Store.Close())
	}
	if j.lock != nil {
		errs = append(errs, j.lock.Close())
		j.lock = nil
	}
	return errors.Join(errs...)
}

// FilePerm and DirPerm are the permissions of what a run writes (results,
// events, summary, the run store, the cache) and of its directories: they
// hold model outputs, so only their owner may read them.
const (
	FilePerm os.FileMode = 0o600
	DirPerm  os.FileMode = 0o700
)

// WriteFileAtomic writes data to a temporary file beside path, syncs it and
// renames it over path, so readers see the old or the new file, never half.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	return WriteAtomic(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteAtomic is WriteFileAtomic for a file written as a stream: fill
// writes the content to a temporary file beside path, which is synced,
// given perm and renamed over path only when fill succeeds. On any failure
// the temporary file is removed and path is untouched.
func WriteAtomic(path string, perm os.FileMode, fill func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	err = fill(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, perm)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
