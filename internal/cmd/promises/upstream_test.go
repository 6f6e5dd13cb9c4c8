package main

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// The strict upstream admits at most 5 in any 1s window of its own
// arrival times, refused requests not counted, and says when to retry.
func TestStrictUpstream(t *testing.T) {
	s := &strict{limit: 5}
	t0 := time.Unix(1000, 0)
	for i := range 5 {
		if ok, _ := s.arrive(t0.Add(time.Duration(i) * 100 * time.Millisecond)); !ok {
			t.Fatalf("request %d refused", i+1)
		}
	}
	ok, retry := s.arrive(t0.Add(999 * time.Millisecond))
	if ok || retry != time.Millisecond {
		t.Fatalf("the 6th within 1s: admitted %v, retry %s; want refused, 1ms", ok, retry)
	}
	if ok, _ := s.arrive(t0.Add(time.Second)); !ok {
		t.Fatal("the 6th a second after the 1st was refused")
	}
	if ok, _ := s.arrive(t0.Add(1050 * time.Millisecond)); ok {
		t.Fatal("the 6th within 1s of the 2nd was admitted")
	}
	if len(s.arrivals) != 8 || s.refused != 2 || worstWindow(s.arrivals) != 7 {
		t.Fatalf("arrivals %d, refused %d, worst window %d; want 8, 2, 7", len(s.arrivals), s.refused, worstWindow(s.arrivals))
	}

	one := &strict{limit: 1}
	one.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	rec := httptest.NewRecorder()
	one.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("a refusal: %d, Retry-After %q; want 429, 1", rec.Code, rec.Header().Get("Retry-After"))
	}
}

// settle counts a unit as the last snapshot within a window of its time
// holds it: a reservation given back is not counted, one the log trimmed is.
func TestSettle(t *testing.T) {
	const w = 1_000_000
	snaps := []snapshot{
		{at: 0, units: map[int64]int{500_000: 2, 900_000: 1}},       // two reserved at 0.5s, one at 0.9s
		{at: 600_000, units: map[int64]int{500_000: 1, 900_000: 1}}, // one of 0.5s given back late
		{at: 1_400_000, units: map[int64]int{500_000: 1}},           // 0.9s given back
		{at: 2_000_000, units: map[int64]int{}},                     // 0.5s trimmed: still counted
	}
	final, released := settle(snaps, w)
	if len(final) != 1 || final[500_000] != 1 || released != 2 {
		t.Fatalf("final %v, released %d; want map[500000:1], 2", final, released)
	}
}

func TestLogUnits(t *testing.T) {
	// width 2, base 1000µs, offsets 0, 5 and 5
	v := []byte{2, 0, 0, 0, 0, 0, 0x03, 0xe8, 0, 0, 0, 5, 0, 5}
	got := logUnits(v)
	if len(got) != 2 || got[1000] != 1 || got[1005] != 2 {
		t.Fatalf("logUnits = %v; want map[1000:1 1005:2]", got)
	}
	if logUnits([]byte("not a log")) != nil {
		t.Fatal("a value in another layout was read as a log")
	}
}
