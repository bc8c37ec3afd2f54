package sim

import (
	"bytes"
	"net/http"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// bigCreateBody is a create body of n judge requests (the 141.6k job's
// shape) with custom_ids prefix-i, written without reflection.
func bigCreateBody(prefix string, from, n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"requests":[`)
	for i := from; i < from+n; i++ {
		if i > from {
			b.WriteByte(',')
		}
		b.WriteString(`{"custom_id":"` + prefix + strconv.Itoa(i) + `","params":`)
		b.Write(judgeBody(i, 256))
		b.WriteByte('}')
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// BenchmarkBatch100k creates a 100,000-request batch, lets it end (which
// validates and bills every request) and streams its results; it reports
// the heap a batch holds per request and results per second.
func BenchmarkBatch100k(b *testing.B) {
	cfg := batchConfig()
	cfg.Speed = 100000
	cfg.LedgerRetain = -1
	run := startSim(b, cfg)
	body := bigCreateBody("r", 0, MaxBatchRequests)
	b.ResetTimer()
	for i := range b.N {
		before := heapInUse()
		id := do(b, http.MethodPost, run.URL+batchesPath, soloKey, body).batch(b).ID
		if i == 0 {
			b.ReportMetric(float64(heapInUse()-before)/MaxBatchRequests, "heap-B/request")
		}
		waitEnded(b, run, soloKey, id)
		start := time.Now()
		r := do(b, http.MethodGet, run.URL+batchesPath+"/"+id+"/results", soloKey, nil)
		if n := bytes.Count(r.body, []byte("\n")); n != MaxBatchRequests {
			b.Fatalf("%d lines", n)
		}
		b.ReportMetric(MaxBatchRequests/time.Since(start).Seconds(), "results/s")
		do(b, http.MethodDelete, run.URL+batchesPath+"/"+id, soloKey, nil)
	}
}
