package report

import (
	"math"
)

// MaxPoints is the most points any one plotted series has: longer series
// are reduced before they are drawn, so the page stays small and fast
// however long the run was.
const MaxPoints = 1000

// downsample reduces pts to at most n points with the largest-triangle-
// three-buckets method: the first and last points are kept, and from each
// of n-2 equal buckets between them the point that makes the largest
// triangle with the point kept before it and the mean of the next bucket.
// Peaks and dips (a limit cut, a burst) survive, which a plain average
// would flatten. pts must be in x order; the result is a new slice.
func downsample(pts []point, n int) []point {
	if len(pts) <= n || len(pts) <= 2 {
		return append([]point(nil), pts...)
	}
	if n < 3 {
		return []point{pts[0], pts[len(pts)-1]}
	}
	out := make([]point, 0, n)
	out = append(out, pts[0])
	// Buckets cover pts[1 : len-1].
	width := float64(len(pts)-2) / float64(n-2)
	bucket := func(i int) (lo, hi int) {
		lo = 1 + int(math.Floor(float64(i)*width))
		hi = 1 + int(math.Floor(float64(i+1)*width))
		return lo, min(hi, len(pts)-1)
	}
	prev := pts[0]
	for i := range n - 2 {
		lo, hi := bucket(i)
		// The mean of the next bucket (or the last point after the last bucket).
		var nx, ny float64
		if i == n-3 {
			nx, ny = pts[len(pts)-1].X, pts[len(pts)-1].Y
		} else {
			nlo, nhi := bucket(i + 1)
			for _, p := range pts[nlo:nhi] {
				nx += p.X
				ny += p.Y
			}
			k := float64(nhi - nlo)
			nx, ny = nx/k, ny/k
		}
		best, bestArea := lo, -1.0
		for j := lo; j < hi; j++ {
			p := pts[j]
			area := math.Abs((prev.X-nx)*(p.Y-prev.Y) - (prev.X-p.X)*(ny-prev.Y))
			if area > bestArea {
				best, bestArea = j, area
			}
		}
		prev = pts[best]
		out = append(out, prev)
	}
	return append(out, pts[len(pts)-1])
}

// rateSeries is completions per second over time: org is an index into
// the timeline's orgs, or -1 for all orgs together. When there are more
// than n samples, consecutive samples are pooled (total completions over
// total time), so the series is an honest average rather than a pick of
// single seconds. Each point sits at the middle of the time it covers.
func rateSeries(rows []sampleRow, org, n int) []point {
	if len(rows) == 0 || n < 1 {
		return nil
	}
	per := (len(rows) + n - 1) / n
	out := make([]point, 0, min(len(rows), n))
	for i := 0; i < len(rows); i += per {
		var done, dt float64
		end := min(i+per, len(rows))
		for _, r := range rows[i:end] {
			dt += r.Dt
			if org < 0 {
				for _, d := range r.Done {
					done += d
				}
			} else if org < len(r.Done) {
				done += r.Done[org]
			}
		}
		if dt <= 0 {
			continue
		}
		last := rows[end-1].T
		out = append(out, point{last - dt/2, done / dt})
	}
	return out
}

// gaugeSeries is a per-sample value over time, reduced to n points.
func gaugeSeries(rows []sampleRow, n int, value func(sampleRow) float64) []point {
	pts := make([]point, len(rows))
	for i, r := range rows {
		pts[i] = point{r.T, value(r)}
	}
	return downsample(pts, n)
}

// bin is a bar of a bar chart: counts in [From, To).
type bin struct {
	From, To float64
	A, B     float64 // two stacked counts
}

// niceSeconds are bar widths a reader takes in at a glance.
var niceSeconds = []float64{1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400}

// niceDuration is the smallest nice width ≥ d seconds.
func niceDuration(d float64) float64 {
	for _, s := range niceSeconds {
		if s >= d {
			return s
		}
	}
	return math.Ceil(d/86400) * 86400
}

// retryBins counts, per bar of time, the 429s (A) and other retries (B)
// reported between samples. There are at most maxBins bars, each a nice
// number of seconds wide.
func retryBins(rows []sampleRow, maxBins int) (bins []bin, width float64) {
	if len(rows) == 0 || maxBins < 1 {
		return nil, 0
	}
	end := rows[len(rows)-1].T
	width = niceDuration(max(end, 1) / float64(maxBins))
	nb := int(math.Ceil(end/width - 1e-9))
	nb = max(nb, 1)
	bins = make([]bin, nb)
	for i := range bins {
		bins[i].From = float64(i) * width
		bins[i].To = float64(i+1) * width
	}
	var p429, pRetry float64
	for _, r := range rows {
		mid := r.T - r.Dt/2
		i := min(max(int(mid/width), 0), nb-1)
		bins[i].A += max(0, r.R429-p429)
		bins[i].B += max(0, r.Retries-pRetry)
		p429, pRetry = r.R429, r.Retries
	}
	return bins, width
}

// coarsen merges spans closer together than gap, so a lane that toggled
// its hold thousands of times draws as a few hundred bands at most.
func coarsen(spans []span, gap float64) []span {
	if len(spans) == 0 {
		return nil
	}
	out := []span{spans[0]}
	for _, s := range spans[1:] {
		last := &out[len(out)-1]
		if s.From-last.To <= gap {
			last.To = max(last.To, s.To)
			continue
		}
		out = append(out, s)
	}
	return out
}
