package sim

import (
	"bufio"
	"bytes"
	"io"
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

// The 141,600-request job of docs/design.md §25 fits: two batches (100,000 and
// 41,600) in one org's queue, processed, billed and read back in full. It
// logs the heap the batches hold per request.
func TestBatch141600Requests(t *testing.T) {
	if testing.Short() {
		t.Skip("141,600 requests: not in -short")
	}
	cfg := batchConfig()
	cfg.Speed = 20000 // 70.8 API minutes of processing in 0.2 s
	cfg.LedgerRetain = -1
	run := startSim(t, cfg)
	sizes := []int{MaxBatchRequests, 141_600 - MaxBatchRequests}
	var ids []string
	var bodyBytes int
	before := heapInUse()
	from := 0
	for _, n := range sizes {
		body := bigCreateBody("item-", from, n)
		bodyBytes += len(body)
		ids = append(ids, do(t, http.MethodPost, run.URL+batchesPath, soloKey, body).batch(t).ID)
		from += n
	}
	held := heapInUse() - before
	t.Logf("141,600 requests: create bodies %.1f MB, heap held %.1f MB (%.0f B/request)",
		float64(bodyBytes)/1e6, float64(held)/1e6, float64(held)/141_600)

	lines := 0
	start := time.Now()
	for i, id := range ids {
		e := waitEnded(t, run, soloKey, id)
		if e.RequestCounts.Succeeded != int64(sizes[i]) {
			t.Fatalf("batch %d: %+v", i, e.RequestCounts)
		}
		req, _ := http.NewRequest(http.MethodGet, run.URL+batchesPath+"/"+id+"/results", nil)
		req.Header.Set("x-api-key", soloKey)
		req.Header.Set("anthropic-version", "2023-06-01")
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if !bytes.Contains(sc.Bytes(), []byte(`"type":"succeeded"`)) {
				t.Fatalf("line %s", sc.Bytes())
			}
			lines++
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if lines != 141_600 {
		t.Errorf("%d result lines", lines)
	}
	tot := run.Server.LedgerTotals()
	if tot.Requests != 141_600 {
		t.Errorf("%d billed", tot.Requests)
	}
	t.Logf("finalized and streamed 141,600 results in %v; billed $%.2f at the batch price", time.Since(start).Round(time.Millisecond), tot.CostUSD)
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
