package workload_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/apidispatch/apidispatch/store"
	"github.com/apidispatch/apidispatch/workload"
)

// Validate the whole file first, then stream its items into the store, and
// read each item's params back by its byte range when it is sent.
func Example() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "requests.jsonl")
	var buf bytes.Buffer
	workload.GenerateJudge(&buf, 3, 1, workload.GenOptions{})
	os.WriteFile(path, buf.Bytes(), 0o644)

	sum, err := workload.Validate(path, workload.ValidateOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(sum.N, "items;", sum.Models[workload.DefaultModel].MaxTokens, "max_tokens in all")

	f, _ := os.Open(path)
	defer f.Close()
	workload.Scan(path, func(it store.Item) error {
		params, err := workload.ReadAt(f, it)
		if err != nil {
			return err
		}
		var p struct{ Model string }
		json.Unmarshal(params, &p)
		fmt.Println(it.Seq, it.CustomID, p.Model)
		return nil
	})
	// Output:
	// 3 items; 768 max_tokens in all
	// 1 phase6_000000 claude-sonnet-4-5-20250929
	// 2 phase6_000001 claude-sonnet-4-5-20250929
	// 3 phase6_000002 claude-sonnet-4-5-20250929
}

func ExampleValidate_problems() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(path, []byte(
		`{"custom_id":"a b","params":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}}`+"\n"+
			`{"custom_id":"x","params":{"model":"m","max_tokens":0,"messages":[],"stream":true}}`+"\n"), 0o644)
	_, err := workload.Validate(path, workload.ValidateOptions{})
	fmt.Println(err)
	// Output:
	// line 1: custom_id "a b" has characters outside [a-zA-Z0-9_-]
	// line 2: params.max_tokens must be a positive integer, found 0
	// line 2: params.messages is empty
	// line 2: params.stream is true; requests are sent without streaming
}

func ExampleEstimateInputTokens() {
	params := json.RawMessage(`{"model":"claude-haiku-4-5","max_tokens":64,
		"system":"Answer in one word.",
		"messages":[{"role":"user","content":"What colour is the sky on a clear day?"}]}`)
	fmt.Println(workload.EstimateInputTokens(params))
	// Output: 23
}
