package report

import (
	"bufio"
	"errors"
	"fmt"
	"html/template"
	"io"
	"os"
	"path/filepath"
)

// Write renders the report of dir, a run directory or an A/B directory,
// into dir/report.html, replacing it atomically. It returns ErrNotRunDir
// (wrapped) when dir is neither.
func Write(dir string) error {
	_, err := WriteFile(dir, "")
	return err
}

// WriteFile renders the report of dir into out (dir/report.html when out
// is empty) and returns the path it wrote. The page is written to a
// temporary file in out's directory and renamed into place, so a reader
// never sees half a page.
func WriteFile(dir, out string) (string, error) {
	if out == "" {
		out = filepath.Join(dir, reportFile)
	}
	src, err := load(dir)
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(filepath.Dir(out), ".report-*.html")
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after the rename this fails harmlessly
	w := bufio.NewWriterSize(f, 64<<10)
	err = render(w, src)
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o600) // like the run it reports on: only its owner reads it
	}
	if err == nil {
		err = os.Rename(tmp, out)
	}
	if err != nil {
		return "", fmt.Errorf("writing %s: %w", out, err)
	}
	return out, nil
}

// Render writes the report page of dir to w.
func Render(w io.Writer, dir string) error {
	src, err := load(dir)
	if err != nil {
		return err
	}
	return render(w, src)
}

func render(w io.Writer, src *source) error {
	if err := pageTemplate.Execute(w, build(src)); err != nil {
		return errors.Join(errors.New("rendering the report"), err)
	}
	return nil
}

var pageTemplate = template.Must(template.New("page").Parse(pageHTML))

