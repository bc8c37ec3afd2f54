package cost

import "testing"

func TestEstimateFor(t *testing.T) {
	tb := Default()
	cases := []struct{ model, as string }{
		{"claude-sonnet-4-9", "claude-sonnet-4-5"}, // Sonnet 4.x: 4.5 and 4.6 are priced alike; the first wins
		{"claude-haiku-4-5-20990101x", "claude-haiku-4-5"},
		{"claude-fable-5", "claude-opus-4-5"}, // no known model in its pool: the table's dearest
	}
	for _, c := range cases {
		p, as, ok := tb.EstimateFor(c.model)
		if !ok || p == nil {
			t.Fatalf("%s: no estimate", c.model)
		}
		if best, _ := tb.Lookup(c.as); best.Standard != p.Standard {
			t.Errorf("%s: priced as %s (%+v), want %s's rates", c.model, as, p.Standard, c.as)
		}
	}
	ext, est := tb.WithEstimates([]string{"claude-sonnet-4-5", "claude-fable-5"})
	if len(est) != 1 || est[0].Model != "claude-fable-5" {
		t.Fatalf("estimates %+v, want only claude-fable-5", est)
	}
	if _, err := ext.Lookup("claude-fable-5"); err != nil {
		t.Errorf("the extended table does not price the estimate: %v", err)
	}
	if _, err := tb.Lookup("claude-fable-5"); err == nil {
		t.Error("WithEstimates changed the table it extends")
	}
	if same, est := tb.WithEstimates([]string{"claude-sonnet-4-5"}); same != tb || est != nil {
		t.Error("a table that prices every model is not returned as is")
	}
}
