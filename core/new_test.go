package core

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestNewNilClient: New refuses a nil client, and a nil pointer of every
// client type in a non-nil interface, with one error and no panic.
func TestNewNilClient(t *testing.T) {
	for _, c := range []struct {
		name string
		rdb  redis.Scripter
	}{
		{"nil", nil},
		{"*redis.Client", (*redis.Client)(nil)},
		{"*redis.ClusterClient", (*redis.ClusterClient)(nil)},
		{"*redis.Ring", (*redis.Ring)(nil)},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, err := New(c.rdb)
			if l != nil || err == nil || err.Error() != "ratewindow: nil redis client" {
				t.Fatalf("New(%s) = %v, %v; want ratewindow: nil redis client", c.name, l, err)
			}
		})
	}
}
