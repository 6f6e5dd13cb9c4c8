package main

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ratewindow/ratewindow/internal/strictup"
)

// The strict upstream refuses with 429 and a Retry-After in whole seconds.
func TestStrictHandler(t *testing.T) {
	h := strictHandler{strictup.New(1)}
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
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
