package workload

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/apidispatch/apidispatch/store"
)

// benchFile writes a 100,000-item judge file (about 131 MB) for a benchmark.
func benchFile(b *testing.B) (path string, n int, size int64) {
	b.Helper()
	const items = 100_000
	path = filepath.Join(b.TempDir(), "judge.jsonl")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := GenerateJudge(f, items, 1, GenOptions{}); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	st, _ := os.Stat(path)
	return path, items, st.Size()
}

// BenchmarkValidate: the full validation pass (SHA-256, UTF-8, JSON grammar,
// rules, duplicate hash set) over a 100k-item judge file.
//
//	go test ./workload -run '^$' -bench Validate -benchmem
func BenchmarkValidate(b *testing.B) {
	path, n, size := benchFile(b)
	b.SetBytes(size)
	b.ResetTimer()
	for b.Loop() {
		sum, err := Validate(path, ValidateOptions{})
		if err != nil || sum.N != int64(n) {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "lines/s")
}

// BenchmarkScan: the item pass that feeds the store.
//
//	go test ./workload -run '^$' -bench Scan -benchmem
func BenchmarkScan(b *testing.B) {
	path, n, size := benchFile(b)
	b.SetBytes(size)
	b.ResetTimer()
	for b.Loop() {
		var got int
		err := Scan(path, func(it store.Item) error { got++; return nil })
		if err != nil || got != n {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "lines/s")
}

// BenchmarkGenerateJudge: writing the judge workload.
func BenchmarkGenerateJudge(b *testing.B) {
	const n = 100_000
	f, err := os.Create(filepath.Join(b.TempDir(), "g.jsonl"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	for b.Loop() {
		f.Seek(0, 0)
		if err := GenerateJudge(f, n, 1, GenOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "lines/s")
}

// BenchmarkReadAt: reading one item's params back by its byte range.
func BenchmarkReadAt(b *testing.B) {
	path, _, _ := benchFile(b)
	var items []store.Item
	Scan(path, func(it store.Item) error {
		if len(items) < 1000 {
			items = append(items, it)
		}
		return nil
	})
	f, _ := os.Open(path)
	defer f.Close()
	i := 0
	for b.Loop() {
		if _, err := ReadAt(f, items[i%len(items)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
