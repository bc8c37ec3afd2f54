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
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/apidispatch/apidispatch/gate"
	"github.com/apidispatch/apidispatch/gateway"
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
	gw := fs.String("gateway", "", "show the gateway ('apidispatch serve') whose --state-dir is `DIR` instead")
	fs.Usage = func() {
		fmt.Fprintln(stderr, `usage: apidispatch status [--shared URL] [--json] [--runs DIR]
       apidispatch status --gateway STATE_DIR [--json]

With --shared (or APIDISPATCH_REDIS_URL), one row per key and model pool from
Redis: live processes, requests in flight, slots held, the shared limit and
the cap, any retry-after hold, what the newest rate-limit headers had
remaining, and the 429s of the last 60 s. Without it, the newest lane sample
of each run directory under --runs on this machine.

With --gateway, the gateway serving from STATE_DIR (its --state-dir, default
gateway-state), as it wrote it at most a second ago: every client's spend,
what it holds reserved and its max_cost; a gateway serving with --shared,
each client's spend and reserved across every gateway on the Redis, which
its max_cost is judged against; the spend by org (gateway batches, which
span orgs, apart); the requests queued for a lane; the gateway batches
by status; each lane; retries, abandoned requests and orgs out of rotation.
It reads the state directory's status.json, so it needs no token and shows
every client: it is the operator's view (a client's own is GET
/apidispatch/status with its token).

flags:`)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if *gw != "" {
		return gatewayStatus(*gw, *asJSON, time.Now(), stdout, stderr)
	}
	if shf.url != "" {
		return sharedStatus(shf, *asJSON, stdout, stderr)
	}
	return runsStatus(*runs, *asJSON, stdout, stderr)
}

// sharedStatus prints the shared budget's lanes in Redis.
func sharedStatus(shf sharedFlags, asJSON bool, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ls, err := shared.Status(ctx, shf.url, shf.passwordFile)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	if asJSON {
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

// runsStatus prints the newest lane sample of each run directory under runs.
func runsStatus(runs string, asJSON bool, stdout, stderr io.Writer) int {
	rows, err := localStatus(runs)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	if asJSON {
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
		fmt.Fprintf(stdout, "no run directories with lane samples under %s\n", runs)
	}
	if _, err := gateway.ReadStatus(defaultGatewayStateDir); err == nil {
		fmt.Fprintf(stdout, "a gateway's state is in %s: apidispatch status --gateway %[1]s\n", defaultGatewayStateDir)
	}
	return exitOK
}

// defaultGatewayStateDir is serve's default --state-dir.
const defaultGatewayStateDir = "gateway-state"

// gatewayStatus prints the status file of the gateway whose state
// directory is dir, as of now.
func gatewayStatus(dir string, asJSON bool, now time.Time, stdout, stderr io.Writer) int {
	s, err := gateway.ReadStatus(dir)
	if err != nil {
		errf(stderr, "--gateway %v", err)
		return exitUsage
	}
	if asJSON {
		return printJSON(stdout, s)
	}
	age := now.Sub(s.At).Round(time.Second)
	switch {
	case s.Stopped:
		fmt.Fprintf(stdout, "gateway %s: stopped %s ago (pid %d); its last status:\n", dir, age, s.PID)
	case age > 5*gateway.StatusEvery:
		fmt.Fprintf(stdout, "gateway %s: no status for %s (pid %d): is it still running? Its last status:\n", dir, age, s.PID)
	default:
		fmt.Fprintf(stdout, "gateway %s: running (pid %d), status of %s ago\n", dir, s.PID, age)
	}
	usd := func(v float64) string { return fmt.Sprintf("$%.6f", v) }
	capUSD := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return usd(v)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nclient\tspent\treserved\tmax_cost\tanswers\tabandoned\tspent by org")
	t := s.Total
	t.ByOrg = s.OrgSpend
	rows := append(s.Clients, t)
	for _, c := range rows {
		name := c.Client
		if name == "*" {
			name = "(all clients)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", name, usd(c.SpentUSD), usd(c.InFlight), capUSD(c.CapUSD), c.Requests, c.Abandoned, byOrg(c.ByOrg))
	}
	tw.Flush()
	printShared(stdout, rows, usd, capUSD)
	printQueues(stdout, s.Queues)
	fmt.Fprintf(stdout, "\nqueued %d, requests %d, upstream attempts %d, retries %d, abandoned %d, refused by a cap %d\n",
		s.Queued, s.Requests, s.Attempts, s.Retries, s.Abandoned, s.RefusedAt)
	if c := s.Cache; c != nil {
		scope := ""
		if c.Scope != "" {
			scope = ", " + c.Scope + " scope"
		}
		fmt.Fprintf(stdout, "result cache %s (%s, origin %s%s): %d hits saving %s, %d misses (%d held only another origin's answer), %d stored\n",
			c.Path, c.Mode, c.Origin, scope, c.Hits, usd(c.SavedUSD), c.Misses, c.OtherOrigin, c.Stored)
	}
	var bs []string
	for _, k := range sortedKeys(s.Batches) {
		bs = append(bs, fmt.Sprintf("%s %d", k, s.Batches[k]))
	}
	if len(bs) == 0 {
		bs = []string{"none"}
	}
	fmt.Fprintf(stdout, "gateway batches: %s\n", strings.Join(bs, ", "))
	for _, o := range sortedKeys(s.Orgs) {
		fmt.Fprintf(stdout, "org %s out of rotation: %s\n", o, s.Orgs[o])
	}
	if len(s.Lanes) > 0 {
		tw = tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "\norg\tpool\tin flight\tmax in flight\tlimit\tcap\theld\tcuts\tattempts\t429s\tdisabled")
		for _, l := range s.Lanes {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.0f\t%d\t%v\t%d\t%d\t%d\t%s\n", l.Org, l.Pool, l.InFlight, l.MaxInFlight, l.Limit, l.Cap, l.Held, l.Cuts,
				l.Attempts, l.RateLimited429, l.Disabled)
		}
		tw.Flush()
	}
	return exitOK
}

