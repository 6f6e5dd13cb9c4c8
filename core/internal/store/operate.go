package store

import (
	"context"
	"time"
)

// Operator is the part of a Store that the operating methods of a Limiter
// (core/operate.go) use: overrides, a key's block, the keys denied most and
// the registry of published rules. Allow applies a key's override itself:
// each limit of the Request whose Algorithm and Window an override limit
// has takes that limit's Count (State.Count says so).
type Operator interface {
	// SetOverride keeps r.Limits (their Counts) as r.Key's own, for ttl
	// from r.Now (0: until removed), replacing any override before.
	SetOverride(ctx context.Context, r Request, ttl time.Duration) error
	// Override returns r.Key's override and its time left (0: until
	// removed); no limits when there is none.
	Override(ctx context.Context, r Request) ([]Limit, time.Duration, error)
	// RemoveOverride drops r.Key's override, if any.
	RemoveOverride(ctx context.Context, r Request) error
	// Blocked returns how long r.Key stays blocked from r.Now (0: not).
	Blocked(ctx context.Context, r Request) (time.Duration, error)
	// Unblock lifts r.Key's block (a Block or a ban) and nothing else.
	Unblock(ctx context.Context, r Request) error
	// CountDenied adds denials (by key, held keys) to rule's counts of the
	// minute of now (µs), which keep the TopKept keys most denied and
	// expire DeniedTTL after the minute.
	CountDenied(ctx context.Context, rule string, denials map[string]int64, now int64) error
	// TopDenied returns the denials of rule's keys counted in the minutes
	// from now - since to now (µs), summed.
	TopDenied(ctx context.Context, rule string, since time.Duration, now int64) (map[string]int64, error)
	// Publish keeps entries (name: value) in the registry of published
	// rules until PublishTTL from now (µs), with the entries published
	// before and not expired; more than MaxPublished entries in all is an
	// error, and nothing is written.
	Publish(ctx context.Context, entries map[string]string, now int64) error
	// Published returns the registry's entries not expired at now (µs).
	Published(ctx context.Context, now int64) (map[string]string, error)
}

// The bounds of what the operating methods keep.
const (
	TopKept      = 100                // keys kept per rule and minute
	DeniedTTL    = time.Hour          // a minute's counts live this long after the minute
	MaxPublished = 256                // entries of the registry of published rules
	PublishTTL   = 7 * 24 * time.Hour // an entry lives this long unless published again
)

// Minute returns the index of the minute of now (µs since the epoch).
func Minute(now int64) int64 { return now / int64(time.Minute/time.Microsecond) }
