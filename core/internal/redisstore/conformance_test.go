package redisstore

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
	"github.com/ratewindow/ratewindow/core/internal/storetest"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

// TestConformance: the Redis store passes the backends' conformance suite
// through the seam alone, on a single server and on a Cluster.
func TestConformance(t *testing.T) {
	for _, c := range []struct {
		name string
		rdb  func(t *testing.T) redis.Scripter
	}{
		{"single", func(t *testing.T) redis.Scripter { return redistest.New(t).Client(t) }},
		{"cluster", func(t *testing.T) redis.Scripter { return redistest.NewCluster(t).Client(t) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb := c.rdb(t)
			storetest.Run(t, func(t *testing.T) store.Store { return New(rdb, "conformance:") })
		})
	}
}
