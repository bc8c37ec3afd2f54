package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/apidispatch/apidispatch/cost"
	"github.com/apidispatch/apidispatch/plan"
	"github.com/apidispatch/apidispatch/rundir"
	"github.com/apidispatch/apidispatch/runner"
)

func init() {
	register("probe", "read each org's real rate limits into a limits file", probeCmd)
}

func probeCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	var sf sendFlags
	fs.StringVar(&sf.orgsFile, "orgs", "", "TOML file of orgs (`FILE`); without it, orgs come from ANTHROPIC_API_KEY, ANTHROPIC_API_KEY_<NAME>, ANTHROPIC_BATCH_KEY, OPENAI_API_KEY and OPENAI_API_KEY_<NAME>")
	fs.StringVar(&sf.baseURL, "base-url", os.Getenv("ANTHROPIC_BASE_URL"), "API root `URL` (env ANTHROPIC_BASE_URL; default https://api.anthropic.com; http:// only for loopback)")
	fs.StringVar(&sf.prices, "prices", "", "price table `FILE` overriding the embedded one (recorded in the limits file)")
	fs.BoolVar(&sf.json, "json", false, "print the limits file on stdout instead of the table")
	models := fs.String("models", "", "models to probe, `m1,m2,...`, each on the orgs of its provider (one per Anthropic rate-limit pool is enough; OpenAI's limits are per model); a provider none of whose models is named takes its defaults (Anthropic: "+strings.Join(plan.DefaultProbeModels, ",")+"; OpenAI: "+strings.Join(plan.DefaultOpenAIProbeModels, ",")+")")
	out := fs.String("out", "limits.json", "limits `FILE` to write")
	debugHTTP := fs.String("debug-http", "", debugHTTPUsage)
	fs.Usage = func() {
		fmt.Fprintln(stderr, `usage: apidispatch probe [flags]

Sends one max_tokens 1 request per org × model (each costs a few millionths
of a dollar, printed from its usage), reads the anthropic-ratelimit-* limit
and remaining headers and anthropic-organization-id (an OpenAI org: one chat
completion with max_completion_tokens 1 per OpenAI model, its x-ratelimit-*
headers as rpm and tpm, and openai-organization), and writes a limits file
for 'plan --limits' and 'run --limits': orgs → models → rpm, itpm, otpm,
remaining, status, org id, service tier, plus the price table used. A 429 or
404 is recorded as that model's status. Keys that reach the same organisation
are flagged: their limits do not add.

Exit codes: 0 written, 1 usage or configuration error, or no probe answered 200.

flags:`)
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if fs.NArg() != 0 {
		fs.Usage()
		return exitUsage
	}
	ms := splitList(*models)
	if *models != "" && len(ms) == 0 {
		errf(stderr, "--models: no model given")
		return exitUsage
	}
	c, err := sf.load(stderr)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	pricesSource := "embedded"
	if sf.prices != "" {
		pricesSource = sf.prices
	}
	now := time.Now()
	for _, r := range runner.RotationReminders(c.orgs, now) {
		fmt.Fprintln(stderr, r)
	}
	wrap, closeWire, err := openWireLog(*debugHTTP, stderr)
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	defer closeWire()
	l, calls, err := plan.Probe(context.Background(), plan.ProbeConfig{
		Orgs: c.orgs, BaseURL: sf.baseURL, Models: ms, Prices: c.prices, PricesSource: pricesSource, Now: now,
		WrapTransport: wrap,
	})
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	b, err := l.Marshal()
	if err != nil {
		errf(stderr, "%v", err)
		return exitUsage
	}
	if err := rundir.WriteFileAtomic(*out, b, 0o644); err != nil {
		errf(stderr, "writing %s: %v", *out, err)
		return exitUsage
	}

	return printProbe(l, calls, b, *out, sf.json, stdout, stderr)
}

// printProbe prints the limits file (or its table) and fails when no
// probe was answered with 200.
func printProbe(l *plan.Limits, calls []plan.ProbeCall, b []byte, out string, asJSON bool, stdout, stderr io.Writer) int {
	ok := 0
	for _, c := range calls {
		if c.Limits.Status == 200 {
			ok++
		}
	}
	if asJSON {
		stdout.Write(b)
	} else {
		writeProbeTable(stdout, l, calls)
		fmt.Fprintf(stdout, "wrote %s\n", out)
	}
	if ok == 0 {
		errf(stderr, "no probe was answered with 200: check the keys and --base-url (statuses are in %s)", out)
		return exitUsage
	}
	return exitOK
}

// splitList reads a comma-separated list, leaving out blanks.
func splitList(v string) []string {
	var out []string
	for _, m := range strings.Split(v, ",") {
		if m = strings.TrimSpace(m); m != "" {
			out = append(out, m)
		}
	}
	return out
}

// writeProbeTable prints one row per probe call, then the notes.
func writeProbeTable(w io.Writer, l *plan.Limits, calls []plan.ProbeCall) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "org\tkey\tmodel\tstatus\trpm\titpm\totpm\ttpm\tremaining req/in/out/tok\torg id\ttier\tcost")
	var total cost.Nanos
	for _, c := range plan.SortedCalls(calls) {
		m := c.Limits
		status := fmt.Sprint(m.Status)
		if c.Err != "" {
			status = "no answer"
		}
		costS := "-"
		if c.CostKnown {
			costS = c.Cost.String()
			total += c.Cost
		} else if m.Status == 200 {
			costS = "unknown (no price)"
		}
		id := m.OrgID
		if len(id) > 8 {
			id = id[:8] + "…"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s/%s/%s/%s\t%s\t%s\t%s\n", c.Org, m.KeyFingerprint, c.Model, status,
			count(m.RPM), count(m.ITPM), count(m.OTPM), count(m.TPM), count(m.Remaining.Requests), count(m.Remaining.InputTokens), count(m.Remaining.OutputTokens), count(m.Remaining.Tokens),
			orDash(id), orDash(m.ServiceTier), costS)
	}
	tw.Flush()
	fmt.Fprintf(w, "%d probes cost %s in total (from their usage)\n", len(calls), total)
	if l.SpeedFactor > 0 {
		fmt.Fprintf(w, "the server is a simulator at speed K=%g: its limits are K × the API's (plan divides them back)\n", l.SpeedFactor)
	}
	for _, n := range l.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	if l.OrgsDistinctAdditive {
		fmt.Fprintln(w, "every org reaches a different organisation: their limits add up")
	}
}

func count(v int64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprint(v)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
