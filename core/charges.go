package core

import (
	"context"
	"strconv"
)

// Charges is what the rules on one request's way took from it, kept by a
// transport (the HTTP rules keep theirs in the request's context; grpcmw
// in the call's) so that each rule's units are settled once: after the
// handler by the rule's CountIf (Settle), or when a later rule stops the
// request (Stop). The zero value is ready; it is not safe for concurrent
// use.
type Charges[R any] struct {
	list   []charge[R]
	inline [2]charge[R]
}

// charge is what one rule took from a request.
type charge[R any] struct {
	d       *Decider[R]
	r       R
	key     string
	u       taken
	settled bool
}

// Add records the units of dec, d's Pass of r, when it charged some.
func (c *Charges[R]) Add(d *Decider[R], r R, dec Decision) {
	if !dec.charged {
		return
	}
	if c.list == nil {
		c.list = c.inline[:0]
	}
	c.list = append(c.list, charge[R]{d: d, r: r, key: dec.Key, u: dec.units})
}

// Settle settles d's charge after the request's handler answered with
// status (an HTTP status; for another transport, what its Policy.CountIf
// takes): its units go back when the policy's CountIf rejects status.
func (c *Charges[R]) Settle(ctx context.Context, d *Decider[R], status int) {
	for i := range c.list {
		if ch := &c.list[i]; ch.d == d && !ch.settled {
			ch.settled = true
			if d.p.CountIf != nil && !d.p.CountIf(status) {
				d.giveBack(ctx, ch.r, ch.key, ch.u, "status "+strconv.Itoa(status))
			}
			return
		}
	}
}

// Stop settles every charge of a request that a later rule stopped with
// status (429, 503, or what its OnError answered): a rule with CountIf
// judges status, one with RefundIfStopped gives its units back, and every
// other keeps them: the request reached it.
func (c *Charges[R]) Stop(ctx context.Context, status int) {
	for i := range c.list {
		ch := &c.list[i]
		if ch.settled {
			continue
		}
		ch.settled = true
		switch p := &ch.d.p; {
		case p.CountIf != nil && !p.CountIf(status):
			ch.d.giveBack(ctx, ch.r, ch.key, ch.u, "status "+strconv.Itoa(status)+" of a later rule")
		case p.CountIf == nil && p.RefundIfStopped:
			ch.d.giveBack(ctx, ch.r, ch.key, ch.u, "a later rule stopped the request")
		}
	}
}

// countsStatus reports whether a charge not settled yet judges a status.
func (c *Charges[R]) countsStatus() bool {
	for i := range c.list {
		if !c.list[i].settled && c.list[i].d.p.CountIf != nil {
			return true
		}
	}
	return false
}
