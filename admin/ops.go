package admin

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/ratewindow/ratewindow/core"
)

// Errors of the operations, beside core's (ErrInvalidKey, ErrInvalidLimit,
// ErrInvalidDuration, ErrNoOverride). Test for them with errors.Is.
var (
	// ErrUnknownRule: no rule of that name is published (see core.Limiter.Publish).
	ErrUnknownRule = errors.New("ratewindow: unknown rule")
	// ErrUnknownKey: the key holds nothing under the rule (no unit in any
	// window, no block, no override), so a usage or a reset of it is most
	// likely a mistyped key.
	ErrUnknownKey = errors.New("ratewindow: unknown key")
	// ErrNotBlocked: Unblock found no block or ban on the key.
	ErrNotBlocked = errors.New("ratewindow: key not blocked")
	// ErrNotTracked: Top asked about a rule that does not record its
	// denied keys (core.Rule.TrackDenied).
	ErrNotTracked = errors.New("ratewindow: rule does not record its denied keys")
)

// errBadInput marks a parameter that cannot be read or is out of range,
// where core has no sentinel for it.
var errBadInput = errors.New("ratewindow: bad parameter")

// Defaults of Top.
const (
	DefaultTopN     = 10
	DefaultTopSince = 5 * time.Minute
)

// Ops runs the operators' operations on the rules a Limiter's application
// published: by rule name and key, as a person types them. The admin
// handler and the ratewindow command are its two front ends. Its methods
// may be called from several goroutines.
type Ops struct {
	l *core.Limiter
}

// NewOps returns the operations on l: a Limiter on the Redis (and with the
// prefix) of the application to operate.
func NewOps(l *core.Limiter) (*Ops, error) {
	if l == nil {
		return nil, errors.New("ratewindow: admin: nil Limiter")
	}
	return &Ops{l: l}, nil
}

// Rules returns the published rules, sorted by name; none is an empty list.
func (o *Ops) Rules(ctx context.Context) ([]Rule, error) {
	infos, err := o.l.Rules(ctx)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	rules := make([]Rule, 0, len(infos))
	for _, info := range infos {
		rules = append(rules, ruleView(info))
	}
	return rules, nil
}

// rule returns the published rule named name, or an error wrapping
// ErrUnknownRule that lists the names published.
func (o *Ops) rule(ctx context.Context, name string) (core.RuleInfo, error) {
	if name == "" {
		return core.RuleInfo{}, fmt.Errorf("%w: a rule name is needed", errBadInput)
	}
	infos, err := o.l.Rules(ctx)
	if err != nil {
		return core.RuleInfo{}, fmt.Errorf("rules: %w", err)
	}
	names := make([]string, 0, len(infos))
	for _, info := range infos {
		if info.Name == name {
			return info, nil
		}
		names = append(names, info.Name)
	}
	if len(names) == 0 {
		return core.RuleInfo{}, fmt.Errorf("%w %q: no rule is published under this prefix (the application publishes its rules with Limiter.Publish)", ErrUnknownRule, name)
	}
	return core.RuleInfo{}, fmt.Errorf("%w %q (published: %s)", ErrUnknownRule, name, strings.Join(names, ", "))
}

// target returns the published rule named rule, after checking that key
// names a key: an empty one is an error wrapping core.ErrInvalidKey (the
// rule's name alone is a key the Limiter would take).
func (o *Ops) target(ctx context.Context, rule, key string) (core.RuleInfo, error) {
	if key == "" {
		return core.RuleInfo{}, fmt.Errorf("%w: empty key", core.ErrInvalidKey)
	}
	return o.rule(ctx, rule)
}

// Usage returns what key holds under rule, consuming nothing. A key that
// holds nothing is an error wrapping ErrUnknownKey.
func (o *Ops) Usage(ctx context.Context, rule, key string) (Usage, error) {
	info, err := o.target(ctx, rule, key)
	if err != nil {
		return Usage{}, err
	}
	return o.usage(ctx, info, key)
}

