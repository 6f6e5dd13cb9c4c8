package core

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ratewindow/ratewindow/keyfuncs"
)

// HeaderStyle selects the rate-limit header fields a Rule writes on allowed
// and denied responses. Every denial gets Retry-After, whatever the style.
type HeaderStyle uint8

const (
	// XRateLimit, the default, writes X-RateLimit-Limit, -Remaining and
	// -Reset (seconds until the binding limit is full again, rounded up).
	XRateLimit HeaderStyle = iota
	// IETF writes the fields of draft-ietf-httpapi-ratelimit-headers-11:
	// RateLimit-Policy: "100-per-1m";q=100;w=60 and RateLimit:
	// "100-per-1m";r=42;t=60 (pk when Rule.PartitionKey is set).
	IETF
	// Both writes the fields of XRateLimit and of IETF.
	Both
	// None writes no rate-limit fields.
	None
)

// String returns "x-ratelimit", "ietf", "both" or "none".
func (s HeaderStyle) String() string { return enumName(s, headerStyles[:], "header-style") }

var headerStyles = [...]string{"x-ratelimit", "ietf", "both", "none"}

// ErrInvalidRule is wrapped by the errors of Rule.Validate and NewEnforcer.
var ErrInvalidRule = errors.New("ratewindow: invalid rule")

// Rule describes which HTTP requests to limit and how to answer, for every
// adapter (nethttp, chimw, ginmw, echomw, connectmw), which validates it at start-up.
//
// When several rules apply, a request passes only when each admits it, and
// each rule counts every request that reached it: a request that a later
// rule stops (429, 503, or its OnError's answer) stays counted by the
// rules it passed, so an outer per-IP rule counts, denies and bans a
// client whose requests an inner per-account rule denies. A rule with
// RefundIfStopped gives the units of such a request back instead (a quota
// spent only on requests that are served), and a rule with CountIf judges
// the status the request was stopped with. The rule that stops a request
// consumes nothing itself, and the response shows only its fields.
type Rule struct {
	// Name is the rule's namespace (keys are Name + ":" + Key's result) and
	// Event.Rule. Required: printable ASCII without spaces, ':', '{' or
	// '}', at most 64 bytes.
	Name string
	// Limits must all admit a request for it to pass (at least one). Their
	// PolicyName must be printable ASCII, unique within the rule.
	Limits []Limit
	// Key returns the key a request is counted under. When it fails or
	// returns "", the error goes to OnError and, unless OnError answers,
	// the request is counted under FallbackKey. Default keyfuncs.IP().
	Key func(*http.Request) (string, error)
	// FallbackKey keys a request whose Key failed: it is counted under
	// Name + ":nokey:" + FallbackKey's result, or Name + ":nokey", shared,
	// if FallbackKey fails too. A result of Key that starts with "nokey" or
	// "~" is stored with "~" before it, so the two key spaces never meet.
	// Default keyfuncs.IP(). To let requests without a key pass, use Skip.
	FallbackKey func(*http.Request) (string, error)
	// Cost returns the units a request takes (default 1). A cost below 1 is
	// an error: it goes to OnError and, unless OnError answers, costs 1.
	Cost func(*http.Request) int64
	// Skip reports requests that pass uncounted, such as health checks.
	Skip func(*http.Request) bool
	// Headers selects the rate-limit header fields. Default XRateLimit.
	// When several rules apply, the response shows the denying rule's
	// decision, else the most restrictive (fewest remaining, then the
	// latest reset), in the style of the first rule whose Headers is not
	// None. A rule with None shows nothing.
	Headers HeaderStyle
	// OnDenied writes the status (normally 429) and body of a denial, its
	// rate-limit fields and Retry-After already set. Default: 429 with a
	// short text/plain body, or problem+json (see ProblemJSON).
	OnDenied func(http.ResponseWriter, *http.Request, Result)
	// OnError is called with every error of the rule's functions (Key,
	// Cost, LimitsFor) and of the backend, never shown to the client. If it
	// writes a response, the request stops there; else the request is
	// still limited: under FallbackKey, a Cost of 1 or Limits; by the
	// failure mode (FailClosed answers 503 with Retry-After). Default: log
	// with log/slog, at most a line per second per rule. A request whose
	// own context ends before its decision is answered 503.
	OnError func(http.ResponseWriter, *http.Request, error)
	// DryRun decides, counts, reports (Event) and sets the rate-limit
	// fields of every request, but never denies, and its Penalty bans
	// nobody (a ban would deny under the rule once enforced).
	DryRun bool
	// ProblemJSON answers every denial with an application/problem+json
	// body, not only when the client's Accept header lists it.
	ProblemJSON bool

	// LimitsFor, when set, chooses each request's limits; none means
	// Limits (which must still be valid). An error or invalid limits go to
	// OnError and, unless it answers, mean Limits. nethttp.Transport uses Limits only.
	LimitsFor func(*http.Request) ([]Limit, error)
	// CountIf, when set, counts only the requests whose response status it
	// accepts: a request is charged before the handler, and its units are
	// given back after it when CountIf(status) is false. A handler that
	// panics counts as 500. Such a rule shows its rate-limit fields only on
	// its own denials.
	CountIf func(status int) bool
	// Penalty, when set, bans a key that keeps being denied: see Penalty.
	Penalty *Penalty
	// RefundIfStopped gives a request's units back when a later rule stops
	// it (Limiter.Refund: one more Redis call each), for a quota that only
	// served requests should spend. Validate refuses it with a Penalty: a
	// rule that bans must count every request that reached it, or a client
	// that a later rule stops would never be denied nor banned. Ignored with
	// CountIf, which judges the status the request was stopped with.
	RefundIfStopped bool
	// PartitionKey adds the partition key (pk) to the IETF fields: the
	// first 12 bytes of the SHA-256 of the request's key (reversible for a
	// small key space, such as IP addresses).
	PartitionKey bool
	// TrackDenied records the keys this rule denies, for Limiter.TopDenied:
	// only denials that reached Redis, a few calls a second at most.
	TrackDenied bool
}

