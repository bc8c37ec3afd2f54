package cache_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"

	"github.com/apidispatch/apidispatch/cache"
)

// Store a success under its request's key and answer the same request —
// written with other white space, key order and number forms — from the
// cache; a run against another API is not answered from it.
func Example() {
	dir, _ := os.MkdirTemp("", "apidispatch-cache")
	defer os.RemoveAll(dir)
	c, err := cache.Open(filepath.Join(dir, "results.cache"))
	if err != nil {
		panic(err)
	}
	defer c.Close()
	ctx := context.Background()

	api, _ := url.Parse("https://api.anthropic.com/v1")
	origin := cache.OriginOf(api)
	sent := []byte(`{"model":"claude-sonnet-4-5","max_tokens":64,"temperature":0,"messages":[{"role":"user","content":"Is 7 prime?"}]}`)
	k, err := cache.KeyOf(sent)
	if err != nil {
		panic(err)
	}
	added, err := c.Put(ctx, []cache.Entry{{
		Key: k, Model: "claude-sonnet-4-5", Origin: origin, Org: "research", RequestID: "req_1",
		Body:     []byte(`{"type":"message","content":[{"type":"text","text":"Yes."}]}`),
		InputTok: 14, OutputTok: 3, CostNanos: 87000,
	}})
	if err != nil {
		panic(err)
	}
	fmt.Println("origin:", origin, "added:", added)

	again := []byte(`{ "messages": [{"content": "Is 7 prime?", "role": "user"}], "temperature": 0.0, "max_tokens": 64, "model": "claude-sonnet-4-5" }`)
	k2, _ := cache.KeyOf(again)
	hits, bad, elsewhere, err := c.Get(ctx, []cache.Key{k2}, origin)
	if err != nil {
		panic(err)
	}
	fmt.Printf("same key: %v, hits: %d, damaged: %d, elsewhere: %d\n", k2 == k, len(hits), len(bad), len(elsewhere))
	fmt.Printf("answer: %s (cost %d nanodollars when sent)\n", hits[k2].Body, hits[k2].CostNanos)

	sim, _ := url.Parse("http://127.0.0.1:8080")
	hits, _, elsewhere, _ = c.Get(ctx, []cache.Key{k2}, cache.OriginOf(sim))
	fmt.Printf("from %s: hits %d, found only as %s's answer: %d\n", cache.OriginOf(sim), len(hits), elsewhere[0].Origin, len(elsewhere))
	// Output:
	// origin: https://api.anthropic.com added: 1
	// same key: true, hits: 1, damaged: 0, elsewhere: 0
	// answer: {"type":"message","content":[{"type":"text","text":"Yes."}]} (cost 87000 nanodollars when sent)
	// from http://127.0.0.1:8080: hits 0, found only as https://api.anthropic.com's answer: 1
}
