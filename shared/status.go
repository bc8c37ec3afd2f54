package shared

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// LaneStatus is the live shared state of one (key, pool), for 'apidispatch
// status'.
type LaneStatus struct {
	Key       string  `json:"key_fingerprint"`
	Pool      string  `json:"pool"`
	Processes int     `json:"processes"`
	InFlight  int64   `json:"in_flight"`
	Held      int64   `json:"slots_held"`
	Limit     float64 `json:"limit"`
	Cap       int64   `json:"cap"`
	HoldS     float64 `json:"hold_s"`
	Cuts      int64   `json:"cuts"`
	// Remaining per bucket from the newest headers any process saw
	// (requests, input tokens, output tokens), with their age.
	Remaining   map[string]int64 `json:"remaining,omitempty"`
	Limits      map[string]int64 `json:"limits,omitempty"`
	HeadersAgeS float64          `json:"headers_age_s"`
	Recent429   int64            `json:"rate_limited_429_last_60s"`
	Total429    int64            `json:"rate_limited_429"`
	OthersSeen  bool             `json:"others_seen_now"`
}

// Status reads every lane in Redis at url.
func Status(ctx context.Context, url, pwFile string) ([]LaneStatus, error) {
	opt, host, err := parseURL(url, pwFile)
	if err != nil {
		return nil, err
	}
	c := redis.NewClient(opt)
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("%w at %s: %v", ErrUnreachable, host, scrub(err, opt.Password))
	}
	tm, err := c.Time(ctx).Result()
	if err != nil {
		return nil, err
	}
	now := tm.UnixMilli()
	var out []LaneStatus
	iter := c.Scan(ctx, 0, keyPrefix+"*:state", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		tag := k[strings.Index(k, "{")+1 : strings.Index(k, "}")]
		fp, pool, _ := strings.Cut(tag, ":")
		base := strings.TrimSuffix(k, ":state")
		st, err := c.HGetAll(ctx, k).Result()
		if err != nil {
			return nil, err
		}
		ls := LaneStatus{Key: fp, Pool: pool}
		ls.Limit, _ = strconv.ParseFloat(st["limit"], 64)
		ls.Cap, _ = strconv.ParseInt(st["cap"], 10, 64)
		ls.Cuts, _ = strconv.ParseInt(st["cuts"], 10, 64)
		ls.Total429, _ = strconv.ParseInt(st["n429"], 10, 64)
		if h, _ := strconv.ParseInt(st["hold_until"], 10, 64); h > now {
			ls.HoldS = float64(h-now) / 1000
		}
		if o, _ := strconv.ParseInt(st["others_until"], 10, 64); o > now {
			ls.OthersSeen = true
		}
		if rl, ok := parseHdr(st["hdr"]); ok {
			ls.Remaining = map[string]int64{"requests": rl.Requests.Remaining, "input_tokens": rl.Input.Remaining, "output_tokens": rl.Output.Remaining}
			ls.Limits = map[string]int64{"requests": rl.Requests.Limit, "input_tokens": rl.Input.Limit, "output_tokens": rl.Output.Limit}
			at, _ := strconv.ParseInt(st["hdr_at"], 10, 64)
			ls.HeadersAgeS = float64(now-at) / 1000
		}
		live, err := c.ZRangeByScore(ctx, base+":exp", &redis.ZRangeBy{Min: strconv.FormatInt(now, 10), Max: "+inf"}).Result()
		if err != nil {
			return nil, err
		}
		for _, p := range live {
			n, _ := c.HGet(ctx, base+":infl", p).Int64()
			h, _ := c.HGet(ctx, base+":held", p).Int64()
			ls.InFlight += n
			ls.Held += h
			if !strings.HasPrefix(p, "~") {
				// Not what a key's own budget still holds for the
				// organisation's (see acquireScript): a process.
				ls.Processes++
			}
		}
		times, err := c.LRange(ctx, base+":r429", 0, -1).Result()
		if err != nil {
			return nil, err
		}
		for _, s := range times {
			if t, _ := strconv.ParseInt(s, 10, 64); now-t <= 60_000 {
				ls.Recent429++
			}
		}
		out = append(out, ls)
	}
	if err := iter.Err(); err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].Pool < out[j].Pool
	})
	return out, nil
}
