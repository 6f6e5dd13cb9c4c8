package core

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/internal/redistest"
)

// denyCacheBound is how long another replica's cached denial may outlive a
// change (WithDenyCache: one second), with room for this busy machine.
const denyCacheBound = time.Second + 500*time.Millisecond

// replicas returns two Limiters on one Redis (a Cluster when cluster),
// with the deny cache or without.
func replicas(t *testing.T, cluster, cache bool) (a, b *Limiter, rdb redis.UniversalClient) {
	t.Helper()
	if cluster {
		_, rdb = settledCluster(t)
	} else {
		rdb = redistest.New(t).Client(t)
	}
	size := 0
	if cache {
		size = DefaultDenyCacheSize
	}
	prefix := uniquePrefix(t)
	for _, l := range []**Limiter{&a, &b} {
		var err error
		if *l, err = New(rdb, WithPrefix(prefix), WithDenyCache(size), WithTimeout(5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	return a, b, rdb
}

// admitted sends requests of key to both replicas from 8 goroutines for d
// and returns how many were admitted.
func admitted(t *testing.T, a, b *Limiter, key string, d time.Duration, limits ...Limit) int64 {
	t.Helper()
	var n atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for g := range 8 {
		l := []*Limiter{a, b}[g%2]
		wg.Go(func() {
			for time.Now().Before(end) {
				r, err := l.Allow(context.Background(), key, limits...)
				if err != nil || r.BackendErr != nil {
					t.Errorf("Allow: %v %v", err, r.BackendErr)
					return
				}
				if r.Allowed {
					n.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return n.Load()
}

// untilAllowed asks l for key until it admits one unit and returns how long
// that took; it fails after bound.
func untilAllowed(t *testing.T, l *Limiter, key string, bound time.Duration, limits ...Limit) (Result, time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		r, err := l.Allow(context.Background(), key, limits...)
		if err != nil || r.BackendErr != nil {
			t.Fatalf("Allow: %v %v", err, r.BackendErr)
		}
		if r.Allowed {
			return r, time.Since(start)
		}
		if time.Since(start) > bound {
			t.Fatalf("%q still denied after %v: %+v", key, bound, r)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestOverrideReplicas: two replicas, a tenant at its limit: SetOverride
// raises it, the next request reaching Redis on either replica is decided
// under the new limit (a cached denial lasting no longer than the deny
// cache's bound), no window admits more than the new limit, and
// RemoveOverride restores the old one on both; on a single server and on a
// 3-master Cluster, with and without the deny cache.
func TestOverrideReplicas(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		for _, cache := range []bool{false, true} {
			t.Run(fmt.Sprintf("cluster=%v,cache=%v", cluster, cache), func(t *testing.T) {
				a, b, _ := replicas(t, cluster, cache)
				ctx := context.Background()
				plan, counter := PerMinute(5), Per(50, time.Minute).With(SlidingCounter)
				if n := admitted(t, a, b, "tenant", 200*time.Millisecond, plan, counter); n != 5 {
					t.Fatalf("admitted %d under 5 a minute", n)
				}
				if err := a.SetOverride(ctx, "tenant", 0, Per(8, time.Minute)); err != nil {
					t.Fatal(err)
				}
				bound := time.Duration(0)
				if cache {
					bound = denyCacheBound
				}
				r, took := untilAllowed(t, b, "tenant", bound+200*time.Millisecond, plan, counter) // b's denial may be cached
				if r.Limit.Count != 8 || r.Remaining != 2 {
					t.Fatalf("under the override: %+v", r)
				}
				t.Logf("the other replica admitted after %v", took)
				if n := admitted(t, a, b, "tenant", 300*time.Millisecond, plan, counter); n != 2 {
					t.Fatalf("admitted %d more; the override admits 8 in all, 6 taken", n)
				}
				o, err := b.Override(ctx, "tenant")
				if err != nil || o.TTL != 0 || !reflect.DeepEqual(o.Limits, []Limit{{Count: 8, Window: time.Minute}}) {
					t.Fatalf("Override: %+v %v", o, err)
				}
				// lowered below the units counted, then removed: 5 again, all 8 counted
				if err := b.SetOverride(ctx, "tenant", time.Hour, Per(2, time.Minute)); err != nil {
					t.Fatal(err)
				}
				if r, err := a.Peek(ctx, "tenant", plan, counter); err != nil || r.Allowed || r.Limit.Count != 2 {
					t.Fatalf("lowered: %+v %v", r, err)
				}
				if err := b.RemoveOverride(ctx, "tenant"); err != nil {
					t.Fatal(err)
				}
				if _, err := a.Override(ctx, "tenant"); !errors.Is(err, ErrNoOverride) {
					t.Fatalf("Override after RemoveOverride: %v", err)
				}
				for _, l := range []*Limiter{a, b} {
					if r, err := l.Peek(ctx, "tenant", plan, counter); err != nil || r.Allowed || r.Limit.Count != 5 {
						t.Fatalf("removed: %+v %v", r, err)
					}
				}
				if n := admitted(t, a, b, "tenant", 200*time.Millisecond, plan, counter); n != 0 {
					t.Fatalf("admitted %d after the override went", n)
				}
			})
		}
	}
}

// TestOverrideTTL: a temporary override ends by itself.
func TestOverrideTTL(t *testing.T) {
	for _, backend := range []string{"redis", "memory"} {
		t.Run(backend, func(t *testing.T) {
			l := NewMemory()
			if backend == "redis" {
				l, _, _ = replicas(t, false, false)
			}
			ctx := context.Background()
			lim := PerMinute(1)
			if r, err := l.Allow(ctx, "k", lim); err != nil || !r.Allowed {
				t.Fatal(r, err)
			}
			if err := l.SetOverride(ctx, "k", 300*time.Millisecond, PerMinute(2)); err != nil {
				t.Fatal(err)
			}
			if o, err := l.Override(ctx, "k"); err != nil || o.TTL <= 0 || o.TTL > 300*time.Millisecond {
				t.Fatalf("Override: %+v %v", o, err)
			}
			if r, err := l.Allow(ctx, "k", lim); err != nil || !r.Allowed || r.Limit.Count != 2 {
				t.Fatalf("raised for a time: %+v %v", r, err)
			}
			time.Sleep(400 * time.Millisecond)
			if _, err := l.Override(ctx, "k"); !errors.Is(err, ErrNoOverride) {
				t.Fatalf("Override after its TTL: %v", err)
			}
			if r, err := l.Peek(ctx, "k", lim); err != nil || r.Allowed || r.Limit.Count != 1 {
				t.Fatalf("after the TTL: %+v %v", r, err)
			}
		})
	}
}

// TestUsageIsPeek: Usage says what the next Peek says, the override
// applied, with the block and the override.
func TestUsageIsPeek(t *testing.T) {
	for _, backend := range []string{"redis", "memory"} {
		t.Run(backend, func(t *testing.T) {
			l := NewMemory()
			if backend == "redis" {
				l, _, _ = replicas(t, false, false)
			}
			ctx := context.Background()
			limits := []Limit{PerMinute(10), Per(100, time.Hour).With(SlidingBuckets), PerSecond(50).With(SlidingCounter)}
			for range 4 {
				if _, err := l.Allow(ctx, "k", limits...); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.SetOverride(ctx, "k", 0, Per(20, time.Minute)); err != nil {
				t.Fatal(err)
			}
			u, err := l.Usage(ctx, "k", limits...)
			if err != nil {
				t.Fatal(err)
			}
			if u.Blocked != 0 || u.Override == nil || u.Override.Limits[0].Count != 20 || len(u.Limits) != 3 {
				t.Fatalf("Usage: %+v", u)
			}
			want := []int64{20, 100, 50}
			for i, lu := range u.Limits {
				r, err := l.Peek(ctx, "k", limits[i])
				if err != nil {
					t.Fatal(err)
				}
				if lu.Limit.Count != want[i] || lu.Used != 4 || lu.Remaining != r.Remaining || lu.Remaining != want[i]-4 ||
					(lu.ResetAfter-r.ResetAfter).Abs() > 100*time.Millisecond || r.Limit.Count != lu.Limit.Count {
					t.Fatalf("limit %d: Usage %+v, Peek %+v", i, lu, r)
				}
			}
			if err := l.Block(ctx, "k", time.Minute); err != nil {
				t.Fatal(err)
			}
			if u, err := l.Usage(ctx, "k", limits...); err != nil || u.Blocked <= 58*time.Second || u.Blocked > time.Minute {
				t.Fatalf("blocked: %+v %v", u, err)
			}
		})
	}
}

// TestResetAndUnblockReplicas: Reset and Unblock on one replica take effect
// on the other within the deny cache's bound.
func TestResetAndUnblockReplicas(t *testing.T) {
	a, b, _ := replicas(t, false, true)
	ctx := context.Background()
	lim := PerMinute(2)
	for range 3 {
		if _, err := b.Allow(ctx, "k", lim); err != nil {
			t.Fatal(err)
		}
	}
	if r, _ := b.Allow(ctx, "k", lim); r.Allowed {
		t.Fatal("not at the limit")
	}
	if err := a.Reset(ctx, "k", lim); err != nil {
		t.Fatal(err)
	}
	_, took := untilAllowed(t, b, "k", denyCacheBound, lim)
	t.Logf("Reset: the other replica admitted after %v", took)
	if err := a.Block(ctx, "k", time.Hour); err != nil {
		t.Fatal(err)
	}
	if r, _ := b.Allow(ctx, "k", lim); r.Allowed {
		t.Fatal("blocked, admitted")
	}
	if err := a.Unblock(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	r, took := untilAllowed(t, b, "k", denyCacheBound, lim)
	t.Logf("Unblock: the other replica admitted after %v", took)
	if r.Remaining != 0 { // the units stay: 1 before the Block, 1 now
		t.Fatalf("after Unblock: %+v", r)
	}
}

// TestTopDenied: a flooded key is listed first while 1,000 other keys
// pass; only denials that reached Redis count, and only for a rule that
// tracks them.
func TestTopDenied(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		for _, cache := range []bool{false, true} {
			t.Run(fmt.Sprintf("cluster=%v,cache=%v", cluster, cache), func(t *testing.T) {
				a, b, _ := replicas(t, cluster, cache)
				ctx := context.Background()
				key := func(s string) (string, error) { return s, nil }
				pol := Policy[string]{Name: "api", Limits: []Limit{PerMinute(5)}, Key: key, TrackDenied: true}
				da, err := NewDecider(a, pol)
				if err != nil {
					t.Fatal(err)
				}
				db, _ := NewDecider(b, pol)
				untracked, _ := NewDecider(a, Policy[string]{Name: "quiet", Limits: []Limit{PerMinute(5)}, Key: key})
				var denied int
				for i := range 200 {
					for _, d := range []*Decider[string]{da, db, untracked} {
						if dec := d.Decide(ctx, "flood"); !dec.Result.Allowed {
							denied++
						}
					}
					if i%20 == 0 {
						for range 2 {
							da.Decide(ctx, "second")
						}
					}
				}
				for i := range 1000 {
					if dec := db.Decide(ctx, fmt.Sprint("client-", i)); !dec.Result.Allowed {
						t.Fatalf("client-%d denied", i)
					}
				}
				var top []DeniedKey
				for start := time.Now(); len(top) < 1 || top[0].Key != "flood"; {
					if top, err = b.TopDenied(ctx, "api", 10, time.Minute); err != nil {
						t.Fatal(err)
					}
					if time.Since(start) > 5*time.Second {
						t.Fatalf("TopDenied: %+v", top)
					}
					time.Sleep(100 * time.Millisecond)
				}
				time.Sleep(1500 * time.Millisecond) // every replica's flush
				top, err = a.TopDenied(ctx, "api", 10, time.Minute)
				switch {
				case err != nil:
					t.Fatal(err)
				case len(top) != 2 || top[0].Key != "flood" || top[1].Key != "second":
					t.Fatalf("TopDenied: %+v", top)
				case !cache && (top[0].Denials != 2*200-5 || top[1].Denials != 20-5): // of the two replicas
					t.Fatalf("denials recorded: %+v, want 395 and 15", top)
				case cache && top[0].Denials > 10: // the deny cache answers the rest
					t.Fatalf("flood: %d denials recorded, with the deny cache", top[0].Denials)
				}
				t.Logf("denied %d, recorded %d", denied, top[0].Denials)
				if quiet, err := a.TopDenied(ctx, "quiet", 10, time.Minute); err != nil || len(quiet) != 0 {
					t.Fatalf("a rule that does not track: %+v %v", quiet, err)
				}
			})
		}
	}
}

// TestPublishRules: Publish makes rules known to another Limiter; invalid
// ones are an error and write nothing.
func TestPublishRules(t *testing.T) {
	for _, backend := range []string{"redis", "memory"} {
		t.Run(backend, func(t *testing.T) {
			a, b := NewMemory(), (*Limiter)(nil)
			b = a
			if backend == "redis" {
				a, b, _ = replicas(t, false, false)
			}
			ctx := context.Background()
			if rules, err := b.Rules(ctx); err != nil || len(rules) != 0 {
				t.Fatalf("nothing published: %+v %v", rules, err)
			}
			api := Rule{Name: "api", Limits: []Limit{PerMinute(100), Per(1000, time.Hour).With(SlidingCounter)},
				Penalty: &Penalty{Denials: 5, Within: time.Minute, Ban: time.Hour}, TrackDenied: true}
			login := Rule{Name: "login", Limits: []Limit{PerMinute(5)}}
			if err := a.Publish(ctx, login.Info(), api.Info()); err != nil {
				t.Fatal(err)
			}
			if err := a.Publish(ctx, RuleInfo{Name: "bad"}, RuleInfo{Name: "x", Limits: []Limit{PerMinute(1)}}); !errors.Is(err, ErrInvalidRule) {
				t.Fatalf("Publish of a rule without limits: %v", err)
			}
			rules, err := b.Rules(ctx)
			if err != nil || !reflect.DeepEqual(rules, []RuleInfo{api.Info(), login.Info()}) {
				t.Fatalf("Rules: %+v %v", rules, err)
			}
		})
	}
}

// TestOperateBadInput: bad input is a clear error and writes nothing.
func TestOperateBadInput(t *testing.T) {
	rdb := redistest.New(t).Client(t)
	prefix := uniquePrefix(t)
	a, err := New(rdb, WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	long := strings.Repeat("k", MaxKeyLen+1)
	//lint:ignore SA1012 a nil context is the bad input
	var nilCtx context.Context
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"key over MaxKeyLen", a.SetOverride(ctx, long, 0, PerMinute(1)), ErrInvalidKey},
		{"empty key", a.SetOverride(ctx, "", 0, PerMinute(1)), ErrInvalidKey},
		{"count 0", a.SetOverride(ctx, "k", 0, Limit{Count: 0, Window: time.Minute}), ErrInvalidLimit},
		{"two limits sharing storage", a.SetOverride(ctx, "k", 0, PerMinute(1), PerMinute(2)), ErrInvalidLimit},
		{"a log above MaxLogCount", a.SetOverride(ctx, "k", 0, PerMinute(MaxLogCount+1)), ErrInvalidLimit},
		{"no limits", a.SetOverride(ctx, "k", 0), ErrNoLimits},
		{"negative duration", a.SetOverride(ctx, "k", -time.Second, PerMinute(1)), ErrInvalidDuration},
		{"duration above MaxBlock", a.SetOverride(ctx, "k", MaxBlock+1, PerMinute(1)), ErrInvalidDuration},
		{"nil context", a.SetOverride(nilCtx, "k", 0, PerMinute(1)), errNilContext},
		{"Usage of a long key", func() error { _, err := a.Usage(ctx, long, PerMinute(1)); return err }(), ErrInvalidKey},
		{"Usage without limits", func() error { _, err := a.Usage(ctx, "k"); return err }(), ErrNoLimits},
		{"Unblock of a long key", a.Unblock(ctx, long), ErrInvalidKey},
		{"RemoveOverride of an empty key", a.RemoveOverride(ctx, ""), ErrInvalidKey},
		{"Override of a long key", func() error { _, err := a.Override(ctx, long); return err }(), ErrInvalidKey},
		{"TopDenied since 0", func() error { _, err := a.TopDenied(ctx, "api", 10, 0); return err }(), ErrInvalidDuration},
		{"TopDenied since 2h", func() error { _, err := a.TopDenied(ctx, "api", 10, 2*time.Hour); return err }(), ErrInvalidDuration},
		{"TopDenied of no rule", func() error { _, err := a.TopDenied(ctx, "", 10, time.Minute); return err }(), ErrInvalidRule},
		{"Publish of a bad limit", a.Publish(ctx, RuleInfo{Name: "r", Limits: []Limit{{Count: -1, Window: time.Second}}}), ErrInvalidLimit},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	if top, err := a.TopDenied(ctx, "unknown", 10, time.Minute); err != nil || len(top) != 0 {
		t.Errorf("TopDenied of an unknown rule: %+v %v", top, err)
	}
	if _, err := a.TopDenied(ctx, "api", 0, time.Minute); err == nil {
		t.Error("TopDenied of 0 keys: no error")
	}
	if keys, err := rdb.Keys(ctx, prefix+"*").Result(); err != nil || len(keys) != 0 {
		t.Fatalf("bad input wrote %v %v", keys, err)
	}
}
