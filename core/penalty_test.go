package core

import (
	"context"
	"testing"
	"time"
)

// TestPenalty checks Rule.Penalty's mechanism (decide with a Penalty) on
// every backend with a frozen clock: the Nth denial within Within bans the
// key for Ban, the ban outlasts the window and ends on time, denials
// spread wider than Within do not ban, Peek never counts, Reset lifts the
// ban, and every stored key has a TTL.
func TestPenalty(t *testing.T) {
	ctx := context.Background()
	pen := &Penalty{Denials: 3, Within: 10 * time.Second, Ban: 2 * time.Minute}
	lim := PerMinute(2)
	type step struct {
		advance time.Duration
		peek    bool
		want    want
		banned  bool
	}
	denied := func(retry, reset time.Duration) want { return want{false, 0, retry, reset} }
	cases := []struct {
		name  string
		steps []step
	}{
		{"the third denial bans; the ban outlasts the window and ends on time", []step{
			{want: want{true, 1, 0, time.Minute}},
			{want: want{true, 0, 0, time.Minute}},
			{advance: time.Second, want: denied(59*time.Second, 59*time.Second)},
			{want: denied(59*time.Second, 59*time.Second)},
			{want: denied(2*time.Minute, 2*time.Minute), banned: true},
			// banned: denied with the ban's time left, counted nowhere
			{advance: time.Minute, want: denied(time.Minute, time.Minute)},
			{advance: 59 * time.Second, want: denied(time.Second, time.Second)},
			{advance: time.Second, want: want{true, 1, 0, time.Minute}},
		}},
		{"denials further apart than Within do not ban", []step{
			{want: want{true, 1, 0, time.Minute}},
			{want: want{true, 0, 0, time.Minute}},
			{want: denied(time.Minute, time.Minute)},
			{advance: 11 * time.Second, want: denied(49*time.Second, 49*time.Second)},
			{want: denied(49*time.Second, 49*time.Second)},
			{want: denied(2*time.Minute, 2*time.Minute), banned: true},
		}},
		{"Peek never counts", []step{
			{want: want{true, 1, 0, time.Minute}},
			{want: want{true, 0, 0, time.Minute}},
			{peek: true, want: denied(time.Minute, time.Minute)},
			{peek: true, want: denied(time.Minute, time.Minute)},
			{peek: true, want: denied(time.Minute, time.Minute)},
			{want: denied(time.Minute, time.Minute)},
			{want: denied(time.Minute, time.Minute)},
			{want: denied(2*time.Minute, 2*time.Minute), banned: true},
		}},
	}
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					e := b.new(t)
					var bans []bool
					e.lim.observer = func(ev Event) { bans = append(bans, ev.Banned) }
					for i, s := range c.steps {
						e.advance(s.advance)
						op := OpAllow
						if s.peek {
							op = OpPeek
						}
						bans = bans[:0]
						r, _, err := e.lim.decide(ctx, op, "", "k", 1, []Limit{lim}, pen)
						e.expect(c.name+": step "+string(rune('1'+i)), r, err, s.want)
						if len(bans) != 1 || bans[0] != s.banned {
							t.Fatalf("step %d: Event.Banned %v, want %v", i+1, bans, s.banned)
						}
					}
				})
			}
			t.Run("Reset lifts the ban and forgets the denials", func(t *testing.T) {
				e := b.new(t)
				for range 4 { // two denials counted, no ban yet
					_, _, _ = e.lim.decide(ctx, OpAllow, "", "k", 1, []Limit{lim}, pen)
				}
				if err := e.lim.Reset(ctx, "k", lim); err != nil {
					t.Fatal(err)
				}
				for i := range 2 {
					r, _, err := e.lim.decide(ctx, OpAllow, "", "k", 1, []Limit{lim}, pen)
					e.expect("after Reset", r, err, want{true, int64(1 - i), 0, time.Minute})
				}
				// a counted denial before the Reset would make this one a ban
				r, _, err := e.lim.decide(ctx, OpAllow, "", "k", 1, []Limit{lim}, pen)
				e.expect("one denial", r, err, denied(time.Minute, time.Minute))
				if len(e.storedKeys()) == 0 {
					t.Fatal("no key stored")
				}
			})
		})
	}
}

// TestPenaltyAcrossReplicas: a ban made through one Limiter holds on
// another, and this Limiter's deny cache answers the banned key without a
// round trip, while the denials before the ban all reach Redis (they must
// be counted).
func TestPenaltyAcrossReplicas(t *testing.T) {
	e := backends()[2].new(t) // real Redis
	ctx := context.Background()
	var hits []bool
	l, err := New(e.rdb, WithClock(e.clock.Now), WithPrefix(e.prefix), WithTimeout(5*time.Second), WithObserver(func(ev Event) { hits = append(hits, ev.CacheHit) }))
	if err != nil {
		t.Fatal(err)
	}
	other, err := New(e.rdb, WithClock(e.clock.Now), WithPrefix(e.prefix), WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	pen := &Penalty{Denials: 2, Within: time.Minute, Ban: time.Hour}
	lim := PerMinute(1)
	var results []Result
	for range 5 {
		r, _, err := l.decide(ctx, OpAllow, "rule", "k", 1, []Limit{lim}, pen)
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, r)
	}
	wantHits := []bool{false, false, false, true, true}
	for i, r := range results {
		if r.Allowed != (i == 0) || (i >= 2 && r.RetryAfter != time.Hour) || hits[i] != wantHits[i] {
			t.Fatalf("decision %d: %+v, cache hit %v; hits %v, want %v", i+1, r, hits[i], hits, wantHits)
		}
	}
	e.advance(2 * time.Minute) // the window has passed; the ban has not
	r, err := other.Allow(ctx, "k", PerSecond(100))
	if err != nil || r.Allowed || r.RetryAfter != 58*time.Minute {
		t.Fatalf("another replica: %+v %v", r, err)
	}
}

// TestPenaltyInvalid: a Rule with a bad Penalty is rejected at start-up.
func TestPenaltyInvalid(t *testing.T) {
	for _, p := range []Penalty{
		{Denials: 0, Within: time.Second, Ban: time.Second},
		{Denials: 1, Within: 0, Ban: time.Second},
		{Denials: 1, Within: time.Second, Ban: 0},
		{Denials: 1, Within: MaxWindow + 1, Ban: time.Second},
		{Denials: 1, Within: time.Second, Ban: MaxBlock + time.Millisecond},
	} {
		rule := Rule{Name: "p", Limits: []Limit{PerSecond(1)}, Penalty: &p}
		if err := rule.Validate(); err == nil {
			t.Errorf("%+v: valid", p)
		}
	}
}
