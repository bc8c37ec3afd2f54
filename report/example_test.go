package report_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/apidispatch/apidispatch/report"
)

// A run directory needs only summary.json and events.jsonl; Write adds
// report.html beside them.
func ExampleWrite() {
	dir, _ := os.MkdirTemp("", "run")
	defer os.RemoveAll(dir)
	os.WriteFile(filepath.Join(dir, "summary.json"), []byte(`{"succeeded":20,"wall_s":2,"cost_usd":{"total":0.04},"data_loss":{"passed":true}}`), 0o644)
	os.WriteFile(filepath.Join(dir, "events.jsonl"), []byte(
		`{"ts":"2026-07-01T00:00:01Z","kind":"sample","data":{"t_s":1,"dt_s":1,"completed_by_org":{"a":10},"cost_usd":0.02}}`+"\n"+
			`{"ts":"2026-07-01T00:00:02Z","kind":"sample","data":{"t_s":2,"dt_s":1,"completed_by_org":{"a":10},"cost_usd":0.04}}`+"\n"), 0o644)

	if err := report.Write(dir); err != nil {
		fmt.Println(err)
		return
	}
	_, err := os.Stat(filepath.Join(dir, "report.html"))
	fmt.Println("report.html written:", err == nil)
	// Output: report.html written: true
}
