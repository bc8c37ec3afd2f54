// Package report renders the HTML report of a run directory or of an A/B
// directory: one self-contained page (inline CSS and inline SVG, no
// scripts, no fonts, nothing fetched from the network) that opens from
// file:// and shows the run as plots a person would rather look at than
// read.
//
// A run directory holds summary.json and events.jsonl (written by package
// dispatch). An A/B directory holds ab.json and the two arms' run
// directories baseline/ and dispatcher/. [Write] tells them apart and writes
// DIR/report.html; [WriteFile] writes elsewhere; [Render] writes the page to
// any io.Writer.
//
// The page shows, for each arm: completions per second over time, in total
// and per org; the in-flight count, AIMD limit and polite cap of every lane
// over time, with the periods a lane was holding for a retry-after and the
// periods it saw colleagues on its org; 429 and other retry responses over
// time; the cumulative cost; and the headline table (wall-clock measured and
// API-equivalent, requests per minute, outcomes, cost from usage and from the
// simulator's ledger, 429s, latency percentiles, the data-loss check, and
// for an A/B the speed-up, whether the 5× target was met, and projected
// versus actual cost). A simulated run says so at the top, with its speed
// factor.
//
// Inputs are decoded loosely: unknown fields are ignored and missing fields
// are shown as "—", so the report keeps working while the formats grow.
// Every series is reduced to at most [MaxPoints] points, so a soak of
// millions of items renders as fast as a short run. Inputs hold key
// fingerprints only; the report never reads keys, and any text that looks
// like an API key is redacted before it is shown.
package report