// usage is Usage for a rule already looked up.
func (o *Ops) usage(ctx context.Context, info core.RuleInfo, key string) (Usage, error) {
	u, err := o.l.Usage(ctx, core.RuleKey(info.Name, key), info.Limits...)
	if err != nil {
		return Usage{}, fmt.Errorf("usage of %q under %q: %w", key, info.Name, err)
	}
	v := Usage{Rule: info.Name, Key: key, Blocked: Duration(u.Blocked)}
	held := u.Blocked > 0 || u.Override != nil
	for _, lu := range u.Limits {
		held = held || lu.Used > 0
		v.Limits = append(v.Limits, LimitUsage{Limit: limitView(lu.Limit), Used: lu.Used, Remaining: lu.Remaining, ResetAfter: Duration(lu.ResetAfter)})
	}
	if u.Override != nil {
		ov := overrideView(info.Name, key, *u.Override)
		v.Override = &ov
	}
	if !held {
		hint := ""
		if _, err := netip.ParseAddr(key); err == nil {
			hint = `; keyfuncs.IP writes a client's key as "ip:" and its address`
		}
		return v, fmt.Errorf("%w %q under rule %q: nothing recorded (no unit in any window, no block, no override)%s", ErrUnknownKey, key, info.Name, hint)
	}
	return v, nil
}

// Reset forgets the units key holds under rule and lifts its block, on
// every replica (each forgets its cached denials of key within a second).
// A key that holds nothing is an error wrapping ErrUnknownKey, and nothing
// is written.
func (o *Ops) Reset(ctx context.Context, rule, key string) error {
	info, err := o.target(ctx, rule, key)
	if err != nil {
		return err
	}
	if _, err := o.usage(ctx, info, key); err != nil {
		return err
	}
	if err := o.l.Reset(ctx, core.RuleKey(info.Name, key), info.Limits...); err != nil {
		return fmt.Errorf("reset %q under %q: %w", key, info.Name, err)
	}
	return nil
}

// Block denies key under rule for d on every replica (d in [1µs,
// core.MaxBlock]); a later Block never shortens an earlier one.
func (o *Ops) Block(ctx context.Context, rule, key string, d time.Duration) error {
	info, err := o.target(ctx, rule, key)
	if err != nil {
		return err
	}
	if err := o.l.Block(ctx, core.RuleKey(info.Name, key), d); err != nil {
		return fmt.Errorf("block %q under %q: %w", key, info.Name, err)
	}
	return nil
}

// Unblock lifts key's block or ban under rule, and nothing else. A key
// that is not blocked is an error wrapping ErrNotBlocked.
func (o *Ops) Unblock(ctx context.Context, rule, key string) error {
	info, err := o.target(ctx, rule, key)
	if err != nil {
		return err
	}
	u, err := o.usage(ctx, info, key)
	if err != nil && !errors.Is(err, ErrUnknownKey) {
		return err
	}
	if u.Blocked == 0 {
		return fmt.Errorf("%w: %q under rule %q", ErrNotBlocked, key, info.Name)
	}
	if err := o.l.Unblock(ctx, core.RuleKey(info.Name, key)); err != nil {
		return fmt.Errorf("unblock %q under %q: %w", key, info.Name, err)
	}
	return nil
}

// SetOverride gives key its own limits under rule, for ttl (0: until
// removed). spec lists counts per window of the rule's limits, as
// ParseOverride reads them. It returns the override as stored.
func (o *Ops) SetOverride(ctx context.Context, rule, key, spec string, ttl time.Duration) (Override, error) {
	info, err := o.target(ctx, rule, key)
	if err != nil {
		return Override{}, err
	}
	limits, err := ParseOverride(info, spec)
	if err != nil {
		return Override{}, err
	}
	if err := o.l.SetOverride(ctx, core.RuleKey(info.Name, key), ttl, limits...); err != nil {
		return Override{}, fmt.Errorf("override %q under %q: %w", key, info.Name, err)
	}
	return overrideView(info.Name, key, core.Override{Limits: limits, TTL: ttl}), nil
}

// Override returns key's override under rule: an error wrapping
// core.ErrNoOverride when it has none.
func (o *Ops) Override(ctx context.Context, rule, key string) (Override, error) {
	info, err := o.target(ctx, rule, key)
	if err != nil {
		return Override{}, err
	}
	ov, err := o.l.Override(ctx, core.RuleKey(info.Name, key))
	if err != nil {
		return Override{}, fmt.Errorf("override of %q under %q: %w", key, info.Name, err)
	}
	return overrideView(info.Name, key, ov), nil
}

// RemoveOverride removes key's override under rule: the rule's limits
// apply again from its next decision on every replica. A key without an
// override is an error wrapping core.ErrNoOverride.
func (o *Ops) RemoveOverride(ctx context.Context, rule, key string) error {
	if _, err := o.Override(ctx, rule, key); err != nil {
		return err
	}
	if err := o.l.RemoveOverride(ctx, core.RuleKey(rule, key)); err != nil {
		return fmt.Errorf("remove the override of %q under %q: %w", key, rule, err)
	}
	return nil
}