// Info returns what Limiter.Publish makes known of the rule.
func (r Rule) Info() RuleInfo {
	return RuleInfo{Name: r.Name, Limits: slices.Clone(r.Limits), Penalty: r.Penalty, TrackDenied: r.TrackDenied}
}

// Validate reports whether the rule can be enforced. Its errors wrap
// ErrInvalidRule, and ErrInvalidLimit or ErrNoLimits where they apply.
func (r Rule) Validate() error {
	if err := validateRule(r.Name, r.Limits, r.Penalty, r.RefundIfStopped); err != nil {
		return err
	}
	if r.Headers > None {
		return fmt.Errorf("%w %q: unknown %s", ErrInvalidRule, r.Name, r.Headers)
	}
	return nil
}

// validateRule checks what a Rule and a Policy share.
func validateRule(name string, limits []Limit, pen *Penalty, refund bool) error {
	const maxName = 64
	switch {
	case name == "":
		return fmt.Errorf("%w: empty Name", ErrInvalidRule)
	case len(name) > maxName:
		return fmt.Errorf("%w %q: Name is longer than %d bytes", ErrInvalidRule, name, maxName)
	case pen != nil && refund:
		return fmt.Errorf("%w %q: Penalty with RefundIfStopped: a rule that bans counts every request that reached it", ErrInvalidRule, name)
	case len(limits) == 0:
		return fmt.Errorf("%w %q: %w", ErrInvalidRule, name, unprefixed{ErrNoLimits})
	case !printable(name) || strings.ContainsAny(name, " :{}"):
		return fmt.Errorf("%w %q: Name may hold printable ASCII but no space, ':', '{' or '}'", ErrInvalidRule, name)
	case pen != nil && pen.Denials < 1:
		return fmt.Errorf("%w %q: Penalty.Denials %d must be at least 1", ErrInvalidRule, name, pen.Denials)
	case pen != nil && (pen.Within < time.Millisecond || pen.Within > MaxWindow):
		return fmt.Errorf("%w %q: Penalty.Within %s must be in [1ms, %s]", ErrInvalidRule, name, pen.Within, MaxWindow)
	case pen != nil && (pen.Ban < time.Millisecond || pen.Ban > MaxBlock):
		return fmt.Errorf("%w %q: Penalty.Ban %s must be in [1ms, %s]", ErrInvalidRule, name, pen.Ban, MaxBlock)
	}
	if err := ruleLimits(limits); err != nil {
		return fmt.Errorf("%w %q: %w", ErrInvalidRule, name, unprefixed{err})
	}
	return nil
}

