package sqlite_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/store/sqlite"
)

// The life of a run directory's state: import, read pending work, commit
// outcomes in batches, stream the result lines.
func Example() {
	dir, err := os.MkdirTemp("", "run")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()

	st, err := sqlite.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	existing, err := st.Init(ctx, store.Meta{
		InputPath: "requests.jsonl",
		InputHash: "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8",
		N:         2,
		CreatedAt: time.Now(),
	})
	if err != nil {
		log.Fatal(err) // errors.Is(err, store.ErrInputMismatch): another input's directory
	}
	fmt.Println("resuming:", existing)

	if err := st.AddItems(ctx, []store.Item{
		{Seq: 1, Line: 1, CustomID: "item_1", Offset: 0, Length: 120, Model: "claude-haiku-4-5", MaxTokens: 256, EstInput: 40},
		{Seq: 2, Line: 2, CustomID: "item_2", Offset: 121, Length: 118, Model: "claude-haiku-4-5", MaxTokens: 256, EstInput: 38},
	}); err != nil {
		log.Fatal(err)
	}
	if err := st.SetImported(ctx); err != nil {
		log.Fatal(err)
	}

	todo, err := st.Pending(ctx, 0, 100)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending:", len(todo))

	// The same item twice: the second outcome is skipped (rseq 0).
	ok := store.Outcome{Seq: 1, State: store.Succeeded, Org: "default", Attempts: 1, LatencyMs: 850,
		CostNanos: 412_000, InputTok: 40, OutputTok: 70,
		Line: []byte(`{"custom_id":"item_1","result":{"type":"succeeded"}}`)}
	c, err := st.Commit(ctx, store.Batch{
		Outcomes: []store.Outcome{ok, ok},
		Counters: map[string]int64{"attempts": 2, "rate_limited_429": 1},
	})
	if err != nil {
		log.Fatal(err) // nothing of the batch was written: keep the outcomes and retry
	}
	fmt.Println("rseq:", c.RSeq)

	if err := st.Results(ctx, 0, func(rseq int64, line []byte) error {
		fmt.Println(rseq, string(line))
		return nil
	}); err != nil {
		log.Fatal(err)
	}
	a, err := st.Aggregate(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("succeeded %d, pending %d, cost %d nano-dollars, 429s %d\n",
		a.Succeeded, a.Pending, a.CostNanos, a.Counters["rate_limited_429"])
	// Output:
	// resuming: false
	// pending: 2
	// rseq: [1 0]
	// 1 {"custom_id":"item_1","result":{"type":"succeeded"}}
	// succeeded 1, pending 1, cost 412000 nano-dollars, 429s 1
}
