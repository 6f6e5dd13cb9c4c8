package main

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// writeFormerKeys writes, under prefix, limit keys of the format before
// v2 as that format left them (git log -S'"rbc"[l.Algorithm]' on
// core/internal/redisstore/keys.go): a compact log, a counter and a bucket
// hash with their TTLs, and two sliding logs of over 4,096 units as it
// wrote them, hashes whose TTL was set before they existed, so none. The
// tags differ, so that a Cluster holds them on several masters. It
// returns their names.
func writeFormerKeys(t *testing.T, rdb redis.UniversalClient, prefix string) []string {
	t.Helper()
	ctx := context.Background()
	page := strings.Repeat("\x00\x06\x41\x2c\x8e\x1f\x00", 145)
	keys := map[string]func(k string) error{
		prefix + "{api:ip:10.0.3.1}:r1m": func(k string) error {
			return rdb.Set(ctx, k, "\x02\x00\x06\x41\x2c\x8e\x1f\x00\x00\x00\x00\x0a", time.Hour).Err()
		},
		prefix + "{api:ip:10.0.3.2}:c1m": func(k string) error { return rdb.Set(ctx, k, 335544432, time.Hour).Err() },
		prefix + "{api:ip:10.0.3.3}:b1h/1m": func(k string) error {
			if err := rdb.HSet(ctx, k, "3", 9, "t", 9).Err(); err != nil {
				return err
			}
			return rdb.Expire(ctx, k, time.Hour).Err()
		},
		prefix + "{api:ip:10.0.3.4}:r1s":      func(k string) error { return rdb.HSet(ctx, k, "h", strings.Repeat("\x00", 35), "0", page).Err() },
		prefix + "{login:ip:10.0.3.5}:r250ms": func(k string) error { return rdb.HSet(ctx, k, "h", strings.Repeat("\x00", 35), "0", page).Err() },
	}
	var names []string
	for k, write := range keys {
		if err := write(k); err != nil {
			t.Fatal(err)
		}
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// keysUnder returns every key of rdb that starts with prefix, on every
// master, sorted.
func keysUnder(t *testing.T, rdb redis.UniversalClient, prefix string) []string {
	t.Helper()
	keys, err := scanAll(context.Background(), rdb, "*", regexp.MustCompile("^"+regexp.QuoteMeta(prefix)))
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func TestCleanupDeletesOnlyFormerKeys(t *testing.T) {
	backends(t, func(t *testing.T, s *service) {
		ctx := context.Background()
		rdb := s.rdb.(redis.UniversalClient)
		// The keys of this release: counts, a denial recorded for top, a
		// block, an override, the published rules; and keys that look alike
		// but are not the former format's limit keys.
		for range 7 {
			s.hit(t, 0, "ip:10.0.2.1")
		}
		s.mustRun(t, "block", "-for", "1m", "api", "ip:10.0.2.2")
		s.mustRun(t, "override", "set", "api", "ip:10.0.2.3", "50/m, 500/h")
		for _, k := range []string{s.prefix + "x:{api:ip:10.0.2.4}:r1m", s.prefix + "{api:ip:10.0.2.4}:rules", s.prefix + "{api:ip:10.0.2.4}:r1m:x"} {
			if err := rdb.Set(ctx, k, "1", time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
		}
		current := keysUnder(t, rdb, s.prefix)
		if len(current) < 8 {
			t.Fatalf("the service wrote only %q", current)
		}
		former := writeFormerKeys(t, rdb, s.prefix)

		for _, answer := range []string{"", "n\n"} {
			_, errOut, code := s.cli(t, answer, "cleanup")
			if code != exitFail || !strings.Contains(errOut, "cleanup: delete 5 limit keys of the former format") ||
				!strings.Contains(errOut, "2 of them without a TTL") || !strings.Contains(errOut, "nothing changed") {
				t.Errorf("answer %q: exit %d, %q", answer, code, errOut)
			}
		}
		if got := keysUnder(t, rdb, s.prefix); len(got) != len(current)+len(former) {
			t.Fatalf("a refused cleanup left %q; before it: %q and %q; %s", got, current, former, missing(ctx, rdb, got, current, former))
		}

		var rep cleanupReport
		out, errOut, code := s.cli(t, "y\n", "cleanup", "-json")
		if code != exitOK {
			t.Fatalf("cleanup: exit %d\n%s\n%s", code, out, errOut)
		}
		decode(t, out, &rep)
		if rep != (cleanupReport{Prefix: s.prefix, Found: 5, WithoutTTL: 2, Deleted: 5}) {
			t.Errorf("report %+v", rep)
		}
		if got := keysUnder(t, rdb, s.prefix); !slices.Equal(got, current) {
			t.Errorf("after cleanup:\n%q\nwant the current keys alone:\n%q", got, current)
		}
		if s.hit(t, 1, "ip:10.0.2.1") != 429 || s.hit(t, 0, "ip:10.0.2.2") != 429 {
			t.Error("cleanup changed a count or a block of this release")
		}

		contains(t, "a second cleanup", s.mustRun(t, "cleanup"), "no limit key of the former format")
		// One key: no question.
		if err := rdb.HSet(ctx, s.prefix+"{api:ip:10.0.3.9}:r1m", "h", "x").Err(); err != nil {
			t.Fatal(err)
		}
		out, errOut, code = s.cli(t, "", "cleanup")
		if code != exitOK || strings.Contains(errOut, "Go on?") || !strings.Contains(out, "deleted 1 of 1") {
			t.Errorf("cleanup of one key: exit %d\n%s\n%s", code, out, errOut)
		}
	})
}

// missing describes the keys of want that got lacks, with their TTLs now,
// for a test's failure.
func missing(ctx context.Context, rdb redis.UniversalClient, got []string, want ...[]string) string {
	var b strings.Builder
	for _, keys := range want {
		for _, k := range keys {
			if !slices.Contains(got, k) {
				fmt.Fprintf(&b, "%s missing (PTTL %v, EXISTS %d); ", k, rdb.PTTL(ctx, k).Val(), rdb.Exists(ctx, k).Val())
			}
		}
	}
	return b.String()
}

// A prefix with the characters of a SCAN pattern finds its own keys, and
// only them.
func TestCleanupPrefixWithPatternCharacters(t *testing.T) {
	backends(t, func(t *testing.T, s *service) {
		rdb := s.rdb.(redis.UniversalClient)
		odd := s.prefix + `[a]*?\:`
		former := writeFormerKeys(t, rdb, odd)
		beside := writeFormerKeys(t, rdb, s.prefix+"a:")
		out := s.mustRun(t, "-yes", "-prefix", odd, "cleanup")
		contains(t, "cleanup", out, "deleted 5 of 5")
		if got := keysUnder(t, rdb, odd); len(got) != 0 {
			t.Errorf("left %q of %q", got, former)
		}
		if got := keysUnder(t, rdb, s.prefix+"a:"); !slices.Equal(got, beside) {
			t.Errorf("the keys of another prefix: %q, want %q", got, beside)
		}
	})
}
