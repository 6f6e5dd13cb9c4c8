package strictup

import (
	"testing"
	"time"
)

// A Log admits at most 5 in any 1s window of its own
// arrival times, refused requests not counted, and says when to retry.
func TestLog(t *testing.T) {
	s := New(5)
	t0 := time.Unix(1000, 0)
	for i := range 5 {
		if ok, _ := s.Arrive(t0.Add(time.Duration(i) * 100 * time.Millisecond)); !ok {
			t.Fatalf("request %d refused", i+1)
		}
	}
	ok, retry := s.Arrive(t0.Add(999 * time.Millisecond))
	if ok || retry != time.Millisecond {
		t.Fatalf("the 6th within 1s: admitted %v, retry %s; want refused, 1ms", ok, retry)
	}
	if ok, _ := s.Arrive(t0.Add(time.Second)); !ok {
		t.Fatal("the 6th a second after the 1st was refused")
	}
	if ok, _ := s.Arrive(t0.Add(1050 * time.Millisecond)); ok {
		t.Fatal("the 6th within 1s of the 2nd was admitted")
	}
	if seen := s.Seen(0); len(seen.Arrivals) != 8 || seen.Refused != 2 {
		t.Fatalf("arrivals %d, refused %d; want 8, 2", len(seen.Arrivals), seen.Refused)
	}

	for retry, want := range map[time.Duration]string{time.Millisecond: "1", time.Second: "1", 1001 * time.Millisecond: "2", 0: "1"} {
		if got := RetryAfter(retry); got != want {
			t.Errorf("RetryAfter(%s) = %q; want %q", retry, got, want)
		}
	}
}
