package core

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// TestBounds: limits beyond the documented maxima are rejected at the call
// with ErrInvalidLimit, by every method and by Rule.Validate, and write
// nothing; limits at the maxima work on every backend, with exact, positive
// RetryAfter and ResetAfter.
func TestBounds(t *testing.T) {
	ctx := context.Background()
	tooMany := make([]Limit, MaxLimits+1)
	atMost := make([]Limit, MaxLimits)
	for i := range tooMany {
		tooMany[i] = Per(1, time.Duration(i+1)*time.Second)
	}
	copy(atMost, tooMany)
	atMost[0].Name = strings.Repeat("n", MaxLimitName)
	bad := []struct {
		name   string
		limits []Limit
	}{
		{"too many limits", tooMany},
		{"window above MaxWindow", []Limit{Per(1, MaxWindow+time.Millisecond)}},
		{"the largest duration", []Limit{Per(1, math.MaxInt64).With(SlidingBuckets)}},
		{"buckets above MaxBuckets", []Limit{{Count: 10, Window: 10 * time.Second, Algorithm: SlidingBuckets, Precision: time.Millisecond}}},
		{"name above MaxLimitName", []Limit{{Name: strings.Repeat("n", MaxLimitName+1), Count: 1, Window: time.Second}}},
		{"count above MaxCount", []Limit{Per(MaxCount+1, time.Second).With(SlidingBuckets)}},
		{"the largest count", []Limit{Per(math.MaxInt64, time.Second).With(SlidingCounter)}},
		{"sliding logs above MaxLogCount together", []Limit{Per(MaxLogCount/2+1, time.Minute), Per(MaxLogCount/2, time.Hour)}},
		{"sliding buckets above MaxBuckets together", []Limit{
			{Count: 10, Window: time.Minute, Algorithm: SlidingBuckets, Precision: 100 * time.Millisecond}, // 600 buckets
			{Count: 10, Window: time.Hour, Algorithm: SlidingBuckets, Precision: 6 * time.Second},          // 600 more
		}},
	}
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			e := b.new(t)
			for _, c := range bad {
				calls := map[string]error{
					"Allow": func() error { _, err := e.lim.Allow(ctx, "k", c.limits...); return err }(),
					"Peek":  func() error { _, err := e.lim.Peek(ctx, "k", c.limits...); return err }(),
					"Reset": e.lim.Reset(ctx, "k", c.limits...),
					"Wait":  e.lim.Wait(ctx, "k", c.limits...),
					"Rule":  Rule{Name: "r", Limits: c.limits}.Validate(),
				}
				for call, err := range calls {
					if !errors.Is(err, ErrInvalidLimit) {
						t.Errorf("%s, %s: %v, want ErrInvalidLimit", c.name, call, err)
					}
				}
			}
			if keys := e.storedKeys(); len(keys) != 0 {
				t.Fatalf("rejected calls stored %v", keys)
			}
			// at the maxima: MaxLimits limits, decided and reset
			r, err := e.lim.Allow(ctx, "many", atMost...)
			e.expect("MaxLimits limits", r, err, want{true, 0, 0, MaxLimits * time.Second})
			if err := e.lim.Reset(ctx, "many", atMost...); err != nil {
				t.Fatal(err)
			}
			r, err = e.lim.Allow(ctx, "many", atMost...)
			e.expect("after Reset", r, err, want{true, 0, 0, MaxLimits * time.Second})
			// sliding logs of MaxLogCount units together, sliding buckets
			// of MaxBuckets buckets together, beside a counter: one call
			sums := []Limit{Per(MaxLogCount/2, time.Minute), Per(MaxLogCount/2, time.Hour),
				{Count: 10, Window: time.Minute, Algorithm: SlidingBuckets, Precision: 120 * time.Millisecond}, // 500 buckets
				{Count: 10, Window: time.Hour, Algorithm: SlidingBuckets, Precision: 6875 * time.Millisecond},  // 524 more
				Per(10, time.Second).With(SlidingCounter)}
			r, err = e.lim.AllowN(ctx, "sums", 10, sums...)
			if err != nil || !r.Allowed || r.Remaining != 0 || r.Limit != sums[3] || r.ResetAfter <= time.Hour || r.ResetAfter > time.Hour+sums[3].Precision {
				t.Fatalf("the limits' sums at their maxima: %+v, %v; want allowed, 0 remaining, bound by %s to the end of its bucket", r, err, sums[3])
			}
			// a count of MaxCount is exact: it all fits, and not one more
			for _, a := range []Algorithm{SlidingBuckets, SlidingCounter} {
				lim, key := Per(MaxCount, time.Minute).With(a), "max-count-"+a.String()
				if r, err := e.lim.AllowN(ctx, key, MaxCount, lim); err != nil || !r.Allowed || r.Remaining != 0 || r.BackendErr != nil {
					t.Fatalf("%s: AllowN(MaxCount): %+v, %v", lim, r, err)
				}
				if r, err := e.lim.Allow(ctx, key, lim); err != nil || r.Allowed || r.BackendErr != nil {
					t.Fatalf("%s: one more than MaxCount: %+v, %v", lim, r, err)
				}
			}
			// near MaxCount the retry stays exact: used + n is past 2^53
			// (a double rounded it, and the buckets answered a denial
			// with a RetryAfter of 0)
			for _, used := range []int64{MaxCount/2 + 1, MaxCount/2 + 2} {
				lim, key := Per(MaxCount, time.Minute).With(SlidingBuckets), fmt.Sprint("near-max-", used)
				if r, err := e.lim.AllowN(ctx, key, used, lim); err != nil || !r.Allowed {
					t.Fatalf("%s: AllowN(%d): %+v, %v", lim, used, r, err)
				}
				r, err := e.lim.AllowN(ctx, key, MaxCount, lim)
				if err != nil || r.Allowed || r.RetryAfter <= 0 || r.RetryAfter != r.ResetAfter {
					t.Fatalf("%s, %d used: AllowN(MaxCount): %+v, %v; want denied until the used units leave (RetryAfter = ResetAfter)", lim, used, r, err)
				}
			}
			// a window of MaxWindow: exact and positive
			for _, lim := range []Limit{Per(1, MaxWindow), Per(1, MaxWindow).With(SlidingBuckets)} {
				key := "year-" + lim.Algorithm.String()
				r, err := e.lim.Allow(ctx, key, lim)
				wantReset := MaxWindow
				if lim.Algorithm == SlidingBuckets { // to the end of the current bucket
					wantReset = r.ResetAfter
					if wantReset <= MaxWindow || wantReset > MaxWindow+lim.precision() {
						t.Fatalf("%s: ResetAfter %s", lim, wantReset)
					}
				}
				e.expect(lim.String(), r, err, want{true, 0, 0, wantReset})
				r, err = e.lim.Allow(ctx, key, lim)
				e.expect(lim.String()+", denied", r, err, want{false, 0, wantReset, wantReset})
			}
			r, err = e.lim.Allow(ctx, "year-counter", Per(1, MaxWindow).With(SlidingCounter))
			if err != nil || !r.Allowed || r.ResetAfter <= 0 || r.ResetAfter > 2*MaxWindow {
				t.Fatalf("counter over MaxWindow: %+v %v", r, err)
			}
		})
	}
}

