package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/shared"
)

func init() {
	register("status", "every key's live budget: processes, in flight, limit, cap, holds, remaining", statusCmd)
}

func statusCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	var shf sharedFlags
	shf.register(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	runs := fs.String("runs", "runs", "without --shared: the `DIR` whose run directories are read")
	fs.Usage = func() {
		fmt.Fprintln(stderr, `usage: apidispatch status [--shared URL] [--json] [--runs DIR]

With --shared (or APIDISPATCH_REDIS_URL), one row per key and model pool from
Redis: live processes, requests in flight, slots held, the shared limit and
the cap, any retry-after hold, what the newest rate-limit headers had
remaining, and the 429s of the last 60 s. Without it, the newest lane sample
of each run directory under --runs on this machine.

flags:`)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if shf.url != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ls, err := shared.Status(ctx, shf.url, shf.passwordFile)
		if err != nil {
			errf(stderr, "%v", err)
			return exitUsage
		}
		if *asJSON {
			return printJSON(stdout, map[string]any{"lanes": ls})
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "key\tpool\tprocs\tin flight\tlimit\tcap\thold s\trequests left\tinput left\toutput left\t429s/60s\tcuts\t")
		for _, l := range ls {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.0f\t%d\t%.1f\t%s\t%s\t%s\t%d\t%d\t\n", l.Key, l.Pool, l.Processes, l.InFlight, l.Limit, l.Cap, l.HoldS,
				left(l, "requests"), left(l, "input_tokens"), left(l, "output_tokens"), l.Recent429, l.Cuts)
		}
		tw.Flush()
		if len(ls) == 0 {
			fmt.Fprintln(stdout, "no shared lanes in Redis")
		}
		return exitOK
	}
	rows, err := localStatus(*runs)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	if *asJSON {
		return printJSON(stdout, map[string]any{"runs": rows})
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "run\tsampled\torg\tpool\tin flight\tlimit\tcap\theld\tcuts\tattempts\t429s\t429 rate")
	for _, r := range rows {
		for _, l := range r.Lanes {
			fmt.Fprintf(tw, "%s\t%s ago\t%s\t%s\t%d\t%.0f\t%d\t%v\t%d\t%d\t%d\t%.2f%%\n", r.Dir, time.Since(r.At).Round(time.Second), l.Org, l.Pool, l.InFlight, l.Limit, l.Cap, l.Held, l.Cuts,
				l.Attempts, l.RateLimited429, l.Rate429*100)
		}
	}
	tw.Flush()
	if len(rows) == 0 {
		fmt.Fprintf(stdout, "no run directories with lane samples under %s\n", *runs)
	}
	return exitOK
}

func left(l shared.LaneStatus, k string) string {
	if l.Limits == nil || l.Limits[k] == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%d", l.Remaining[k], l.Limits[k])
}

func printJSON(w io.Writer, v any) int {
	b, _ := json.MarshalIndent(v, "", "  ")
	fmt.Fprintln(w, string(b))
	return exitOK
}

// runStatus is the newest lane sample of one run directory.
type runStatus struct {
	Dir   string              `json:"run_dir"`
	At    time.Time           `json:"sampled_at"`
	Lanes []gate.LaneSnapshot `json:"lanes"`
}

// localStatus reads the newest "sample" event of each run directory under
// root (from the last 256 KiB of its events.jsonl).
func localStatus(root string) ([]runStatus, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	var out []runStatus
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		p := filepath.Join(root, e.Name(), rundir.EventsFile)
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		fi, _ := f.Stat()
		off := max(0, fi.Size()-256<<10)
		buf := make([]byte, fi.Size()-off)
		f.ReadAt(buf, off)
		f.Close()
		lines := bytes.Split(buf, []byte("\n"))
		for i := len(lines) - 1; i >= 0; i-- {
			if !bytes.Contains(lines[i], []byte(`"kind":"sample"`)) {
				continue
			}
			var ev struct {
				TS   time.Time `json:"ts"`
				Data struct {
					Lanes []gate.LaneSnapshot `json:"lanes"`
				} `json:"data"`
			}
			if json.Unmarshal(lines[i], &ev) == nil {
				out = append(out, runStatus{Dir: filepath.Join(root, e.Name()), At: ev.TS, Lanes: ev.Data.Lanes})
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return strings.Compare(out[i].Dir, out[j].Dir) < 0 })
	return out, nil
}
