package core

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/internal/stall"
)

// The cluster tests share the test binary's three-master cluster. None of
// them is parallel: two of them stall a master or move a slot, which must
// not happen under another test.

// settledCluster returns a client of the test binary's cluster once a
// decision on keys of every master succeeds without redirects piling up
// (right after the cluster is created, the nodes may still disagree for a
// moment, which is not what these tests are about).
func settledCluster(t *testing.T) (*redistest.Cluster, *redis.ClusterClient) {
	t.Helper()
	cl := redistest.NewCluster(t)
	cc := cl.Client(t)
	l, err := New(cc, WithPrefix(uniquePrefix(t)), WithTimeout(5*time.Second), WithDenyCache(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < 30; i++ {
		_, err, d := faultAllow(ctx, l, fmt.Sprint("settle-", i), PerSecond(1))
		if err != nil || d > 50*time.Millisecond {
			if time.Now().After(deadline) {
				t.Fatalf("the cluster does not settle: %v after %v", err, d)
			}
			i = -1 // again, from the first key
			time.Sleep(20 * time.Millisecond)
		}
	}
	return cl, cc
}

// keySlot is the Redis Cluster slot of a key: CRC16 (XMODEM) of its hash
// tag, or of the whole key, mod 16384.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// TestClusterBracesThreeLimits: keys with braces, long keys and plain keys
// under three limits (one per algorithm) are one script call with no
// CROSSSLOT error: every storage key of one call is in one slot.
func TestClusterBracesThreeLimits(t *testing.T) {
	_, cc := settledCluster(t)
	prefix := uniquePrefix(t)
	l, rec := faultLimiter(t, cc, FailClosed, 1, WithPrefix(prefix), WithTimeout(patient))
	ctx := context.Background()
	limits := []Limit{PerSecond(2), PerMinute(3).With(SlidingCounter), PerHour(4).With(SlidingBuckets)}
	for _, key := range []string{"{user}:42", "}{", "a{b}c", "{}", "user:42", strings.Repeat("{x}", 100)} {
		for i := int64(1); i <= 2; i++ {
			r, err := l.Allow(ctx, key, limits...)
			if err != nil || !r.Allowed || r.Remaining != 2-i {
				t.Fatalf("key %.12q request %d: %+v %v", key, i, r, err)
			}
		}
		if r, err := l.Allow(ctx, key, limits...); err != nil || r.Allowed || r.Limit != limits[0] {
			t.Fatalf("key %.12q: third request %+v %v", key, r, err)
		}
		slots := map[int]bool{}
		tag := keyTag(prefix, key)
		for _, lim := range limits {
			sk := storageKey(tag, lim)
			got, err := cc.ClusterKeySlot(ctx, sk).Result()
			if err != nil {
				t.Fatal(err)
			}
			if int(got) != keySlot(sk) {
				t.Fatalf("CLUSTER KEYSLOT %q = %d, keySlot says %d", sk, got, keySlot(sk))
			}
			if n, err := cc.Exists(ctx, sk).Result(); err != nil || n != 1 {
				t.Fatalf("%q not stored: %d %v", sk, n, err)
			}
			slots[int(got)] = true
		}
		if len(slots) != 1 {
			t.Fatalf("key %.12q: storage keys in slots %v", key, slots)
		}
	}
	if c := tallyEvents(rec.take()); c.failed != 0 {
		t.Fatalf("%d failures", c.failed)
	}
}

// TestClusterSpread: the keys of 3,000 users spread over all three masters,
// each master holding exactly the keys of the slots it serves.
func TestClusterSpread(t *testing.T) {
	_, cc := settledCluster(t)
	prefix := uniquePrefix(t)
	l, _ := faultLimiter(t, cc, FailClosed, 1, WithPrefix(prefix), WithTimeout(patient))
	ctx := context.Background()
	const users = 3000
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < users; i += 8 {
				if _, err := l.Allow(ctx, fmt.Sprint("user:", i), PerMinute(5)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()

	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{}
	for i := range users {
		s := keySlot(storageKey(keyTag(prefix, fmt.Sprint("user:", i)), PerMinute(5)))
		for _, r := range slots {
			if s >= r.Start && s <= r.End {
				want[r.Nodes[0].Addr]++
			}
		}
	}
	var mu sync.Mutex
	got := map[string]int{}
	err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		n := 0
		it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for it.Next(ctx) {
			n++
		}
		mu.Lock()
		got[c.Options().Addr] = n
		mu.Unlock()
		return it.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || len(want) != 3 {
		t.Fatalf("masters: got %v, want %v", got, want)
	}
	for addr, n := range got {
		if n != want[addr] || n < users/4 {
			t.Fatalf("master %s holds %d keys, want %d (and at least a quarter of %d): %v", addr, n, want[addr], users, got)
		}
	}
	t.Logf("3000 users over the masters: %v", got)
}

// TestClusterDenyCache: on a cluster, 1,000 repeats of a denied key make
// no script call on the master that holds it.
func TestClusterDenyCache(t *testing.T) {
	_, cc := settledCluster(t)
	prefix := uniquePrefix(t)
	l, rec := faultLimiter(t, cc, FailOpen, 1, WithPrefix(prefix), WithTimeout(patient))
	ctx := context.Background()
	lim := PerMinute(1)
	l.Allow(ctx, "k", lim)
	if r, err := l.Allow(ctx, "k", lim); err != nil || r.Allowed {
		t.Fatalf("second request: %+v %v", r, err)
	}
	master, err := cc.MasterForKey(ctx, storageKey(keyTag(prefix, "k"), lim))
	if err != nil {
		t.Fatal(err)
	}
	before := evalCalls(t, master)
	for range 1000 {
		if r, err := l.Allow(ctx, "k", lim); err != nil || r.Allowed {
			t.Fatalf("repeat: %+v %v", r, err)
		}
	}
	calls := evalCalls(t, master) - before
	hits := tallyEvents(rec.take()).cacheHits
	if calls != int64(1000-hits) || calls > 5 {
		t.Fatalf("cluster: %d script calls, %d cache hits", calls, hits)
	}
}

// TestClusterStalledMaster: one master stops answering writes for 400ms
// (CLIENT PAUSE WRITE): decisions on its keys end within the timeout with
// the failure mode, and go back to Redis by themselves after the pause.
func TestClusterStalledMaster(t *testing.T) {
	_, cc := settledCluster(t)
	prefix := uniquePrefix(t)
	l, rec := faultLimiter(t, cc, FailClosed, 1, WithPrefix(prefix))
	ctx := context.Background()
	lim := PerMinute(1000)
	if _, err := l.Allow(ctx, "k", lim); err != nil {
		t.Fatal(err)
	}
	master, err := cc.MasterForKey(ctx, storageKey(keyTag(prefix, "k"), lim))
	if err != nil {
		t.Fatal(err)
	}
	const pause = 400 * time.Millisecond
	if err := master.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	stalls := stall.Start(t)
	var slowest time.Duration
	errs, shed := 0, 0 // shed: Redis answered a moment before, this process short of CPU
	var back time.Duration
	for {
		r, err, d := faultAllow(ctx, l, "k", lim)
		slowest = max(slowest, d)
		beyond(t, stalls, d, DefaultTimeout+250*time.Millisecond, "a decision during the stall")
		if err == nil {
			back = time.Since(paused)
			if !r.Allowed {
				t.Fatalf("after the stall: %+v", r)
			}
			break
		}
		errs++
		if errors.Is(err, ErrShed) {
			shed++
		}
		if r.Allowed || !isBackendError(err) {
			t.Fatalf("fail-closed during the stall: %+v %v", r, err)
		}
		if time.Since(paused) > pause+2*time.Second {
			t.Fatalf("still failing %v after the pause began: %v", time.Since(paused), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	switch {
	case errs == 0 && back >= pause && stalls.Worst() >= 25*time.Millisecond:
		// one decision's calls outlasted the pause, slowed by this process
		t.Logf("inconclusive, this process stalled for %v: no decision answered during the %v stall (back on redis after %v)", stalls.Worst(), pause, back)
		return
	case errs == 0 || back < pause || back > pause+time.Second:
		t.Fatalf("%d errors; back on redis %v after a %v stall", errs, back, pause)
	}
	if c := tallyEvents(rec.take()); c.failed != errs-shed || c.shed != shed {
		t.Fatalf("observer: %d failures and %d shed, callers saw %d errors, %d shed", c.failed, c.shed, errs, shed)
	}
	t.Logf("cluster master stalled %v: %d fail-closed answers, worst decision %v, back on redis %v after the stall began",
		pause, errs, slowest.Round(time.Millisecond), back.Round(time.Millisecond))
}

// TestClusterStalledMasterSparesOthers: while one master stops answering
// writes, many goroutines decide at once on keys of every master. The
// decisions queued for the stalled master wait behind its call in flight,
// and leave at the timeout; those of the other masters, queued and sent to
// their own masters, are answered by Redis, exactly, and in time.
func TestClusterStalledMasterSparesOthers(t *testing.T) {
	_, cc := settledCluster(t)
	prefix := uniquePrefix(t)
	l, _ := faultLimiter(t, cc, FailClosed, 1, WithPrefix(prefix), WithDenyCache(0))
	ctx := context.Background()
	lim := PerMinute(MaxLogCount)
	master := func(key string) string {
		m, err := cc.MasterForKey(ctx, storageKey(keyTag(prefix, key), lim))
		if err != nil {
			t.Fatal(err)
		}
		return m.Options().Addr
	}
	stalled := master("k0")
	var mine, others []string // keys of the stalled master, of the others
	for i := 0; len(mine) < 16 || len(others) < 16; i++ {
		key := fmt.Sprint("k", i)
		if master(key) == stalled {
			mine = append(mine, key)
		} else {
			others = append(others, key)
		}
	}
	mine, others = mine[:16], others[:16]
	for _, key := range append(slices.Clone(mine), others...) { // the slot map is known everywhere
		if _, err, _ := faultAllow(ctx, l, key, lim); err != nil {
			t.Fatal(err)
		}
	}
	pauser := redis.NewClient(&redis.Options{Addr: stalled})
	defer pauser.Close()
	const pause = 600 * time.Millisecond
	// ALL: a PING waits too, so the health check finds the master silent
	// (under WRITE it answers PING: Redis is up, and the decisions go
	// again, then are shed)
	if err := pauser.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	stop := time.Now().Add(pause - 150*time.Millisecond)
	stalls := stall.Start(t)
	var failed, decided atomic.Int64
	var wg sync.WaitGroup
	for i := range 32 {
		key, theirs := mine[i%16], i >= 16
		if theirs {
			key = others[i%16]
		}
		wg.Go(func() {
			remaining := lim.Count - 1 // a goroutine's own key: one decision before
			for time.Now().Before(stop) {
				r, err, d := faultAllow(ctx, l, key, lim)
				// a first decision runs out of time, then the health check
				// waits twice the timeout for the PING's reply
				beyond(t, stalls, d, 3*DefaultTimeout+250*time.Millisecond, "a decision while a master stalled")
				switch {
				case theirs && (err != nil || !r.Allowed || r.Remaining != remaining-1):
					t.Errorf("%s, on a master that answers: %+v %v, want %d remaining", key, r, err, remaining-1)
					return
				case theirs:
					remaining--
					decided.Add(1)
				case err == nil || r.Allowed:
					t.Errorf("%s, on the stalled master: %+v %v, want FailClosed's answer", key, r, err)
					return
				default:
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if decided.Load() == 0 || failed.Load() == 0 {
		t.Fatalf("%d decisions by Redis on the other masters, %d by the failure mode on the stalled one", decided.Load(), failed.Load())
	}
	t.Logf("%d decisions by Redis on the other masters, %d by the failure mode on the stalled one", decided.Load(), failed.Load())
}

// TestClusterResharding moves the slot of a key with three limits to
// another master while the Limiter uses it: while the slot migrates, Redis
// answers TRYAGAIN (some of the call's keys are on either node: the block
// key exists nowhere), which go-redis retries (MaxRedirects) before the
// failure mode answers; once the slot is reassigned, MOVED. Counts survive
// the move.
func TestClusterResharding(t *testing.T) {
	cl, cc := settledCluster(t)
	prefix := uniquePrefix(t)
	l, rec := faultLimiter(t, cc, FailClosed, 1, WithPrefix(prefix), WithTimeout(patient))
	ctx := context.Background()
	limits := []Limit{PerMinute(100), PerHour(100).With(SlidingCounter), PerHour(200).With(SlidingBuckets)}
	remaining := int64(100)
	// a key of this run only (braces: stored under a hashed tag), so that
	// its slot differs from run to run
	mover := "{mover-" + prefix + "}"
	allow := func(step string) (Result, error) {
		t.Helper()
		r, err, d := faultAllow(ctx, l, mover, limits...)
		if d > patient {
			t.Errorf("%s: the decision took %v", step, d)
		}
		if err == nil {
			remaining--
			if !r.Allowed || r.Remaining != remaining {
				t.Fatalf("%s: %+v, want %d remaining", step, r, remaining)
			}
		}
		return r, err
	}
	if _, err := allow("before"); err != nil {
		t.Fatal(err)
	}
	tag := keyTag(prefix, mover)
	var keys []string
	for _, lim := range limits {
		keys = append(keys, storageKey(tag, lim))
	}
	slot := keySlot(keys[0])

	// the nodes, by address, with their ids
	type node struct {
		c  *redis.Client
		id string
	}
	nodes := map[string]node{}
	for _, addr := range cl.Addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { c.Close() })
		id, err := c.Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			t.Fatal(err)
		}
		nodes[addr] = node{c, id}
	}
	srcClient, err := cc.MasterForKey(ctx, keys[0])
	if err != nil {
		t.Fatal(err)
	}
	src := nodes[srcClient.Options().Addr]
	var dst node
	var dstAddr string
	for addr, n := range nodes {
		if n.id != src.id {
			dst, dstAddr = n, addr
			break
		}
	}
	do := func(c *redis.Client, args ...any) {
		t.Helper()
		if err := c.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	migrate := func(from node, toAddr string, keys ...string) {
		t.Helper()
		host, port, _ := net.SplitHostPort(toAddr)
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		do(from.c, args...)
	}
	// drain migrates every key left in the slot from a to bAddr: keys of
	// other tests, or of earlier runs, may share it, and a node refuses to
	// give up a slot while it holds keys in it
	drain := func(a node, bAddr string) {
		t.Helper()
		for {
			left, err := a.c.Do(ctx, "CLUSTER", "GETKEYSINSLOT", slot, 1000).StringSlice()
			if err != nil {
				t.Fatal(err)
			}
			if len(left) == 0 {
				return
			}
			migrate(a, bAddr, left...)
		}
	}
	// move the slot from a to b, with every key in it
	move := func(a, b node, bAddr string) {
		do(b.c, "CLUSTER", "SETSLOT", slot, "IMPORTING", a.id)
		do(a.c, "CLUSTER", "SETSLOT", slot, "MIGRATING", b.id)
		drain(a, bAddr)
		for _, n := range nodes {
			do(n.c, "CLUSTER", "SETSLOT", slot, "NODE", b.id)
		}
	}
	// put the slot back for the other tests of the binary
	reassigned := false
	t.Cleanup(func() {
		if reassigned {
			move(dst, src, srcClient.Options().Addr)
			return
		}
		dst.c.Do(ctx, "CLUSTER", "SETSLOT", slot, "STABLE")
		src.c.Do(ctx, "CLUSTER", "SETSLOT", slot, "STABLE")
	})

	do(dst.c, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.id)
	do(src.c, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.id)
	// some keys moved: TRYAGAIN until the migration ends
	migrate(src, dstAddr, keys[0])
	start := time.Now()
	r, err := allow("mid-migration")
	if err == nil || !isBackendError(err) || !strings.Contains(err.Error(), "TRYAGAIN") || r.Allowed {
		t.Fatalf("mid-migration: %+v %v, want TRYAGAIN answered by fail-closed", r, err)
	}
	// go-redis retries TRYAGAIN (MaxRedirects times, with backoff), then
	// gives up: with the default timeout of 100ms, either comes first
	t.Logf("mid-migration, after %v: %v", time.Since(start).Round(time.Millisecond), err)
	// every limit's key moved: the call also names the key's block key,
	// which exists on neither node (no Block), and a multi-key call in a
	// migrating slot with keys missing is TRYAGAIN until the slot is
	// reassigned
	migrate(src, dstAddr, keys[1:]...)
	if r, err := allow("asked"); err == nil || !strings.Contains(err.Error(), "TRYAGAIN") || r.Allowed {
		t.Fatalf("every key moved: %+v %v, want TRYAGAIN answered by fail-closed", r, err)
	}
	// the slot reassigned: MOVED
	drain(src, dstAddr)
	for _, n := range nodes {
		do(n.c, "CLUSTER", "SETSLOT", slot, "NODE", dst.id)
	}
	reassigned = true
	if _, err := allow("moved"); err != nil {
		t.Fatalf("with MOVED: %v", err)
	}
	if n, err := dst.c.Exists(ctx, keys...).Result(); err != nil || n != 3 {
		t.Fatalf("the new owner holds %d of the 3 keys: %v", n, err)
	}
	ev := rec.take()
	if c := tallyEvents(ev); c.failed != 2 {
		t.Fatalf("observer: %d failures, want 2 (the TRYAGAINs)", c.failed)
	}
	if !ev[1].Failed || ev[1].Fallback != FailClosed || ev[1].Err == nil {
		t.Fatalf("event %+v", ev[1])
	}
}