// TestBucketsAtMaxBuckets fills a sliding-buckets limit of MaxBuckets
// buckets, one unit per bucket, and decides again once every bucket has
// gone stale: the script drops them all (in chunks) and admits.
func TestBucketsAtMaxBuckets(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			e := b.new(t)
			ctx := context.Background()
			// 10ms buckets: the keys' real TTLs (about a window) outlast
			// the thousand calls on a loaded machine
			n, prec := int64(MaxBuckets), 10*time.Millisecond
			if e.mini != nil {
				n = 64 // miniredis's Lua reads a thousand fields slowly: a thousand times is seconds
			}
			lim := Limit{Count: n, Window: time.Duration(n) * prec, Algorithm: SlidingBuckets, Precision: prec}
			if err := lim.Validate(); err != nil {
				t.Fatal(err)
			}
			for i := range n {
				if r, err := e.lim.Allow(ctx, "k", lim); err != nil || !r.Allowed || r.BackendErr != nil {
					t.Fatalf("unit %d: %+v %v", i, r, err)
				}
				e.advance(prec)
			}
			r, err := e.lim.Allow(ctx, "k", lim)
			e.expect("full", r, err, want{false, 0, prec, lim.Window})
			e.advance(2 * lim.Window)
			r, err = e.lim.Allow(ctx, "k", lim)
			e.expect("every bucket stale", r, err, want{true, n - 1, 0, lim.Window + prec})
		})
	}
}

