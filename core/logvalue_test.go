package core

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
)

// storedLog returns the times in µs of the units held in a sliding log,
// oldest first, in either of its layouts (see algorithms.lua): a compact
// string, or a sorted set whose members "<units>:<time>" are scored by
// their time and whose member '#' is scored minus the units of the others;
// none for a missing key. The log is read in one script call, so that a
// log that changes layout meanwhile is read whole in one of them.
func storedLog(ctx context.Context, rdb redis.Cmdable, key string) ([]int64, error) {
	const read = `local t = redis.call('TYPE', KEYS[1]).ok
if t == 'string' then return {t, redis.call('GET', KEYS[1])} end
if t == 'zset' then return {t, redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')} end
return {t}`
	reply, err := rdb.Eval(ctx, read, []string{key}).Slice()
	if err != nil {
		return nil, err
	}
	switch typ := fmt.Sprint(reply[0]); {
	case typ == "none":
		return nil, nil
	case typ == "string" && len(reply) == 2:
		return decodeLog([]byte(fmt.Sprint(reply[1])))
	case typ == "zset" && len(reply) == 2:
		flat, _ := reply[1].([]any)
		var zs []redis.Z
		for i := 0; i+1 < len(flat); i += 2 {
			score, err := strconv.ParseFloat(fmt.Sprint(flat[i+1]), 64)
			if err != nil {
				return nil, err
			}
			zs = append(zs, redis.Z{Member: fmt.Sprint(flat[i]), Score: score})
		}
		return decodeSortedLog(zs)
	default:
		return nil, fmt.Errorf("a sliding log of type %s", typ)
	}
}

// decodeLog reads a sliding log's compact value: its offsets' width w,
// the base (7 bytes), then each unit's offset, w bytes, big-endian.
func decodeLog(v []byte) ([]int64, error) {
	uint := func(b []byte) int64 {
		var x int64
		for _, c := range b {
			x = x<<8 | int64(c)
		}
		return x
	}
	if len(v) < 9 {
		return nil, fmt.Errorf("log value of %d bytes", len(v))
	}
	w := int(v[0])
	if w < 1 || w > 7 || (len(v)-8)%w != 0 {
		return nil, fmt.Errorf("compact log: width %d, %d bytes", w, len(v))
	}
	base := uint(v[1:8])
	var out []int64
	for i := 8; i < len(v); i += w {
		out = append(out, base+uint(v[i:i+w]))
	}
	return out, nil
}

// decodeSortedLog reads a sliding log's sorted set, its members in order
// of score (ZRANGE WITHSCORES).
func decodeSortedLog(zs []redis.Z) ([]int64, error) {
	if len(zs) < 2 || zs[0].Member != "#" {
		return nil, fmt.Errorf("sorted log of %d members without '#' first", len(zs))
	}
	var out []int64
	for _, z := range zs[1:] {
		var at, units int64
		if _, err := fmt.Sscanf(fmt.Sprint(z.Member), "%d:%d", &units, &at); err != nil || at != int64(z.Score) || units < 1 {
			return nil, fmt.Errorf("sorted log member %q scored %v", z.Member, z.Score)
		}
		for range units {
			out = append(out, at)
		}
	}
	if int64(-zs[0].Score) != int64(len(out)) {
		return nil, fmt.Errorf("sorted log of %d units: '#' says %v", len(out), -zs[0].Score)
	}
	return out, nil
}

// storedLogLen returns the number of units held in a sliding log (see
// storedLog).
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