// printShared prints the budgets of rows (the clients and the total) in
// the spend budget every gateway on the Redis shares (--shared; without
// it, nothing): what each cap is judged against, beside this gateway's own.
func printShared(stdout io.Writer, rows []gateway.ClientSpend, usd, capUSD func(float64) string) {
	t := rows[len(rows)-1].Shared
	if t == nil {
		return
	}
	if t.Unavailable != "" {
		fmt.Fprintf(stdout, "\nevery gateway's spend (--shared): unavailable: %s\n", t.Unavailable)
		return
	}
	fmt.Fprintln(stdout, "\nevery gateway's spend (--shared; each max_cost is judged against spent + reserved):")
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "client\tspent\treserved\tmax_cost\tof which held for good\tthis gateway spent")
	for _, c := range rows {
		sh := c.Shared
		if sh == nil {
			continue
		}
		name := c.Client
		if name == "*" {
			name = "(all clients)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", name, usd(sh.SpentUSD), usd(sh.ReservedUSD), capUSD(c.CapUSD), usd(sh.HeldUSD), usd(c.SpentUSD))
	}
	tw.Flush()
}

// printQueues prints the gateway's queue figures by client and class (none:
// nothing).
func printQueues(stdout io.Writer, queues []gateway.QueueStatus) {
	if len(queues) == 0 {
		return
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nclient\tclass\tweight\tmax in flight\tqueued\tin flight\twait p50\twait p99\t(of waits)")
	for _, q := range queues {
		hard := "-"
		if q.MaxInFlight > 0 {
			hard = strconv.Itoa(q.MaxInFlight)
		}
		fmt.Fprintf(tw, "%s\t%s\t%g\t%s\t%d\t%d\t%s\t%s\t%d\n", q.Client, q.Class, q.Weight, hard, q.Queued, q.InFlight,
			waitMs(q.WaitP50Ms, q.Waits), waitMs(q.WaitP99Ms, q.Waits), q.Waits)
	}
	tw.Flush()
}

// waitMs renders a wait percentile in milliseconds, "-" with no waits.
func waitMs(ms float64, n int) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatFloat(ms, 'f', 1, 64) + " ms"
}

// byOrg renders spend by org as "org $x, ..." in org order.
func byOrg(m map[string]float64) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s $%.6f", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
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
