package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// The operating methods (store.Operator) run plain commands but for a key's
// block and override: both live in its block key ("rw:{k}:block", see
// own_of in algorithms.lua), where the decision's script reads them in the
// MGET it makes anyway, so own.lua reads and changes them, keeping the other
// half. The override is "<algorithm> <window µs> <count>" for each limit.

// cmdable returns the client as a redis.Cmdable: every client New takes is one.
func (s *Store) cmdable() (redis.Cmdable, error) {
	c, ok := s.t.rdb.(redis.Cmdable)
	if !ok {
		return nil, fmt.Errorf("ratewindow: a %T cannot run the operating commands", s.t.rdb)
	}
	return c, nil
}

// ownState is a key's block and override as own.lua answers.
type ownState struct {
	blocked  time.Duration // 0: none
	override string        // "": none
	left     time.Duration // the override's time left; 0: no end
}

// own runs own.lua's op on r.Key's block key, with its arguments after op.
func (s *Store) own(ctx context.Context, r store.Request, op string, args ...any) (ownState, error) {
	c := s.newCall(s.ownS, store.Request{Key: r.Key}, withBlock)
	c.args = append(append(c.args, r.Now, op), args...)
	reply, err := s.runScript(ctx, c, r.Deadline)
	if err != nil {
		return ownState{}, err
	}
	vals, ok := reply.([]any)
	if !ok || len(vals) != 3 {
		return ownState{}, fmt.Errorf("%w: own returned %v", store.ErrUnexpectedReply, reply)
	}
	b, okb := vals[0].(int64)
	left, okl := vals[1].(int64)
	o, oko := vals[2].(string)
	if !okb || !okl || !oko {
		return ownState{}, fmt.Errorf("%w: own returned %v", store.ErrUnexpectedReply, reply)
	}
	return ownState{blocked: time.Duration(b) * time.Microsecond, override: o, left: time.Duration(max(left, 0)) * time.Microsecond}, nil
}

// SetOverride stores r.Limits as r.Key's override, for ttl (0: no end).
func (s *Store) SetOverride(ctx context.Context, r store.Request, ttl time.Duration) error {
	b := make([]byte, 0, 24*len(r.Limits))
	for i, l := range r.Limits {
		if i > 0 {
			b = append(b, ' ')
		}
		b = appendSpaced(strconv.AppendInt(b, int64(l.Algorithm), 10), micros(l.Window), l.Count)
	}
	end := int64(0) // no end
	if ttl > 0 {
		end = max(micros(ttl), 1)
	}
	_, err := s.own(ctx, r, "set", string(b), end)
	return err
}

// Override reads r.Key's override and its time left.
func (s *Store) Override(ctx context.Context, r store.Request) ([]store.Limit, time.Duration, error) {
	st, err := s.own(ctx, r, "read")
	if err != nil || st.override == "" {
		return nil, 0, err
	}
	limits, err := parseOverride(st.override)
	if err != nil {
		return nil, 0, err
	}
	return limits, st.left, nil
}

// parseOverride reads an override as own.lua keeps it.
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

// RemoveOverride drops r.Key's override; its block stays.
func (s *Store) RemoveOverride(ctx context.Context, r store.Request) error {
	_, err := s.own(ctx, r, "rm")
	return err
}

// Unblock lifts r.Key's block; its override stays.
func (s *Store) Unblock(ctx context.Context, r store.Request) error {
	_, err := s.own(ctx, r, "unblock")
	return err
}

// Blocked reads how long r.Key's block lasts from r.Now.
func (s *Store) Blocked(ctx context.Context, r store.Request) (time.Duration, error) {
	st, err := s.own(ctx, r, "read")
	return st.blocked, err
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
