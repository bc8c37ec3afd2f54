//go:build long

package sim

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"testing"
	"time"
)

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