// Top returns the n keys (1 or more) denied most under rule within since
// (see core.Limiter.TopDenied), most denied first, across replicas. The
// rule must record its denied keys (ErrNotTracked otherwise).
func (o *Ops) Top(ctx context.Context, rule string, n int, since time.Duration) (Top, error) {
	info, err := o.rule(ctx, rule)
	if err != nil {
		return Top{}, err
	}
	if n < 1 {
		return Top{}, fmt.Errorf("%w: the top %d keys; ask for 1 or more", errBadInput, n)
	}
	if !info.TrackDenied {
		return Top{}, fmt.Errorf("%w: %q (set TrackDenied on the rule to record them)", ErrNotTracked, info.Name)
	}
	keys, err := o.l.TopDenied(ctx, info.Name, n, since)
	if err != nil {
		return Top{}, fmt.Errorf("top of %q: %w", info.Name, err)
	}
	t := Top{Rule: info.Name, Since: Duration(since), Keys: make([]DeniedKey, 0, len(keys))}
	for _, k := range keys {
		t.Keys = append(t.Keys, DeniedKey{Key: k.Key, Denials: k.Denials})
	}
	return t, nil
}

// ParseOverride reads an override's limits for rule from spec, a
// comma-separated list of "<count>/<window>" (the window as
// core.ParseLimits reads it: "500/m, 20000/24h"). Each names one of the
// rule's limits by its window and gives it a new count; the override keeps
// that limit's algorithm, precision and name. A rule with a single limit
// also takes a count alone ("500"). Errors wrap core.ErrInvalidLimit and
// say which item is wrong.
func ParseOverride(rule core.RuleInfo, spec string) ([]core.Limit, error) {
	var limits []core.Limit
	for i, item := range strings.Split(spec, ",") {
		lim, err := overrideLimit(rule, strings.TrimSpace(item))
		if err != nil {
			return nil, fmt.Errorf("%w: item %d of %q: %w", core.ErrInvalidLimit, i+1, spec, err)
		}
		for _, l := range limits {
			if l.Window == lim.Window && l.Algorithm == lim.Algorithm {
				return nil, fmt.Errorf("%w: %q gives the limit of %s twice", core.ErrInvalidLimit, spec, Duration(lim.Window))
			}
		}
		limits = append(limits, lim)
	}
	return limits, nil
}

// overrideLimit reads one item of an override for rule.
func overrideLimit(rule core.RuleInfo, item string) (core.Limit, error) {
	count, window, hasWindow := strings.Cut(item, "/")
	n, err := strconv.ParseInt(strings.TrimSpace(count), 10, 64)
	if err != nil || n <= 0 {
		return core.Limit{}, fmt.Errorf("count %q in %q is not a whole number above 0", count, item)
	}
	var match []core.Limit
	if !hasWindow {
		if len(rule.Limits) != 1 {
			return core.Limit{}, fmt.Errorf("%q has no window, and rule %q has %d limits (%s): write <count>/<window>", item, rule.Name, len(rule.Limits), limitList(rule.Limits))
		}
		match = rule.Limits
	} else {
		w, err := core.ParseLimits("1/" + strings.TrimSpace(window))
		if err != nil {
			return core.Limit{}, fmt.Errorf("window %q in %q: want a unit (ms, s, m, h, d) or a duration such as 15m", window, item)
		}
		for _, l := range rule.Limits {
			if l.Window == w[0].Window {
				match = append(match, l)
			}
		}
		switch len(match) {
		case 0:
			return core.Limit{}, fmt.Errorf("rule %q has no limit of window %s (its limits: %s)", rule.Name, Duration(w[0].Window), limitList(rule.Limits))
		case 1:
		default:
			return core.Limit{}, fmt.Errorf("rule %q has %d limits of window %s: an override cannot tell them apart", rule.Name, len(match), Duration(w[0].Window))
		}
	}
	lim := match[0]
	lim.Count = n
	if err := lim.Validate(); err != nil {
		return core.Limit{}, fmt.Errorf("%q: %s", item, strings.TrimPrefix(err.Error(), core.ErrInvalidLimit.Error()+": "))
	}
	return lim, nil
}

// limitList writes limits as "<count>/<window>" items, such as "100/1m, 1000/1h".
func limitList(limits []core.Limit) string {
	items := make([]string, len(limits))
	for i, l := range limits {
		items[i] = limitView(l).String()
	}
	return strings.Join(items, ", ")
}
