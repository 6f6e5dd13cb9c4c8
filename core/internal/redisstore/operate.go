package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// The operating methods (store.Operator) run plain commands: an override,
// a block, the denied keys' sorted sets and the registry are each one key.
// A key's override lives under its hash tag ("rw:{k}:v2:o"), where the
// decision's script reads it with the key's other keys (see decide in
// algorithms.lua), as "<algorithm> <window µs> <count>" for each limit.

// overrideName is the name of a key's override key, after its tag.
const overrideName = keyFormat + "o"

// cmdable returns the client as a redis.Cmdable: every client New takes is one.
func (s *Store) cmdable() (redis.Cmdable, error) {
	c, ok := s.t.rdb.(redis.Cmdable)
	if !ok {
		return nil, fmt.Errorf("ratewindow: a %T cannot run the operating commands", s.t.rdb)
	}
	return c, nil
}

// ownKey returns key's block key (blockName) or override key (overrideName).
func (s *Store) ownKey(key, name string) string { return Tag(s.prefix, key) + name }

// SetOverride stores r.Limits as r.Key's override, for ttl (0: no TTL).
func (s *Store) SetOverride(ctx context.Context, r store.Request, ttl time.Duration) error {
	c, err := s.cmdable()
	if err != nil {
		return err
	}
	b := make([]byte, 0, 24*len(r.Limits))
	for i, l := range r.Limits {
		if i > 0 {
			b = append(b, ' ')
		}
		b = appendSpaced(strconv.AppendInt(b, int64(l.Algorithm), 10), micros(l.Window), l.Count)
	}
	px := time.Duration(0)
	if ttl > 0 {
		px = max((ttl+time.Millisecond-1)/time.Millisecond*time.Millisecond, time.Millisecond) // whole ms, up
	}
	return s.opError("set override", c.Set(ctx, s.ownKey(r.Key, overrideName), string(b), px).Err())
}

// Override reads r.Key's override and its TTL.
func (s *Store) Override(ctx context.Context, r store.Request) ([]store.Limit, time.Duration, error) {
	c, err := s.cmdable()
	if err != nil {
		return nil, 0, err
	}
	key := s.ownKey(r.Key, overrideName)
	var get *redis.StringCmd
	var ttl *redis.DurationCmd
	_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		get, ttl = p.Get(ctx, key), p.PTTL(ctx, key)
		return nil
	})
	if errors.Is(err, redis.Nil) {
		return nil, 0, nil
	} else if err != nil {
		return nil, 0, s.opError("read override", err)
	}
	limits, err := parseOverride(get.Val())
	if err != nil {
		return nil, 0, err
	}
	return limits, max(ttl.Val(), 0), nil
}

// parseOverride reads an override key's value.
func parseOverride(v string) ([]store.Limit, error) {
	f := strings.Fields(v)
	if len(f) == 0 || len(f)%3 != 0 {
		return nil, fmt.Errorf("%w: override %q", store.ErrUnexpectedReply, v)
	}
	limits := make([]store.Limit, len(f)/3)
	for i := range limits {
		var n [3]int64
		for j := range n {
			x, err := strconv.ParseInt(f[3*i+j], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%w: override %q", store.ErrUnexpectedReply, v)
			}
			n[j] = x
		}
		limits[i] = store.Limit{Algorithm: store.Algorithm(n[0]), Window: time.Duration(n[1]) * time.Microsecond, Count: n[2]}
	}
	return limits, nil
}

// RemoveOverride deletes r.Key's override key.
func (s *Store) RemoveOverride(ctx context.Context, r store.Request) error {
	return s.del(ctx, "remove override", s.ownKey(r.Key, overrideName))
}

// Unblock deletes r.Key's block key.
func (s *Store) Unblock(ctx context.Context, r store.Request) error {
	return s.del(ctx, "unblock", s.ownKey(r.Key, blockName))
}

func (s *Store) del(ctx context.Context, op, key string) error {
	c, err := s.cmdable()
	if err != nil {
		return err
	}
	return s.opError(op, c.Del(ctx, key).Err())
}

// Blocked reads r.Key's block key: the µs its block ends.
func (s *Store) Blocked(ctx context.Context, r store.Request) (time.Duration, error) {
	c, err := s.cmdable()
	if err != nil {
		return 0, err
	}
	v, err := c.Get(ctx, s.ownKey(r.Key, blockName)).Int64()
	switch {
	case errors.Is(err, redis.Nil):
		return 0, nil
	case err != nil:
		return 0, s.opError("read block", err)
	}
	now := r.Now
	if now == 0 {
		t, err := c.Time(ctx).Result()
		if err != nil {
			return 0, s.opError("read time", err)
		}
		now = t.UnixMicro()
	}
	return time.Duration(max(v-now, 0)) * time.Microsecond, nil
}

