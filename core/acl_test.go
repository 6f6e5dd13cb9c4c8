package core_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

// TestDocumentedACL creates the user docs/redis.md gives, with its ACL
// line as written, and wants Check to pass and every operation to be
// decided by Redis as that user (no failure-mode answer): each algorithm,
// a log long enough for its sorted layout, Peek, Refund, Reset, Block,
// Wait's reservation and release; Redis counts no refused command.
func TestDocumentedACL(t *testing.T) {
	doc, err := os.ReadFile("../docs/redis.md")
	if err != nil {
		t.Fatal(err)
	}
	var rules []string
	for _, line := range strings.Split(string(doc), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "ACL SETUSER limiter on >password "); ok {
			rules = strings.Fields(rest)
		}
	}
	if len(rules) == 0 {
		t.Fatal("docs/redis.md gives no line ACL SETUSER limiter on >password ...")
	}
	p := redistest.Start(t)
	ctx := context.Background()
	args := []any{"ACL", "SETUSER", "limiter", "on", ">pw"}
	for _, r := range rules {
		args = append(args, r)
	}
	if err := p.Client(t).Do(ctx, args...).Err(); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr, Username: "limiter", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	l, err := core.New(rdb, core.WithFailureMode(core.FailClosed), core.WithTimeout(time.Minute), core.WithDenyCache(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Check(ctx); err != nil {
		t.Fatalf("Check as the documented user: %v", err)
	}
	decided := func(what string, r core.Result, err error) {
		t.Helper()
		if err != nil || r.BackendErr != nil {
			t.Fatalf("%s: %v, %v", what, err, r.BackendErr)
		}
	}
	for _, lim := range []core.Limit{core.PerMinute(1000), core.PerMinute(1000).With(core.SlidingBuckets), core.PerMinute(1000).With(core.SlidingCounter)} {
		key := "acl-" + lim.Algorithm.String()
		for _, n := range []int64{1, 600, 1} { // 600 units: a sorted log
			r, err := l.AllowN(ctx, key, n, lim)
			decided(lim.String()+" AllowN", r, err)
		}
		r, err := l.AllowN(ctx, key, 1000, lim) // denied
		decided(lim.String()+" a denial", r, err)
		r, err = l.Peek(ctx, key, lim)
		decided(lim.String()+" Peek", r, err)
		if err := l.Refund(ctx, key, 300, lim); err != nil {
			t.Fatalf("%s Refund: %v", lim, err)
		}
		if err := l.Reset(ctx, key, lim); err != nil {
			t.Fatalf("%s Reset: %v", lim, err)
		}
	}
	if err := l.Block(ctx, "acl-blocked", time.Second); err != nil {
		t.Fatalf("Block: %v", err)
	}
	r, err := l.Allow(ctx, "acl-blocked", core.PerMinute(5))
	decided("a blocked key", r, err)
	if r.Allowed {
		t.Fatal("a blocked key was allowed")
	}
	// Wait reserves a slot of a sliding log; a cancelled wait releases it
	lim := core.Per(1, time.Second)
	if err := l.Wait(ctx, "acl-wait", lim); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	if err := l.Wait(cctx, "acl-wait", lim); err != context.Canceled {
		t.Fatalf("a cancelled Wait: %v, want context.Canceled", err)
	}
	// the calls whose errors no answer shows (a release) were not refused either
	stats, err := p.Client(t).Info(ctx, "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(stats, "\r\n") {
		if strings.HasPrefix(line, "acl_access_denied_") && !strings.HasSuffix(line, ":0") {
			t.Errorf("Redis refused the documented user: %s", line)
		}
	}
}
