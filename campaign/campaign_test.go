package campaign

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var (
	seedsFlag = flag.Int("seeds", 0, "how many seeds the campaign draws (from -first; 0: 4, or 12 with -tags long)")
	firstFlag = flag.Int64("first", 1, "the first seed of the campaign")
	seedFlag  = flag.Int64("seed", 0, "run this one seed alone (0: the campaign)")
)

// raceBuild is set under -race (race_on_test.go); the children are built
// with the race detector too.
var raceBuild bool

// binary is the apidispatch built for this test run.
var binary string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "campaign-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "apidispatch")
	args := []string{"build", "-o", binary}
	if raceBuild {
		args = append(args, "-race")
	}
	c := exec.Command("go", append(args, "github.com/apidispatch/apidispatch/cmd/apidispatch")...)
	c.Stdout, c.Stderr = os.Stderr, os.Stderr
	if err := c.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "campaign: building apidispatch:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// campaign (TestCampaign) runs every seed of the campaign, two at a time,
// and fails for each seed whose run breaks a promise, printing its
// scenario, what happened and the command that reruns it alone. It draws
// defaultSeeds seeds unless -seeds says how many.
func campaign(t *testing.T, defaultSeeds int) {
	if testing.Short() {
		t.Skip("-short: the campaign spawns processes") // CI runs it without -short
	}
	n := *seedsFlag
	if n == 0 {
		n = defaultSeeds
	}
	seeds := []int64{*seedFlag}
	if *seedFlag == 0 {
		seeds = seeds[:0]
		for i := range n {
			seeds = append(seeds, *firstFlag+int64(i))
		}
	}
	runSeeds(t, "seeds", seeds, runSeed)
}

// runSeeds runs one(seed) for each seed in a subtest of its own, in
// parallel, and logs how many (what) ran and how long they took.
func runSeeds(t *testing.T, what string, seeds []int64, one func(*testing.T, int64)) {
	start := time.Now()
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			one(t, seed)
		})
	}
	t.Cleanup(func() { t.Logf("%d %s in %s", len(seeds), what, time.Since(start).Round(time.Second)) })
}

// reportSeed logs a seed's scenario and timeline (always with -v) and fails
// the test with each promise it broke and the command that reruns it.
func reportSeed(t *testing.T, test string, seed int64, sc fmt.Stringer, began time.Time, log, v []string) {
	if testing.Verbose() || len(v) > 0 {
		t.Logf("%s\nran in %s:\n  %s", sc, time.Since(began).Round(time.Millisecond), strings.Join(log, "\n  "))
	}
	if len(v) > 0 {
		race, label := "", "seed"
		if raceBuild {
			race = " -race"
		}
		if test == "TestGatewayCampaign" {
			label = "gateway seed"
		}
		t.Errorf("%s %d broke %d promise(s):\n- %s\nrerun alone: go test%s ./campaign -run '%s/seed=%d$' -seed %d -v",
			label, seed, len(v), strings.Join(v, "\n- "), race, test, seed, seed)
	}
}

// runSeed runs one seed's scenario and checks it.
func runSeed(t *testing.T, seed int64) {
	sc := draw(seed)
	w := setup(t, sc)
	began := time.Now()
	w.execute()
	reportSeed(t, "TestCampaign", seed, sc, began, w.log, check(w))
}