// TestNilContext: every method of a Limiter (and an Enforcer's Refused)
// given a nil context returns an error naming it, and panics nowhere, on
// every backend.
func TestNilContext(t *testing.T) {
	var nilCtx context.Context
	lim := PerSecond(1)
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := b.new(t)
			out, err := NewDecider(e.lim, Policy[string]{Name: "r", Limits: []Limit{lim}, Key: func(k string) (string, error) { return k, nil }})
			if err != nil {
				t.Fatal(err)
			}
			calls := map[string]error{
				"Allow":  func() error { _, err := e.lim.Allow(nilCtx, "k", lim); return err }(),
				"AllowN": func() error { _, err := e.lim.AllowN(nilCtx, "k", 2, lim); return err }(),
				"Peek":   func() error { _, err := e.lim.Peek(nilCtx, "k", lim); return err }(),
				"Wait":   e.lim.Wait(nilCtx, "k", lim),
				"WaitN":  e.lim.WaitN(nilCtx, "k", 1, lim.With(SlidingBuckets)),
				"Reset":  e.lim.Reset(nilCtx, "k", lim),
				"Refund": e.lim.Refund(nilCtx, "k", 1, lim),
				"Block":  e.lim.Block(nilCtx, "k", time.Second),
				"Check":  e.lim.Check(nilCtx),
				// an upstream's refusal to retry: Block fails, and is not waited out
				"Refused": out.Refused(nilCtx, "k", time.Second, true),
			}
			for call, err := range calls {
				if !errors.Is(err, errNilContext) || err.Error() != "ratewindow: nil context" {
					t.Errorf("%s(nil ctx): %v, want %q", call, err, errNilContext)
				}
			}
			// a Decider reports a nil context to OnError: no decision, no refund
			var reported []error
			d, err := NewDecider(e.lim, Policy[string]{Name: "d", Limits: []Limit{lim},
				Key:     func(k string) (string, error) { return k, nil },
				OnError: func(_ string, err error) bool { reported = append(reported, err); return false }})
			if err != nil {
				t.Fatal(err)
			}
			if dec := d.Decide(nilCtx, "k"); dec.Verdict != Unavailable || dec.Charged() {
				t.Errorf("Decide(nil ctx): %v, charged %v; want unavailable, nothing charged", dec.Verdict, dec.Charged())
			}
			dec := d.Decide(context.Background(), "k")
			d.GiveBack(nilCtx, "k", dec, "test")
			if len(reported) != 2 || !errors.Is(reported[0], errNilContext) || !errors.Is(reported[1], errNilContext) {
				t.Errorf("OnError got %v, want the nil context of Decide and of GiveBack", reported)
			}
			if err := e.lim.Reset(context.Background(), "d:k", lim); err != nil {
				t.Fatal(err)
			}
			if keys := e.storedKeys(); len(keys) != 0 {
				t.Fatalf("calls with a nil context stored %v", keys)
			}
		})
	}
}
