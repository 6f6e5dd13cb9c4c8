package core

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// The operating methods of a Limiter: what the people running a service
// need from outside the program (the ratewindow command and the admin
// handler build on them). They act on the backend directly: a Redis
// failure is returned, never answered by the failure mode. A key is the
// stored key as the Limiter sees it: a rule's keys are RuleKey(rule, key).

// MaxKeyLen is the longest key the operating methods take (Allow and the
// others take longer ones, kept as their digest).
const MaxKeyLen = 1 << 20

// ErrNoOverride is returned by Limiter.Override for a key without one.
var ErrNoOverride = errors.New("ratewindow: no override")

// Override is a key's own limits (see Limiter.SetOverride).
type Override struct {
	// Limits replace, by their Count, the limits of a call with the same
	// Window and Algorithm; their Name and Precision are not kept.
	Limits []Limit
	TTL    time.Duration // time left; 0: until removed
}

// SetOverride gives key its own limits, on every replica from its next
// decision on, for ttl (0: until RemoveOverride; else 1µs to MaxBlock),
// replacing any override before. An override limit replaces the Count of
// a call's limit with the same Window and Algorithm; a call's limits
// without a match keep theirs, and an override limit without a match in a
// call is ignored by that call. It applies to the units already in the
// window, as a call with another Count does: a lower limit denies until
// enough units have left, a higher one admits the difference, and no window
// ever admits more than the Count in force. The override is read by the
// decision's own script call (with Redis): no cache, no round trip more.
// Override limits must be valid together as a call's (ErrInvalidLimit);
// Reset keeps the override. It forgets this Limiter's cached denials of
// key (another replica's within the deny cache's second, see
// WithDenyCache).
func (l *Limiter) SetOverride(ctx context.Context, key string, ttl time.Duration, limits ...Limit) error {
	if err := validateOp(ctx, key); err != nil {
		return err
	}
	switch {
	case ttl != 0 && (ttl < time.Microsecond || ttl > MaxBlock):
		return fmt.Errorf("%w: override for %s; it must be 0 (until removed) or in [1µs, %s]", ErrInvalidDuration, ttl, MaxBlock)
	case len(limits) == 0:
		return fmt.Errorf("%w: an override of no limits (RemoveOverride removes one)", ErrNoLimits)
	}
	if err := validateLimits(limits); err != nil {
		return err
	}
	defer l.forget(key)
	return l.guard.next.SetOverride(ctx, l.request(key, 1, limits, nil, 0), ttl)
}

// Override returns key's override in force, or ErrNoOverride.
func (l *Limiter) Override(ctx context.Context, key string) (Override, error) {
	if err := validateOp(ctx, key); err != nil {
		return Override{}, err
	}
	ls, ttl, err := l.guard.next.Override(ctx, l.request(key, 1, nil, nil, 0))
	switch {
	case err != nil:
		return Override{}, err
	case len(ls) == 0:
		return Override{}, fmt.Errorf("%w for key %q", ErrNoOverride, key)
	}
	o := Override{Limits: make([]Limit, len(ls)), TTL: ttl}
	for i, sl := range ls {
		o.Limits[i] = Limit{Count: sl.Count, Window: sl.Window, Algorithm: Algorithm(sl.Algorithm)}
	}
	return o, nil
}

// RemoveOverride removes key's override, on every replica from its next
// decision on; nil when there was none. It forgets this Limiter's cached
// denials of key (see SetOverride).
func (l *Limiter) RemoveOverride(ctx context.Context, key string) error {
	if err := validateOp(ctx, key); err != nil {
		return err
	}
	defer l.forget(key)
	return l.guard.next.RemoveOverride(ctx, l.request(key, 1, nil, nil, 0))
}

// Usage is what a key holds under some limits (see Limiter.Usage).
type Usage struct {
	Limits   []LimitUsage  // one per limit, in the call's order, the override applied
	Blocked  time.Duration // time left on a Block or a Penalty's ban; 0: not blocked
	Override *Override     // nil: none
}

