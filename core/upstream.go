package core

import (
	"context"
	"time"
)

// Refused reports that an upstream refused a request of key (a 429, a 503
// with Retry-After, or a RateLimit field with r=0): it blocks key for d on
// every replica (Limiter.Block), so that no replica sends into the
// refusal, and tells the observer (an OpRefused Event with the rule's name;
// retried says whether the request goes again). It is the outbound side of
// a rule, used by nethttp.Transport. Block's errors are returned.
func (e *Enforcer) Refused(ctx context.Context, key string, d time.Duration, retried bool) error {
	var start time.Time
	if e.l.observer != nil {
		start = time.Now()
	}
	err := e.l.Block(ctx, key, d)
	if e.l.observer != nil {
		e.l.observe(Event{Op: OpRefused, Rule: e.rule.Name, Key: key, Retried: retried, Err: err,
			Result: Result{Limit: e.rule.Limits[0], RetryAfter: d}}, start)
	}
	return err
}
