package plan

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/apidispatch/apidispatch/cache"
	"github.com/apidispatch/apidispatch/workload"
)

// The misses ProjectCache returns keep the input's OpenAI items (their
// count, models and first lines): the projection is of the Anthropic
// items, but the caller tells a file of OpenAI items only from an empty
// one by them. The promise campaign's seed 40 ('run --cache' of a file of
// GPT lines only) stopped at 'projecting: plan: no workload to project':
// the misses had lost the OpenAI count, so the run took the file for one
// with nothing to send.
func TestProjectCacheKeepsTheOpenAIItems(t *testing.T) {
	dir := t.TempDir()
	var claude, gpt bytes.Buffer
	if err := workload.GenerateJudge(&claude, 3, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := workload.GenerateOpenAIJudge(&gpt, 5, 1, workload.GenOptions{}); err != nil {
		t.Fatal(err)
	}
	c, err := cache.Open(filepath.Join(dir, "cache.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for name, body := range map[string][]byte{"gpt.jsonl": gpt.Bytes(), "mixed.jsonl": append(claude.Bytes(), gpt.Bytes()...)} {
		in := filepath.Join(dir, name)
		if err := os.WriteFile(in, body, 0o644); err != nil {
			t.Fatal(err)
		}
		ws, err := workload.Validate(in, workload.ValidateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ch, err := ProjectCache(context.Background(), in, ws, c, cache.ModeReadWrite, false, "http://127.0.0.1:1")
		if err != nil {
			t.Fatal(err)
		}
		m := ch.Misses
		if m.N != ws.N || m.OpenAI != 5 || m.OpenAIModels[workload.DefaultOpenAIModel].N != 5 || m.FirstOpenAILine != ws.FirstOpenAILine || m.FirstAnthropicLine != ws.FirstAnthropicLine {
			t.Errorf("%s: misses %d items, %d OpenAI (%v), first lines %d/%d; the input: %d items, %d OpenAI, first lines %d/%d",
				name, m.N, m.OpenAI, m.OpenAIModels, m.FirstOpenAILine, m.FirstAnthropicLine, ws.N, ws.OpenAI, ws.FirstOpenAILine, ws.FirstAnthropicLine)
		}
	}
}