// ruleLimits checks a rule's limits: validateLimits, and policy names.
func ruleLimits(limits []Limit) error {
	if err := validateLimits(limits); err != nil {
		return err
	}
	for i, lim := range limits {
		name := lim.PolicyName()
		if !printable(name) {
			return fmt.Errorf("%w #%d: policy name %q is not printable ASCII", ErrInvalidLimit, i, name)
		}
		if j := slices.IndexFunc(limits[:i], func(p Limit) bool { return p.PolicyName() == name }); j >= 0 {
			return fmt.Errorf("%w: limits #%d and #%d have the policy name %q: set Limit.Name", ErrInvalidLimit, j, i, name)
		}
	}
	return nil
}

// printable reports whether s is non-empty printable ASCII (%x20-7E).
func printable(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r > '~' })
}

// Enforcer applies one Rule with one Limiter to HTTP requests, for every
// adapter. It is safe for concurrent use.
type Enforcer struct {
	rule Rule // validated, with default keys
	d    *Decider[exchange]
}

// exchange is a Decider's request: OnError may answer on w.
type exchange struct {
	w http.ResponseWriter
	r *http.Request
}

// NewEnforcer validates rule and prepares what every request of it shares.
func NewEnforcer(l *Limiter, rule Rule) (*Enforcer, error) {
	if rule.Key == nil {
		rule.Key = keyfuncs.IP()
	}
	if rule.FallbackKey == nil {
		rule.FallbackKey = keyfuncs.IP()
	}
	key, fallback := rule.Key, rule.FallbackKey
	if rule.Headers > None { // the one field the Policy has not
		return nil, rule.Validate()
	}
	p := Policy[exchange]{
		Name: rule.Name, Limits: rule.Limits, Penalty: rule.Penalty, DryRun: rule.DryRun,
		PartitionKey: rule.PartitionKey, CountIf: rule.CountIf, RefundIfStopped: rule.RefundIfStopped,
		TrackDenied: rule.TrackDenied,
		Key:         func(x exchange) (string, error) { return key(x.r) },
		FallbackKey: func(x exchange) (string, error) { return fallback(x.r) },
	}
	if cost := rule.Cost; cost != nil {
		p.Cost = func(x exchange) int64 { return cost(x.r) }
	}
	if skip := rule.Skip; skip != nil {
		p.Skip = func(x exchange) bool { return skip(x.r) }
	}
	if limitsFor := rule.LimitsFor; limitsFor != nil {
		p.LimitsFor = func(x exchange) ([]Limit, error) { return limitsFor(x.r) }
	}
	if onError := rule.OnError; onError != nil {
		p.OnError = func(x exchange, err error) bool {
			// the earlier rules' fields: none on OnError's answer (their
			// units go back), kept when it does not answer
			h := x.w.Header()
			var shown [len(rateHeaders)][]string
			for i, k := range rateHeaders {
				shown[i] = h[k]
			}
			clearRateHeaders(h)
			sw := &statusWriter{ResponseWriter: x.w}
			onError(sw, x.r, err)
			for i, k := range rateHeaders {
				if v := shown[i]; v != nil && sw.status == 0 {
					h[k] = v
				}
			}
			return sw.status != 0
		}
	}
	d, err := NewDecider(l, p)
	if err != nil {
		return nil, err
	}
	return &Enforcer{rule: rule, d: d}, nil
}