// deniedKey returns the sorted set of rule's denials in minute m: every
// minute of a rule in one slot ("rw:denied{api}:v2:29600000").
func (s *Store) deniedKey(rule string, m int64) string {
	return string(strconv.AppendInt(append(appendTag(nil, s.prefix+"denied", rule), keyFormat...), m, 10))
}

// CountDenied adds denials to the minute's sorted set, keeps its
// store.TopKept members of the highest scores, and sets its TTL.
func (s *Store) CountDenied(ctx context.Context, rule string, denials map[string]int64, now int64) error {
	c, err := s.cmdable()
	if err != nil {
		return err
	}
	m := store.Minute(now)
	key := s.deniedKey(rule, m)
	ttl := time.Duration((m+1)*int64(time.Minute/time.Microsecond)-now)*time.Microsecond + store.DeniedTTL
	_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, n := range denials {
			p.ZIncrBy(ctx, key, float64(n), k)
		}
		p.ZRemRangeByRank(ctx, key, 0, -store.TopKept-1)
		p.PExpire(ctx, key, ttl)
		return nil
	})
	return s.opError("count denials", err)
}

// TopDenied sums the minutes' sorted sets (ZUNION).
func (s *Store) TopDenied(ctx context.Context, rule string, since time.Duration, now int64) (map[string]int64, error) {
	c, err := s.cmdable()
	if err != nil {
		return nil, err
	}
	var keys []string
	for m := store.Minute(now - since.Microseconds()); m <= store.Minute(now); m++ {
		keys = append(keys, s.deniedKey(rule, m))
	}
	zs, err := c.ZUnionWithScores(ctx, redis.ZStore{Keys: keys}).Result()
	if err != nil {
		return nil, s.opError("read denials", err)
	}
	top := make(map[string]int64, len(zs))
	for _, z := range zs {
		if k, ok := z.Member.(string); ok {
			top[k] = int64(z.Score)
		}
	}
	return top, nil
}

// registryKey is the hash of published rules: name: "<expires µs> <value>".
func (s *Store) registryKey() string { return s.prefix + keyFormat + "rules" }

// Publish writes entries to the registry, drops its expired entries and
// renews its TTL, after checking the bound on what it would hold.
func (s *Store) Publish(ctx context.Context, entries map[string]string, now int64) error {
	c, err := s.cmdable()
	if err != nil {
		return err
	}
	all, err := c.HGetAll(ctx, s.registryKey()).Result()
	if err != nil {
		return s.opError("read rules", err)
	}
	var expired []string
	n := len(entries)
	for name, v := range all {
		_, live := registryValue(v, now)
		_, again := entries[name]
		switch {
		case !live:
			expired = append(expired, name)
		case !again:
			n++
		}
	}
	if n > store.MaxPublished {
		return fmt.Errorf("ratewindow: %d rules published, above %d", n, store.MaxPublished)
	}
	until := strconv.FormatInt(now+store.PublishTTL.Microseconds(), 10) + " "
	fields := make([]any, 0, 2*len(entries))
	for name, v := range entries {
		fields = append(fields, name, until+v)
	}
	_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		if len(expired) > 0 {
			p.HDel(ctx, s.registryKey(), expired...)
		}
		if len(fields) > 0 {
			p.HSet(ctx, s.registryKey(), fields...)
		}
		p.PExpire(ctx, s.registryKey(), store.PublishTTL)
		return nil
	})
	return s.opError("publish rules", err)
}

// Published reads the registry's entries live at now.
func (s *Store) Published(ctx context.Context, now int64) (map[string]string, error) {
	c, err := s.cmdable()
	if err != nil {
		return nil, err
	}
	all, err := c.HGetAll(ctx, s.registryKey()).Result()
	if err != nil {
		return nil, s.opError("read rules", err)
	}
	live := make(map[string]string, len(all))
	for name, v := range all {
		if value, ok := registryValue(v, now); ok {
			live[name] = value
		}
	}
	return live, nil
}

// registryValue returns the value of a registry entry v and whether it is
// live at now.
func registryValue(v string, now int64) (string, bool) {
	until, value, _ := strings.Cut(v, " ")
	t, err := strconv.ParseInt(until, 10, 64)
	return value, err == nil && t > now
}

// opError wraps a failed operating command's err; nil stays nil.
func (s *Store) opError(op string, err error) error {
	if err == nil {
		return nil
	}
	return &store.Error{Replied: replied(err), Err: fmt.Errorf("ratewindow: %s: %w", op, explainRefusal(err))}
}
