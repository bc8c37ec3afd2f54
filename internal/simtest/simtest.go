// Package simtest starts simulators and writes workloads for the tests of
// other packages, so that each test says only what differs.
package simtest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/apidispatch/apidispatch/sim"
	"github.com/apidispatch/apidispatch/workload"
)

// Start serves the simulator preset at speed, changed by mutate (when not
// nil), on loopback until the test ends. It returns the simulator and the
// configuration it runs.
func Start(t testing.TB, preset string, speed float64, mutate func(*sim.Config)) (*sim.Running, sim.Config) {
	t.Helper()
	cfg, err := sim.Preset(preset)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Speed = speed
	if mutate != nil {
		mutate(&cfg)
	}
	r, err := sim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, cfg
}

// Judge writes n judge requests of seed to dir/req.jsonl and returns its
// path.
func Judge(t testing.TB, dir string, n int, seed int64) string {
	t.Helper()
	path := filepath.Join(dir, "req.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := workload.GenerateJudge(f, n, seed, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}