// pageHTML is the page. Everything is inline: the page must open from
// file:// with no network.
const pageHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="apidispatch report">
<title>{{.Title}} — {{.Subtitle}}</title>
<style>
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #f5f6f8; color: #1d2430;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "DejaVu Sans", "Liberation Sans", sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 22px 20px 48px; }
h1 { font-size: 24px; margin: 0 0 2px; }
h2 { font-size: 18px; margin: 0 0 2px; }
.sub { color: #5b6472; margin-bottom: 12px; }
.banner { border-radius: 8px; padding: 10px 14px; margin: 10px 0 16px; border: 1px solid; }
.banner b { display: block; font-size: 15px; }
.banner.sim { background: #fff5d6; border-color: #e3b93f; }
.banner.live { background: #e6f5ea; border-color: #74bb88; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(205px, 1fr)); gap: 12px; margin-bottom: 16px; }
.card { background: #fff; border: 1px solid #dfe3e9; border-radius: 8px; padding: 10px 14px; }
.card.good { border-left: 5px solid #2e9e5b; }
.card.bad { border-left: 5px solid #d62728; }
.card .l { color: #5b6472; font-size: 11.5px; text-transform: uppercase; letter-spacing: .03em; }
.card .v { font-size: 20px; font-weight: 650; margin-top: 2px; font-variant-numeric: tabular-nums; white-space: nowrap; }
.card.good .v { color: #1f7a44; }
.card.bad .v { color: #c0211f; }
.card .s { color: #5b6472; font-size: 12.5px; }
table { border-collapse: collapse; background: #fff; border: 1px solid #dfe3e9; width: 100%; font-variant-numeric: tabular-nums; }
th, td { padding: 6px 12px; border-bottom: 1px solid #edf0f3; text-align: right; vertical-align: top; }
th:first-child, td:first-child, td.t, th.t { text-align: left; }
table.headline { width: auto; min-width: 760px; }
table.headline td { min-width: 200px; }
thead th { background: #eef1f5; font-weight: 650; }
tbody th { font-weight: 500; color: #39414d; }
td.good { color: #1f7a44; font-weight: 600; }
td.bad { color: #c0211f; font-weight: 700; }
td.warn { color: #a35c00; }
td.mono { text-align: left; font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
.headrow { display: flex; gap: 16px; align-items: flex-start; }
.facts { flex: 1; min-width: 260px; background: #fff; border: 1px solid #dfe3e9; border-radius: 8px; padding: 10px 14px; }
.facts h3 { font-size: 15px; margin: 0 0 4px; }
.facts .f { padding: 5px 0; border-bottom: 1px solid #edf0f3; }
.facts .f:last-child { border-bottom: 0; }
.facts .k { color: #5b6472; font-size: 12px; }
.facts .good { color: #1f7a44; font-weight: 650; }
.facts .bad { color: #c0211f; font-weight: 700; }
section { margin-top: 26px; }
.note { color: #5b6472; margin: 0 0 10px; }
.row { display: grid; gap: 12px; }
.row.two { grid-template-columns: repeat(2, minmax(0, 1fr)); }
.row.three { grid-template-columns: repeat(3, minmax(0, 1fr)); }
figure.chart { background: #fff; border: 1px solid #dfe3e9; border-radius: 8px; margin: 0 0 12px; padding: 9px 12px 6px; min-width: 0; }
figure.chart.small { padding: 7px 8px 4px; }
figcaption .ct { font-weight: 650; }
figure.small figcaption .ct { font-size: 13px; }
figcaption .cn { color: #5b6472; font-size: 12px; margin-left: 6px; }
.legend { display: flex; flex-wrap: wrap; gap: 2px 14px; font-size: 12px; margin: 3px 0 2px; color: #333; }
figure.small .legend { font-size: 11px; gap: 2px 9px; }
.legend .li { display: inline-flex; align-items: center; gap: 5px; }
svg.plot { display: block; width: 100%; height: auto; overflow: visible; }
svg.plot text { font-size: 12px; fill: #5b6472; }
figure.small svg.plot text { font-size: 11px; }
svg.plot .gl { stroke: #e9ecf0; stroke-width: 1; }
svg.plot .ax { stroke: #8d949e; stroke-width: 1; }
svg.plot .rule { stroke: #6b7280; stroke-width: 1; stroke-dasharray: 3 3; }
svg.plot text.r2 { fill: #9a6c00; }
.empty { color: #8a929e; padding: 34px 0; text-align: center; font-style: italic; }
ul.events { list-style: none; padding: 0; margin: 4px 0 12px; background: #fff; border: 1px solid #dfe3e9; border-radius: 8px; }
ul.events li { padding: 4px 12px; border-bottom: 1px solid #edf0f3; }
ul.events li:last-child { border-bottom: 0; }
ul.events .at { display: inline-block; min-width: 64px; color: #5b6472; font-variant-numeric: tabular-nums; }
ul.events .kind { display: inline-block; min-width: 86px; font-weight: 600; }
ul.events .bad .kind { color: #c0211f; }
ul.events .warn .kind { color: #a35c00; }
ul.events .good .kind { color: #1f7a44; }
.notes { color: #8a4b00; background: #fff8ec; border: 1px solid #f0d2a0; border-radius: 8px; padding: 8px 14px 8px 30px; }
footer { color: #8a929e; font-size: 12px; margin-top: 30px; }
@media (max-width: 900px) { .row.two, .row.three { grid-template-columns: minmax(0, 1fr); } .headrow { flex-direction: column; } }
</style>
</head>
<body>
<main>
<h1>{{.Title}}</h1>
<div class="sub">{{.Subtitle}}</div>
{{with .Banner}}<div class="banner {{.Class}}"><b>{{.Head}}</b>{{.Text}}</div>{{end}}
{{with .Notes}}<ul class="notes">{{range .}}<li>{{.}}</li>{{end}}</ul>{{end}}
<div class="cards">{{range .Cards}}
<div class="card {{.Class}}"><div class="l">{{.Label}}</div><div class="v">{{.Value}}</div>{{with .Sub}}<div class="s">{{.}}</div>{{end}}</div>{{end}}
</div>
<div class="headrow">{{template "table" .Table}}
{{with .Facts}}<div class="facts"><h3>The A/B in short</h3>{{range .}}<div class="f"><div class="k">{{.Label}}</div><div class="{{.Class}}">{{.Value}}</div></div>{{end}}</div>{{end}}</div>
{{with .Rounds}}<section><h2>Rounds</h2><p class="note">The arms ran in alternating order; the speed-up above is the mean of the rounds'. The plots show the arms' run directories named in ab.json.</p>{{template "table" .}}</section>{{end}}
{{range .Sections}}
<section>
<h2>{{.Title}}</h2>
{{with .Note}}<p class="note">{{.}}</p>{{end}}
<div class="row {{.Grid}}">{{range .Charts}}{{template "chart" .}}{{end}}</div>
</section>
{{end}}
{{with .OrgTable}}<section><h2>By org</h2>{{template "table" .}}</section>{{end}}
{{with .Routes}}<section><h2>By route</h2>{{template "table" .}}</section>{{end}}
{{with .Lanes}}<section><h2>Lanes at the end</h2>{{template "table" .}}</section>{{end}}
{{with .Events}}<section><h2>Noteworthy events</h2>
{{range .}}<div class="note">{{.Arm}}</div><ul class="events">{{range .Items}}<li class="{{.Class}}"><span class="at">{{.At}}</span><span class="kind">{{.Kind}}</span> {{.Note}}</li>{{end}}{{if .More}}<li>… and {{.More}} more in events.jsonl</li>{{end}}</ul>{{end}}
</section>{{end}}
<footer>Written by apidispatch report from summary.json, events.jsonl{{if .Facts}} and ab.json{{end}}. Keys appear only as fingerprints. This page is self-contained: it loads nothing from the network.</footer>
</main>
</body>
</html>
{{define "table"}}<table class="{{.Class}}">
<thead><tr>{{range .Head}}<th class="{{.Class}}">{{.Text}}</th>{{end}}</tr></thead>
<tbody>{{range .Rows}}<tr><th>{{.Label}}</th>{{range .Cells}}<td class="{{.Class}}">{{.Text}}</td>{{end}}</tr>
{{end}}</tbody>
</table>{{end}}
{{define "chart"}}<figure class="chart {{.Size}}">
<figcaption><span class="ct">{{.Title}}</span>{{with .Note}}<span class="cn">{{.}}</span>{{end}}</figcaption>
{{with .Legend}}<div class="legend">{{range .}}<span class="li">{{if .Band}}<svg width="14" height="10" aria-hidden="true"><rect width="14" height="10" fill="{{.Color}}"></rect></svg>{{else}}<svg width="22" height="10" aria-hidden="true"><line x1="0" y1="5" x2="22" y2="5" stroke="{{.Color}}" stroke-width="{{.Width}}" stroke-dasharray="{{or .Dash "none"}}"></line></svg>{{end}}{{.Name}}</span>{{end}}</div>{{end}}
{{if .Empty}}<div class="empty">{{.Empty}}</div>{{else}}<svg class="plot" viewBox="0 0 {{.W}} {{.H}}" width="{{.Width}}" role="img" aria-label="{{.Title}}" xmlns="http://www.w3.org/2000/svg">
{{range .Bands}}<rect x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}" fill="{{.Color}}" opacity="0.75"><title>{{.Title}}</title></rect>{{end}}
{{range .YTicks}}<line class="gl" x1="{{$.Left}}" x2="{{$.Right}}" y1="{{.Pos}}" y2="{{.Pos}}"></line><text x="{{$.Left}}" y="{{.Pos}}" dx="-6" dy="0.32em" text-anchor="end">{{.Label}}</text>{{end}}
{{range .Bars}}<rect class="bar" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}" fill="{{.Color}}"><title>{{.Title}}</title></rect>{{end}}
{{range .Paths}}<path class="series" d="{{.D}}" fill="{{.Fill}}" {{if eq .Fill "none"}}stroke="{{.Color}}" stroke-width="{{.Width}}" stroke-dasharray="{{or .Dash "none"}}" stroke-linejoin="round" stroke-linecap="round"{{else}}fill-opacity="0.16"{{end}} data-points="{{.Points}}"><title>{{.Name}}</title></path>{{end}}
{{range .Rules}}<line class="rule" x1="{{.X}}" x2="{{.X}}" y1="{{.Y1}}" y2="{{.Y2}}"><title>{{.Title}}</title></line>{{end}}
<line class="ax" x1="{{.Left}}" x2="{{.Right}}" y1="{{.Bottom}}" y2="{{.Bottom}}"></line>
{{range .XTicks}}<line class="ax" x1="{{.Pos}}" x2="{{.Pos}}" y1="{{$.Bottom}}" y2="{{$.TickEnd}}"></line><text x="{{.Pos}}" y="{{.LabelY}}" text-anchor="middle">{{.Label}}</text>{{if .Label2}}<text class="r2" x="{{.Pos}}" y="{{.Y2}}" text-anchor="middle">{{.Label2}}</text>{{end}}{{end}}
{{with .XRow2}}<text class="r2" x="{{$.XRow2X}}" y="{{$.XRow2Y}}" text-anchor="end">{{.}}</text>{{end}}
</svg>{{end}}
</figure>{{end}}
`