// LimitUsage is one limit's part of a Usage.
type LimitUsage struct {
	Limit      Limit         // the limit in force (the override's Count when one applies)
	Used       int64         // Count - Remaining: the units counted now (a blocked key's Count)
	Remaining  int64         // the units the limit admits now, as Peek says
	ResetAfter time.Duration // until the limit is back to its full Count
}

// Usage reports what key holds under limits without consuming anything: a
// Peek of every limit, the override in force applied, with the key's block
// and override. Its errors are Peek's and the backend's.
func (l *Limiter) Usage(ctx context.Context, key string, limits ...Limit) (Usage, error) {
	if err := validateOp(ctx, key); err != nil {
		return Usage{}, err
	}
	if err := validate(ctx, key, 1, limits); err != nil {
		return Usage{}, err
	}
	var u Usage
	switch o, err := l.Override(ctx, key); {
	case err == nil:
		u.Override = &o
	case !errors.Is(err, ErrNoOverride):
		return Usage{}, err
	}
	r := l.request(key, 1, nil, nil, 0)
	blocked, err := l.guard.next.Blocked(ctx, r)
	if err != nil {
		return Usage{}, err
	}
	u.Blocked = blocked
	r = l.request(key, 1, limits, nil, 0)
	d, err := l.guard.next.Allow(ctx, r)
	if err != nil {
		return Usage{}, err
	}
	u.Limits = make([]LimitUsage, len(limits))
	for i, s := range d.States {
		lim := limits[i]
		if s.Count > 0 {
			lim.Count = s.Count
		}
		u.Limits[i] = LimitUsage{Limit: lim, Used: lim.Count - max(s.Remaining, 0), Remaining: max(s.Remaining, 0), ResetAfter: usec(max(s.Reset, 0))}
	}
	return u, nil
}

// Unblock lifts key's Block or Penalty's ban, on every replica, and nothing
// else (Reset also forgets the counts). It forgets this Limiter's cached
// denials of key (another replica's within the deny cache's second).
func (l *Limiter) Unblock(ctx context.Context, key string) error {
	if err := validateOp(ctx, key); err != nil {
		return err
	}
	defer l.forget(key)
	return l.guard.next.Unblock(ctx, l.request(key, 1, nil, nil, 0))
}

// validateOp checks the context and key of an operating method.
func validateOp(ctx context.Context, key string) error {
	switch {
	case ctx == nil:
		return errNilContext
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: a key of %d bytes, above MaxKeyLen %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}

// call a second at most, whatever the flood.
type denied struct {
	mu      sync.Mutex
	tracked map[string]bool             // the rules that track
	pending map[string]map[string]int64 // rule: held key: denials
	held    int                         // keys pending, at most maxPendingDenied
}

const (
	deniedFlushAfter = time.Second
	maxPendingDenied = 4096 // keys held between two flushes; more are not counted
)

// track makes the rule named rule record its denials.
func (l *Limiter) track(rule string) {
	d := &l.denied
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.tracked == nil {
		d.tracked = make(map[string]bool)
	}
	d.tracked[rule] = true
}

// recordDenied counts a denial of key (a rule's key) that reached the store,
// if rule tracks its denials.
func (l *Limiter) recordDenied(rule, key string) {
	d := &l.denied
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.tracked[rule] {
		return
	}
	k := store.HeldKey(strings.TrimPrefix(key, rule+":"))
	if d.pending == nil {
		d.pending = make(map[string]map[string]int64)
		time.AfterFunc(deniedFlushAfter, l.flushDenied)
	}
	keys := d.pending[rule]
	if keys == nil {
		keys = make(map[string]int64)
		d.pending[rule] = keys
	}
	if _, ok := keys[k]; ok || d.held < maxPendingDenied {
		if !ok {
			d.held++
			k = store.OwnKey(k)
		}
		keys[k]++
	}
}

// flushDenied hands the pending denials to the store. A failure loses them:
// the counts are a view, not a limit.
func (l *Limiter) flushDenied() {
	d := &l.denied
	d.mu.Lock()
	pending := d.pending
	d.pending, d.held = nil, 0
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for rule, keys := range pending {
		_ = l.guard.next.CountDenied(ctx, rule, keys, l.micros())
	}
}
