package report

import (
	"bytes"
	"context"
	"flag"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"testing"
	"time"
)

// chromiumPath is the headless browser: $CHROMIUM, or the first of the
// usual names on the PATH (Debian's chromium first). CI installs it
// (apt-get install -y chromium): there a missing browser fails the test;
// elsewhere it is skipped, saying so.
var chromiumPath = findChromium()

func findChromium() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless_shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return "/usr/bin/chromium"
}

var (
	updateExample = flag.Bool("example", false, "rewrite testdata/example-report.png (from the A/B fixture, or from -example-from)")
	exampleFrom   = flag.String("example-from", "", "with -example: render this run or A/B `DIR` (e.g. one 'apidispatch ab --sim' wrote) instead of the fixture")
)

// chromium runs headless chromium on a file:// page with extra arguments
// and returns its stdout.
func chromium(t *testing.T, page string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	base := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--hide-scrollbars", "--force-device-scale-factor=1",
		"--user-data-dir=" + t.TempDir(),
	}
	cmd := exec.CommandContext(ctx, chromiumPath, append(append(base, args...), "file://"+page)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.Bytes())
	}
	return stdout.Bytes()
}

// TestChromiumRendersABReport opens the report of an A/B in a real
// headless browser: the screenshot must be a real picture (not blank, not
// one colour) and the DOM the browser built must hold the plots with data.
func TestChromiumRendersABReport(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("no headless browser under CI: %s: %v (CI installs chromium; set CHROMIUM to its path)", chromiumPath, err)
		}
		t.Skipf("no headless browser: %s is not installed (apt-get install -y chromium); the page is still checked by the other tests", chromiumPath)
	}
	dir := filepath.Join(t.TempDir(), "ab-n6000-sim")
	fixture := *exampleFrom == ""
	if fixture {
		abFixture(t, dir, 6000, 2)
	} else {
		dir = *exampleFrom
	}
	page, err := WriteFile(dir, filepath.Join(t.TempDir(), "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(t.TempDir(), "report.png")
	size := "1400,2400"
	if *updateExample {
		size = "1240,4200" // the whole page, for docs/run.md
	}
	// One browser run takes the screenshot and dumps the DOM it built.
	dom := chromium(t, page, "--screenshot="+shot, "--dump-dom", "--window-size="+size)
	if !bytes.Contains(dom, []byte("</html>")) {
		dom = chromium(t, page, "--dump-dom", "--window-size="+size) // an older chromium does one at a time
	}
	b, err := os.ReadFile(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	if len(b) < 30_000 {
		t.Errorf("screenshot is only %d bytes: the page looks empty", len(b))
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	if got := img.Bounds().Dx(); got < 1200 {
		t.Errorf("screenshot is %d px wide, want the window's width", got)
	}
	if n := colours(img); n < 20 {
		t.Errorf("screenshot has %d distinct colours: the plots did not render", n)
	}
	if *updateExample {
		writeExample(t, img, filepath.Join("testdata", "example-report.png"), 300_000)
	}

	svgs := regexp.MustCompile(`<svg class="plot"`).FindAll(dom, -1)
	if len(svgs) < 8 {
		t.Errorf("the browser's DOM holds %d plots, want ≥ 8", len(svgs))
	}
	var withData int
	for _, m := range regexp.MustCompile(`data-points="(\d+)"`).FindAllSubmatch(dom, -1) {
		if n, _ := strconv.Atoi(string(m[1])); n >= 2 {
			withData++
		}
	}
	if withData < 10 {
		t.Errorf("the browser's DOM holds %d series with ≥ 2 points, want ≥ 10", withData)
	}
	for _, want := range []string{"Simulation at speed factor K = 2", "Completions per second, both arms", "Dispatcher", "Baseline (legacy)", "passed"} {
		if !fixture {
			break
		}
		if !bytes.Contains(dom, []byte(want)) {
			t.Errorf("the browser's DOM lacks %q", want)
		}
	}
}

// colours counts the distinct colours of img, sampling every third pixel of
// every seventh row, and stops counting at 1,000.
func colours(img image.Image) int {
	seen := map[[3]uint32]bool{}
	r := img.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y += 7 {
		for x := r.Min.X; x < r.Max.X; x += 3 {
			cr, cg, cb, _ := img.At(x, y).RGBA()
			seen[[3]uint32{cr >> 8, cg >> 8, cb >> 8}] = true
			if len(seen) >= 1000 {
				return len(seen)
			}
		}
	}
	return len(seen)
}

// writeExample saves img as a PNG of at most limit bytes for docs/run.md:
// the empty background under the page is cut off, the colours are reduced
// to a palette of the 256 most common ones (a screenshot of flat colours
// and text loses nothing visible), and the picture is scaled down in steps
// only if it still does not fit.
func writeExample(t *testing.T, img image.Image, path string, limit int) {
	t.Helper()
	img = trimBottom(img, 24)
	for scale := 1.0; scale >= 0.4; scale -= 0.05 {
		small := img
		if scale < 1 {
			small = shrink(img, scale)
		}
		var buf bytes.Buffer
		enc := png.Encoder{CompressionLevel: png.BestCompression}
		if err := enc.Encode(&buf, toPalette(small)); err != nil {
			t.Fatal(err)
		}
		if buf.Len() <= limit {
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s: %v, %d bytes", path, small.Bounds().Size(), buf.Len())
			return
		}
	}
	t.Fatalf("could not fit the example under %d bytes", limit)
}

// toPalette maps img onto its 256 most common colours, each pixel to the
// nearest of them.
func toPalette(img image.Image) *image.Paletted {
	r := img.Bounds()
	count := map[color.RGBA]int{}
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			count[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
		}
	}
	cols := make([]color.RGBA, 0, len(count))
	for c := range count {
		cols = append(cols, c)
	}
	sort.Slice(cols, func(i, j int) bool {
		if count[cols[i]] != count[cols[j]] {
			return count[cols[i]] > count[cols[j]]
		}
		a, b := cols[i], cols[j]
		return uint32(a.R)<<16|uint32(a.G)<<8|uint32(a.B) < uint32(b.R)<<16|uint32(b.G)<<8|uint32(b.B)
	})
	pal := make(color.Palette, 0, 256)
	for _, c := range cols[:min(256, len(cols))] {
		pal = append(pal, c)
	}
	out := image.NewPaletted(r, pal)
	index := map[color.RGBA]uint8{}
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			c := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			i, ok := index[c]
			if !ok {
				i = uint8(pal.Index(c))
				index[c] = i
			}
			out.SetColorIndex(x, y, i)
		}
	}
	return out
}

