package core

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/algorithms.lua
	algorithmsLua string
	//go:embed lua/allow.lua
	allowLua string
	//go:embed lua/reserve.lua
	reserveLua string
	//go:embed lua/release.lua
	releaseLua string
	//go:embed lua/reset.lua
	resetLua string
)

// redisStore runs the algorithms as Lua scripts: one EVALSHA per call, with
// an EVAL when the server has not cached the script (NOSCRIPT).
type redisStore struct {
	rdb                                redis.Scripter
	prefix                             string
	allowS, reserveS, releaseS, resetS *redis.Script
}

func newRedisStore(rdb redis.Scripter, prefix string) *redisStore {
	return &redisStore{
		rdb:      rdb,
		prefix:   prefix,
		allowS:   redis.NewScript(algorithmsLua + allowLua),
		reserveS: redis.NewScript(algorithmsLua + reserveLua),
		releaseS: redis.NewScript(releaseLua),
		resetS:   redis.NewScript(resetLua),
	}
}

func (s *redisStore) keys(q *query) []string {
	tag := keyTag(s.prefix, q.key)
	keys := make([]string, len(q.limits))
	for i, l := range q.limits {
		keys[i] = storageKey(tag, l)
	}
	return keys
}

func (s *redisStore) allow(ctx context.Context, q *query) (Result, error) {
	args := make([]any, 0, 3+4*len(q.limits))
	commit := 0
	if q.commit {
		commit = 1
	}
	args = append(args, q.n, commit, q.now)
	for _, l := range q.limits {
		args = append(args, int(l.Algorithm), l.Count, micros(l.Window), micros(l.precision()))
	}
	reply, err := s.allowS.Run(ctx, s.rdb, s.keys(q), args...).Slice()
	if err != nil {
		return Result{}, fmt.Errorf("ratewindow: allow script: %w", err)
	}
	return parseAllow(reply, q.limits)
}

// parseAllow reads allow.lua's reply: {allowed, then per limit remaining,
// retry, reset}.
func parseAllow(reply []any, limits []Limit) (Result, error) {
	if len(reply) != 1+3*len(limits) {
		return Result{}, fmt.Errorf("%w: allow returned %d values for %d limits", ErrUnexpectedReply, len(reply), len(limits))
	}
	ints, err := toInts(reply)
	if err != nil {
		return Result{}, err
	}
	allowed := ints[0] == 1
	var b binder
	for i, l := range limits {
		b.add(l, allowed, ints[1+3*i], ints[2+3*i], ints[3+3*i])
	}
	return b.result(allowed), nil
}

func (s *redisStore) reserve(ctx context.Context, q *query, longest int64) (reservation, error) {
	args := make([]any, 0, 3+2*len(q.limits))
	args = append(args, q.n, q.now, longest)
	for _, l := range q.limits {
		args = append(args, l.Count, micros(l.Window))
	}
	reply, err := s.reserveS.Run(ctx, s.rdb, s.keys(q), args...).Slice()
	if err != nil {
		return reservation{}, fmt.Errorf("ratewindow: reserve script: %w", err)
	}
	ints, err := toInts(reply)
	if err != nil {
		return reservation{}, err
	}
	if len(ints) < 2 {
		return reservation{}, fmt.Errorf("%w: reserve returned %d values", ErrUnexpectedReply, len(ints))
	}
	r := reservation{ok: ints[0] == 1, wait: ints[1]}
	if r.ok {
		if int64(len(ints)-2) != q.n*int64(len(q.limits)) {
			return reservation{}, fmt.Errorf("%w: reserve returned %d members for %d units", ErrUnexpectedReply, len(ints)-2, q.n)
		}
		r.members = ints[2:]
	}
	return r, nil
}

func (s *redisStore) release(ctx context.Context, q *query, r reservation) error {
	args := make([]any, 0, 1+len(r.members))
	args = append(args, q.n)
	for _, m := range r.members {
		args = append(args, m)
	}
	if err := s.releaseS.Run(ctx, s.rdb, s.keys(q), args...).Err(); err != nil {
		return fmt.Errorf("ratewindow: release script: %w", err)
	}
	return nil
}

func (s *redisStore) reset(ctx context.Context, q *query) error {
	if err := s.resetS.Run(ctx, s.rdb, s.keys(q)).Err(); err != nil {
		return fmt.Errorf("ratewindow: reset script: %w", err)
	}
	return nil
}

// toInts converts a script's reply to integers. Lua numbers arrive as
// int64; anything else is an unexpected reply, never a panic.
func toInts(reply []any) ([]int64, error) {
	ints := make([]int64, len(reply))
	for i, v := range reply {
		switch v := v.(type) {
		case int64:
			ints[i] = v
		case string:
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%w: value %d is %q", ErrUnexpectedReply, i, v)
			}
			ints[i] = n
		default:
			return nil, fmt.Errorf("%w: value %d is %T", ErrUnexpectedReply, i, v)
		}
	}
	return ints, nil
}