var errEmptyKey = fmt.Errorf("%w: the key function returned an empty key", keyfuncs.ErrNoKey)

// Handle decides r under the rule. When the request stops here, it writes
// the response (429 for a denial, 503 when the backend failed and the
// Limiter fails closed) and returns nil and false; otherwise the request
// for the next handler and true. route is the framework's route pattern
// ("/users/{id}") or "", stored with keyfuncs.WithRoute.
func (e *Enforcer) Handle(w http.ResponseWriter, r *http.Request, route string) (*http.Request, bool) {
	return e.HandleFrom(w, r, route, nil)
}

// HandleFrom is Handle with fc, the framework's context (FrameworkContext).
func (e *Enforcer) HandleFrom(w http.ResponseWriter, r *http.Request, route string, fc any) (*http.Request, bool) {
	r, st := prepare(r, route)
	if fc != nil { // an inner rule of another adapter keeps the outer framework's
		st.framework = fc
	}
	var sw *statusWriter // the status a stop answers, for an earlier rule's CountIf
	if st.charges.countsStatus() {
		sw = &statusWriter{ResponseWriter: w}
		w = sw
	}
	dec := e.d.Decide(r.Context(), exchange{w, r})
	switch dec.Verdict {
	case Pass:
		if dec.Shown {
			e.show(w, st, dec)
		}
		// kept, to be settled by CountIf or a later rule's stop
		st.charges.Add(e.d, exchange{discard{}, r}, dec)
		return r, true
	case Denied, Unavailable: // its fields and Retry-After, then OnDenied or the default 429 or 503
		clearRateHeaders(w.Header())
		e.d.SetFields(w.Header(), st.style(e.rule.Headers), dec)
		if dec.Verdict == Denied && e.rule.OnDenied != nil {
			e.rule.OnDenied(w, r, dec.Result)
		} else {
			writeDenied(w, dec, e.rule.ProblemJSON || acceptsProblem(r.Header["Accept"]))
		}
	case Answered: // by OnError: this rule's units go back (FailLocal's)
		e.d.GiveBack(r.Context(), exchange{discard{}, r}, dec, "the rule's OnError answered the request")
	}
	if sw != nil {
		sw.ok()
		st.charges.Stop(r.Context(), sw.status)
	} else {
		st.charges.Stop(r.Context(), 0) // no rule judges the status
	}
	return nil, false
}

// Settles reports whether the rule settles a request's charge after its
// handler (Rule.CountIf): run the next handlers through SettleAfter then.
func (e *Enforcer) Settles() bool { return e.rule.CountIf != nil }

// SettleAfter runs serve, the next handlers of r (as Handle returned it),
// and gives back r's units when Rule.CountIf rejects the status serve
// returns (500 if it panics; the panic goes on up).
func (e *Enforcer) SettleAfter(r *http.Request, serve func() (status int)) {
	status := http.StatusInternalServerError // unless serve returns
	defer func() {
		if st, _ := r.Context().Value(stackKey{}).(*stack); st != nil && e.rule.CountIf != nil {
			st.charges.Settle(r.Context(), e.d, status)
		}
	}()
	status = serve()
}

