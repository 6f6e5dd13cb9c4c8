package core

import (
	"context"
	"time"
)

// Refused reports that an upstream refused a request of key (a 429, a 503
// with Retry-After, or a RateLimit field with r=0): it blocks key for d on
// every replica (Limiter.Block), so no replica sends into the refusal, and
// tells the observer (an OpRefused Event; retried says whether the request
// goes again). nethttp.Transport uses it. Block's errors are returned.
func (e *Enforcer) Refused(ctx context.Context, key string, d time.Duration, retried bool) error {
	return e.d.Refused(ctx, key, d, retried)
}

// Refused is Enforcer.Refused for any transport: an upstream refused a
// request of key for d (gRPC: RESOURCE_EXHAUSTED with RetryInfo).
func (d *Decider[R]) Refused(ctx context.Context, key string, dur time.Duration, retried bool) error {
	start := d.l.started()
	err := d.l.Block(ctx, key, dur)
	d.l.observe(Event{Op: OpRefused, Rule: d.p.Name, Key: key, Retried: retried, Err: err,
		Result: Result{Limit: d.p.Limits[0], RetryAfter: dur}}, start)
	return err
}
