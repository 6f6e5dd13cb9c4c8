package core

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestVerdict: how a Decider answers a Limiter's Result, for every failure
// mode: a decision shed for overload (ErrShed) is answered as FailClosed
// answers, whatever the mode, and never admitted.
func TestVerdict(t *testing.T) {
	allowed := Result{Allowed: true, Remaining: 3}
	denied := Result{RetryAfter: time.Second}
	redisDown := errors.New("dial tcp: connection refused")
	shed := fmt.Errorf("allow: %w", ErrShed)
	local := func(allow bool, err error) Result { return Result{Allowed: allow, BackendErr: err} }
	for _, tc := range []struct {
		name   string
		res    Result
		mode   FailureMode
		dryRun bool
		want   Verdict
		shown  bool
	}{
		{"allowed", allowed, FailOpen, false, Pass, true},
		{"denied", denied, FailOpen, false, Denied, true},
		{"denied, dry run", denied, FailClosed, true, Pass, true},
		{"redis down, fail open", local(true, redisDown), FailOpen, false, Pass, false},
		{"redis down, fail closed", local(false, redisDown), FailClosed, false, Unavailable, false},
		{"redis down, fail closed, dry run", local(false, redisDown), FailClosed, true, Pass, false},
		{"redis down, fail local allows", local(true, redisDown), FailLocal, false, Pass, true},
		{"redis down, fail local denies", local(false, redisDown), FailLocal, false, Denied, true},
		{"shed, fail open", local(true, shed), FailOpen, false, Unavailable, false},
		{"shed, fail open, answered allowed", local(true, shed), FailOpen, false, Unavailable, false},
		{"shed, fail closed", local(false, shed), FailClosed, false, Unavailable, false},
		{"shed, fail local", local(true, shed), FailLocal, false, Unavailable, false},
		{"shed, dry run", local(false, shed), FailOpen, true, Pass, false},
	} {
		v, shown := verdict(tc.res, tc.mode, tc.dryRun)
		if v != tc.want || shown != tc.shown {
			t.Errorf("%s: verdict = %s, %t; want %s, %t", tc.name, v, shown, tc.want, tc.shown)
		}
	}
}

// TestDryRunBansNobody: a dry run's Penalty counts no denial and bans
// nobody, on every backend: its ban would deny under the rule once
// enforced (a Block on every replica), which a dry run must not.
func TestDryRunBansNobody(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			e := b.new(t)
			lim := PerMinute(1)
			d, err := NewDecider(e.lim, Policy[string]{Name: "dry", Limits: []Limit{lim}, DryRun: true,
				Key:     func(k string) (string, error) { return k, nil },
				Penalty: &Penalty{Denials: 1, Within: time.Minute, Ban: time.Hour}})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 4 {
				if dec := d.Decide(context.Background(), "client"); dec.Verdict != Pass || dec.Banned() {
					t.Fatalf("request %d: %v banned %v, want a pass, no ban", i, dec.Verdict, dec.Banned())
				}
			}
			r, err := e.lim.Peek(context.Background(), "dry:client", lim)
			if err != nil || r.blocked || r.RetryAfter > time.Minute {
				t.Fatalf("after the dry run: %+v %v, want no block (a minute's quota at most)", r, err)
			}
		})
	}
}