// ServeNext serves r with next, for a request Handle passed, and settles by
// the status when the rule has CountIf (Flusher and Hijacker still work).
func (e *Enforcer) ServeNext(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if e.rule.CountIf == nil {
		next.ServeHTTP(w, r)
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	e.SettleAfter(r, func() int {
		next.ServeHTTP(sw, r)
		sw.ok()
		return sw.status
	})
}

// show sets the rate-limit fields of a passed decision when it is the most
// restrictive on the request's way; a CountIf rule shows none.
func (e *Enforcer) show(w http.ResponseWriter, st *stack, dec Decision) {
	style := st.style(e.rule.Headers)
	if style == None || e.rule.CountIf != nil || st.e != nil && !moreRestrictive(e, dec.Result, st.e, st.res) {
		return
	}
	st.e, st.res = e, dec.Result // its fields overwrite the stack's: one style, the same fields
	e.d.SetFields(w.Header(), style, dec)
}

// discard is a ResponseWriter that writes nowhere.
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}

// The context keys of a request's *stack and of FrameworkContext.
type (
	stackKey     struct{}
	frameworkKey struct{}
)

// stack is the request's context, shared by the stacked rules on its way:
// the decision whose fields the response carries, the framework's context
// and the charges, in one allocation.
type stack struct {
	context.Context
	e         *Enforcer
	res       Result
	fields    HeaderStyle // the response's style, once styled
	styled    bool
	framework any               // the adapter's own request context (HandleFrom)
	charges   Charges[exchange] // what the rules took, to settle
}

// Value answers stackKey and frameworkKey, else asks the parent.
func (s *stack) Value(key any) any {
	switch key {
	case stackKey{}:
		return s
	case frameworkKey{}:
		return s.framework
	}
	return s.Context.Value(key)
}

// FrameworkContext returns the framework's own context of a request passed
// to Enforcer.HandleFrom (*gin.Context, echo.Context), or nil.
func FrameworkContext(r *http.Request) any { return r.Context().Value(frameworkKey{}) }

// style returns the style a rule of style own writes in: None for None,
// else that of the first rule that shows fields.
func (s *stack) style(own HeaderStyle) HeaderStyle {
	switch {
	case own == None:
		return own
	case !s.styled:
		s.fields, s.styled = own, true
	}
	return s.fields
}

// moreRestrictive orders decisions: a denial, fewer remaining, a later
// reset, a smaller limit, then names, so no tie depends on rule order.
func moreRestrictive(e *Enforcer, r Result, e0 *Enforcer, r0 Result) bool {
	switch {
	case r.Allowed != r0.Allowed:
		return !r.Allowed
	case r.Remaining != r0.Remaining:
		return r.Remaining < r0.Remaining
	case ceilSeconds(r.ResetAfter) != ceilSeconds(r0.ResetAfter):
		return r.ResetAfter > r0.ResetAfter
	case r.Limit.Count != r0.Limit.Count:
		return r.Limit.Count < r0.Limit.Count
	case r.Limit.PolicyName() != r0.Limit.PolicyName():
		return r.Limit.PolicyName() < r0.Limit.PolicyName()
	}
	return e.rule.Name < e0.rule.Name
}

// prepare returns r with the route and a stack in its context (reusing an
// earlier rule's), and the stack.
func prepare(r *http.Request, route string) (*http.Request, *stack) {
	ctx := r.Context()
	st, _ := ctx.Value(stackKey{}).(*stack)
	changed := st == nil
	if route != "" {
		if p, _ := keyfuncs.RouteFrom(ctx); p != route {
			ctx, changed = keyfuncs.WithRoute(ctx, route), true
		}
	}
	if !changed {
		return r, st
	}
	if st == nil {
		st = &stack{Context: ctx}
		ctx = st
	}
	return r.WithContext(ctx), st
}

// ByIP returns n requests per window for each client IP (keyfuncs.IP),
// named after the limit ("ip-100-per-1m"); the adapters' LimitByIP add the
// line that called them to the name.
func ByIP(n int64, window time.Duration) Rule {
	lim := Per(n, window)
	return Rule{Name: "ip-" + lim.PolicyName(), Limits: []Limit{lim}, Key: keyfuncs.IP()}
}
