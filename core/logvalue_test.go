package core

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
)

// storedLog returns the times in µs of the units held in a sliding log's
// stored value, oldest first, as algorithms.lua lays it out (compact or
// ring); none for a missing key.
func storedLog(ctx context.Context, rdb redis.Cmdable, key string) ([]int64, error) {
	v, err := rdb.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return decodeLog(v)
}

// decodeLog reads a sliding log's value (see algorithms.lua).
func decodeLog(v []byte) ([]int64, error) {
	uint := func(b []byte) int64 {
		var x int64
		for _, c := range b {
			x = x<<8 | int64(c)
		}
		return x
	}
	if len(v) < 8 {
		return nil, fmt.Errorf("log value of %d bytes", len(v))
	}
	base := uint(v[1:8])
	if w := int(v[0]); w < 16 { // compact
		if w < 1 || w > 7 || (len(v)-8)%w != 0 {
			return nil, fmt.Errorf("compact log: width %d, %d bytes", w, len(v))
		}
		var out []int64
		for i := 8; i < len(v); i += w {
			out = append(out, base+uint(v[i:i+w]))
		}
		return out, nil
	}
	const header = 31
	w := int(v[0]) - 16
	if len(v) < header || w < 1 || w > 7 {
		return nil, fmt.Errorf("ring log: width %d, %d bytes", w, len(v))
	}
	capacity, head, used := int(uint(v[8:11])), int(uint(v[11:14])), int(uint(v[14:17]))
	newest := uint(v[17:24])
	if len(v) != header+capacity*w || head >= capacity || used > capacity || used == 0 {
		return nil, fmt.Errorf("ring log: %d bytes, cap %d, head %d, used %d, width %d", len(v), capacity, head, used, w)
	}
	out := make([]int64, used)
	for i := range out {
		p := header + (head+i)%capacity*w
		out[i] = base + uint(v[p:p+w])
	}
	if out[used-1] != newest {
		return nil, fmt.Errorf("ring log: newest unit at %d, header says %d", out[used-1], newest)
	}
	return out, nil
}

// storedLogLen returns the number of units held in a sliding log's stored
// value (see storedLog).
func storedLogLen(ctx context.Context, rdb redis.Cmdable, key string) (int64, error) {
	times, err := storedLog(ctx, rdb, key)
	return int64(len(times)), err
}

// logLen is storedLogLen for tests: it fails t on an error.
func logLen(t testing.TB, rdb redis.Cmdable, key string) int64 {
	t.Helper()
	n, err := storedLogLen(context.Background(), rdb, key)
	if err != nil {
		t.Fatalf("stored log %s: %v", key, err)
	}
	return n
}
