package rundir

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/apidispatch/apidispatch/store"
)

// CheckResults finds a custom_id written twice and a result missing, and
// passes a file with one line per terminal item.
func TestCheckResults(t *testing.T) {
	write := func(lines ...string) string {
		p := filepath.Join(t.TempDir(), ResultsFile)
		var b []byte
		for _, l := range lines {
			b = append(b, `{"custom_id":"`+l+`","result":{"type":"succeeded"}}`+"\n"...)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	agg := store.Aggregate{N: 3, Succeeded: 3}
	dl, err := CheckResults(write("a", "b", "c"), agg)
	if err != nil || !dl.Passed || dl.Duplicates != 0 || dl.Missing != 0 {
		t.Fatalf("clean file: %+v, %v", dl, err)
	}
	dl, err = CheckResults(write("a", "b", "a"), agg)
	if err != nil || dl.Passed || dl.Duplicates != 1 || dl.Missing != 1 {
		t.Fatalf("a twice, c missing: %+v, %v", dl, err)
	}
	dl, err = CheckResults(write("a", "a", "a", "b", "c"), store.Aggregate{N: 3, Succeeded: 3})
	if err != nil || dl.Passed || dl.Duplicates != 2 {
		t.Fatalf("a three times: %+v, %v", dl, err)
	}
}
