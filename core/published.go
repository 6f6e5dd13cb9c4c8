package core

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ratewindow/ratewindow/core/internal/store"
)

// The rules a Limiter publishes and the keys they deny most: what tools
// outside the program (the CLI, the admin handler) read by rule name. They
// name rules, so they live among the policy files.

// RuleInfo is what Limiter.Publish makes known of a rule.
type RuleInfo struct {
	Name        string
	Limits      []Limit
	Penalty     *Penalty
	TrackDenied bool // the rule records its denied keys (Limiter.TopDenied)
}

// Publish makes rules known to tools outside the program (Rules, the
// ratewindow command): nothing is published unless asked. The registry is
// one small hash under the Limiter's prefix, at most 256 rules; each entry
// lasts a week from its latest Publish (call it at start-up, and daily in
// a process that runs longer). A rule of the same name replaces the one
// published before. Each rule must be valid as a Rule's name, limits and
// penalty (ErrInvalidRule); an error writes nothing.
func (l *Limiter) Publish(ctx context.Context, rules ...RuleInfo) error {
	if ctx == nil {
		return errNilContext
	}
	entries := make(map[string]string, len(rules))
	for _, r := range rules {
		if err := validateRule(r.Name, r.Limits, r.Penalty, false); err != nil {
			return err
		}
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("ratewindow: publish rule %q: %w", r.Name, err)
		}
		entries[r.Name] = string(b)
	}
	return l.guard.next.Publish(ctx, entries, l.micros())
}

// Rules returns the rules published (see Publish), sorted by Name.
func (l *Limiter) Rules(ctx context.Context) ([]RuleInfo, error) {
	if ctx == nil {
		return nil, errNilContext
	}
	entries, err := l.guard.next.Published(ctx, l.micros())
	if err != nil {
		return nil, err
	}
	rules := make([]RuleInfo, 0, len(entries))
	for name, v := range entries {
		var r RuleInfo
		if err := json.Unmarshal([]byte(v), &r); err != nil {
			return nil, fmt.Errorf("%w: the published rule %q: %w", ErrUnexpectedReply, name, err)
		}
		rules = append(rules, r)
	}
	slices.SortFunc(rules, func(a, b RuleInfo) int { return strings.Compare(a.Name, b.Name) })
	return rules, nil
}

// DeniedKey is a key of a rule and its denials (see Limiter.TopDenied).
type DeniedKey struct {
	Key     string // the key function's result (without the rule's name); a digest when long
	Denials int64  // denials recorded within since (approximate past the top-N)
}

// TopDenied returns at most n keys of rule most denied within since (1
// minute at least, counted by whole minutes, at most an hour), the most
// denied first: across replicas, for the rules that set TrackDenied. A
// denial is recorded only when it reached Redis (never an allowed request,
// never one the deny cache answered), within about a second; each minute
// keeps its 100 most denied keys, for an hour, so counts past those are
// approximate. A key longer than 128 bytes shows as its digest. An unknown
// rule has none.
func (l *Limiter) TopDenied(ctx context.Context, rule string, n int, since time.Duration) ([]DeniedKey, error) {
	switch {
	case ctx == nil:
		return nil, errNilContext
	case rule == "" || len(rule) > MaxKeyLen:
		return nil, fmt.Errorf("%w: a rule name of %d bytes", ErrInvalidRule, len(rule))
	case n < 1:
		return nil, fmt.Errorf("ratewindow: TopDenied of %d keys; it must be >= 1", n)
	case since < time.Minute || since > store.DeniedTTL:
		return nil, fmt.Errorf("%w: TopDenied since %s; it must be in [1m, %s]", ErrInvalidDuration, since, store.DeniedTTL)
	}
	counts, err := l.guard.next.TopDenied(ctx, rule, since, l.micros())
	if err != nil {
		return nil, err
	}
	top := make([]DeniedKey, 0, len(counts))
	for k, c := range counts {
		top = append(top, DeniedKey{Key: k, Denials: c})
	}
	slices.SortFunc(top, func(a, b DeniedKey) int {
		return cmp.Or(cmp.Compare(b.Denials, a.Denials), strings.Compare(a.Key, b.Key))
	})
	return top[:min(n, len(top))], nil
}

// denied gathers the denials of the rules that track them (TrackDenied)
// and hands them to the store a second after the first one it holds: one
