package core

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestUnreachableRedisSaysWhy: with nothing listening at the address, the
// decisions' BackendErr names the refused dial (errors.Is finds
// ECONNREFUSED), not only the deadline, and carries the prefix once.
func TestUnreachableRedisSaysWhy(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // loopback, a closed port
	t.Cleanup(func() { rdb.Close() })
	l, err := New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	var last error
	for range 50 {
		r, err := l.Allow(context.Background(), "k", PerMinute(1))
		if err != nil || r.BackendErr == nil || !r.Allowed {
			t.Fatalf("%+v %v, want a fail-open answer", r, err)
		}
		last = r.BackendErr
		if errors.Is(last, syscall.ECONNREFUSED) {
			break
		}
	}
	if !errors.Is(last, syscall.ECONNREFUSED) || !strings.Contains(last.Error(), "connection refused") {
		t.Fatalf("BackendErr %q does not say the dial was refused", last)
	}
	if n := strings.Count(last.Error(), "ratewindow: "); n != 1 {
		t.Fatalf("BackendErr %q has the prefix %d times", last, n)
	}
}