// trimBottom cuts the rows under the page's content that are all the
// colour of the bottom-left pixel, keeping margin of them.
func trimBottom(img image.Image, margin int) image.Image {
	r := img.Bounds()
	bg := img.At(r.Min.X, r.Max.Y-1)
	br, bgg, bb, _ := bg.RGBA()
	last := r.Max.Y - 1
rows:
	for ; last > r.Min.Y; last-- {
		for x := r.Min.X; x < r.Max.X; x++ {
			cr, cg, cb, _ := img.At(x, last).RGBA()
			if cr != br || cg != bgg || cb != bb {
				break rows
			}
		}
	}
	bottom := min(r.Max.Y, last+1+margin)
	out := image.NewRGBA(image.Rect(0, 0, r.Dx(), bottom-r.Min.Y))
	draw.Draw(out, out.Bounds(), img, r.Min, draw.Src)
	return out
}

// shrink scales img by f < 1, averaging the source pixels under each
// destination pixel (a box filter; enough for a screenshot).
func shrink(img image.Image, f float64) image.Image {
	r := img.Bounds()
	w, h := int(float64(r.Dx())*f), int(float64(r.Dy())*f)
	out := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		y0 := r.Min.Y + int(float64(y)/f)
		y1 := max(y0+1, r.Min.Y+int(float64(y+1)/f))
		for x := range w {
			x0 := r.Min.X + int(float64(x)/f)
			x1 := max(x0+1, r.Min.X+int(float64(x+1)/f))
			var sr, sg, sb, n uint32
			for yy := y0; yy < y1 && yy < r.Max.Y; yy++ {
				for xx := x0; xx < x1 && xx < r.Max.X; xx++ {
					cr, cg, cb, _ := img.At(xx, yy).RGBA()
					sr, sg, sb, n = sr+cr>>8, sg+cg>>8, sb+cb>>8, n+1
				}
			}
			out.SetRGBA(x, y, color.RGBA{uint8(sr / n), uint8(sg / n), uint8(sb / n), 255})
		}
	}
	return out
}
