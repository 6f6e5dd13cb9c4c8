package core

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/ratewindow/ratewindow/keyfuncs"
)

// HeaderStyle selects the rate-limit header fields a Rule writes on allowed
// and denied responses. Retry-After is written on every denial, whatever the
// style.
type HeaderStyle uint8

const (
	// XRateLimit writes X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (seconds until the binding limit is full again,
	// rounded up). It is the default.
	XRateLimit HeaderStyle = iota
	// IETF writes the RateLimit-Policy and RateLimit fields of
	// draft-ietf-httpapi-ratelimit-headers-11 (a draft, not yet an RFC):
	//
	//	RateLimit-Policy: "100-per-1m";q=100;w=60, "5-per-1s";q=5;w=1
	//	RateLimit: "100-per-1m";r=42;t=60
	//
	// With Rule.PartitionKey, both also carry the request's partition key
	// (pk). The quota unit (qu) is left out: it is "requests", the
	// default, as every unit of a Limit is a request (or a share of one,
	// by Rule.Cost).
	IETF
	// Both writes the fields of XRateLimit and of IETF.
	Both
	// None writes no rate-limit fields.
	None
)

// String returns "x-ratelimit", "ietf", "both" or "none".
func (s HeaderStyle) String() string {
	switch s {
	case XRateLimit:
		return "x-ratelimit"
	case IETF:
		return "ietf"
	case Both:
		return "both"
	case None:
		return "none"
	}
	return "header-style(" + strconv.Itoa(int(s)) + ")"
}

// ErrInvalidRule is wrapped by the errors of Rule.Validate and NewEnforcer.
var ErrInvalidRule = errors.New("ratewindow: invalid rule")

// Rule describes which HTTP requests to limit and how to answer: one
// description shared by every adapter (nethttp, chimw, ginmw, echomw).
//
// A Rule is a value: build the middleware once, at start-up. The middleware
// constructors validate it (see Validate) and report a bad rule then, never
// at request time.
type Rule struct {
	// Name is the rule's namespace: the Limiter's key of a request is
	// Name + ":" + the key function's result, so two rules never share
	// counters. Observers receive it as Event.Rule. Required: printable
	// ASCII without spaces, ':', '{' or '}', at most 64 bytes.
	Name string
	// Limits must all admit a request for it to pass (at least one).
	// Their PolicyName appears in the IETF headers: it must be printable
	// ASCII, and unique within the rule.
	Limits []Limit
	// Key returns the key a request is counted under. A key function that
	// fails, or returns an empty key, does not exempt the request from the
	// rule: the error goes to OnError, and unless OnError answers, the
	// request is counted under FallbackKey instead.
	// Default keyfuncs.IP(): the peer address, without trusting any proxy.
	Key func(*http.Request) (string, error)
	// FallbackKey returns the key of a request whose Key failed, so that a
	// request cannot leave the rule by leaving out what it is keyed by (a
	// missing X-Api-Key header, no user yet). Such a request is counted
	// under the Limiter key Name + ":nokey:" + FallbackKey's result
	// ("login:nokey:ip:203.0.113.5"), apart from every key of Key, within
	// the rule's limits. If FallbackKey fails too, the request is counted
	// under Name + ":nokey", one key shared by every such request of the
	// rule. Default keyfuncs.IP(), the peer address: behind proxies, set
	// the keyfuncs.IPWith of Key's proxies. To let requests without a key
	// pass uncounted, say so with Skip.
	FallbackKey func(*http.Request) (string, error)
	// Cost returns the number of units a request takes, such as 10 for an
	// expensive search. A cost below 1 is an error: it goes to OnError and,
	// unless OnError answers, the request costs 1. Default 1.
	Cost func(*http.Request) int64
	// Skip reports requests that pass without being counted and without
	// touching the backend, such as health checks or an allow-list.
	// Default: none.
	Skip func(*http.Request) bool
	// Headers selects the rate-limit header fields. Default XRateLimit.
	//
	// When several rules apply to a request (router-wide and per route),
	// its response carries the fields of one decision: on a denial, the
	// denying rule's; otherwise the most restrictive decision of the rules
	// that show theirs (fewest remaining, then the latest reset). They are
	// written in one style: that of the first rule on the request's way
	// whose Headers is not None, so a route answers in one style whichever
	// rule is tighter (set it on the outermost rule). A rule whose Headers
	// is None shows nothing.
	Headers HeaderStyle
	// OnDenied writes the response to a denied request. The rate-limit
	// fields and Retry-After are already set in w.Header() when it is
	// called: it writes the status (normally 429) and a body.
	// Default: 429 with a short text/plain body, or the
	// application/problem+json body of the quota-exceeded problem type when
	// the client accepts it or ProblemJSON is set.
	OnDenied func(http.ResponseWriter, *http.Request, Result)
	// OnError is called with every error of the rule's functions (Key,
	// Cost, LimitsFor) and of the backend. It is the place to log. Without
	// it, the errors are logged with log/slog's default logger, at most one
	// line per second per rule (with the number of errors left unlogged).
	// If it writes a response (calls WriteHeader or Write), the request
	// stops there. Otherwise a request is still limited: after an error of
	// the rule's functions it is decided under FallbackKey, a Cost of 1 or
	// the rule's Limits; after a backend error the Limiter's failure mode
	// answers: FailOpen passes the request without rate-limit fields,
	// FailClosed answers 503 Service Unavailable with Retry-After,
	// FailLocal answers the local decision. The error's text never
	// reaches the client. Default: nothing.
	//
	// A request whose own context ends before its decision is made (the
	// client went away, a server timeout) is no error of the rule: it
	// never reaches the next handler, whatever the failure mode, and is
	// answered 503 Service Unavailable (which a client that went away
	// never reads). The observer sees it as an Event with Err set.
	OnError func(http.ResponseWriter, *http.Request, error)
	// DryRun decides and counts every request, sets the rate-limit fields
	// and reports to the observer, but never denies: for rolling out a new
	// limit safely. A request that would have been denied passes, and the
	// observer sees an Event with Result.Allowed false.
	DryRun bool
	// ProblemJSON answers every denial with an application/problem+json
	// body, whatever the client's Accept header.
	ProblemJSON bool

	// LimitsFor, when set, returns the limits of a request, chosen per
	// request: by the tenant's plan from a header, a token's claim or a
	// lookup. It returns none for the default, Limits (which must still be
	// valid). An error, or limits that are not valid (see Validate), go to
	// OnError, and unless OnError answers, the request is decided under
	// Limits. Limits of
	// the same algorithm and window share their stored state, so when a
	// tenant's plan changes mid-window its history carries over and only
	// the Count changes. Returning the same slices (one per plan) is
	// cheapest: each set of limits is validated once and its header values
	// kept, for up to 1024 distinct sets per rule. nethttp.Transport uses
	// Limits only.
	LimitsFor func(*http.Request) ([]Limit, error)
	// CountIf, when set, counts only the requests whose response status it
	// accepts: a request is checked and charged before the handler as
	// usual, and its units are given back after the handler (Limiter.Refund
	// of exactly its own units) when CountIf(status) is false. Charging
	// first keeps requests in flight counted, so the limit stays exact
	// under concurrency. For failed logins only:
	//
	//	CountIf: func(status int) bool { return status == 401 || status == 403 },
	//
	// A handler that panics counts as 500. A refund adds a round trip to
	// Redis after the handler; its error goes to OnError (the response is
	// written by then). Such a rule shows its rate-limit fields only on
	// its own denials: an allowed request's units may be given back, so
	// its numbers would mislead (other rules' fields show as usual).
	CountIf func(status int) bool
	// Penalty, when set, bans a key that keeps being denied: see Penalty.
	Penalty *Penalty
	// PartitionKey adds the partition key parameter (pk) of
	// draft-ietf-httpapi-ratelimit-headers-11 to the IETF fields: the first
	// 12 bytes of the SHA-256 of the request's key, as a structured-field
	// byte sequence, so that a client can tell its partitions apart. It is
	// a digest, never the key itself; a key from a small space (an IP
	// address) can still be found from it by trying every value.
	PartitionKey bool
}

// Penalty bans a key that keeps hitting its limits (a penalty box): after
// Denials denials of one key within Within, the key is banned for Ban on
// every replica. While banned, every request of the key is denied, with a
// Retry-After of the ban's time left, and counted nowhere; the deny cache
// answers them without a round trip. An application/problem+json answer
// to a banned key has the type ProblemAbnormalUsage, not
// ProblemQuotaExceeded, so that a client can tell a ban from a limit. A
// ban is the same stored state as Limiter.Block: Reset lifts it.
//
// The denials are counted atomically with the decisions that deny, in the
// same script call; the first counted denial starts the Within period,
// and the ban starts the count afresh.
type Penalty struct {
	// Denials is the number of denials that bans the key: at least 1.
	Denials int64
	// Within is the time, from the first denial counted, in which Denials
	// denials ban the key: from 1ms to MaxWindow.
	Within time.Duration
	// Ban is how long a ban lasts: from 1ms to MaxBlock.
	Ban time.Duration
}

// problem describes what is wrong with p, or returns "".
func (p Penalty) problem() string {
	switch {
	case p.Denials < 1:
		return fmt.Sprintf("Penalty.Denials %d must be at least 1", p.Denials)
	case p.Within < time.Millisecond || p.Within > MaxWindow:
		return fmt.Sprintf("Penalty.Within %s must be in [1ms, %s]", p.Within, MaxWindow)
	case p.Ban < time.Millisecond || p.Ban > MaxBlock:
		return fmt.Sprintf("Penalty.Ban %s must be in [1ms, %s]", p.Ban, MaxBlock)
	}
	return ""
}

// maxRuleName is the longest Rule.Name.
const maxRuleName = 64

// Validate reports whether the rule can be enforced. Its errors wrap
// ErrInvalidRule, and ErrInvalidLimit or ErrNoLimits where they apply.
func (r Rule) Validate() error {
	switch {
	case r.Name == "":
		return fmt.Errorf("%w: empty Name", ErrInvalidRule)
	case len(r.Name) > maxRuleName:
		return fmt.Errorf("%w %q: Name is longer than %d bytes", ErrInvalidRule, r.Name, maxRuleName)
	case r.Headers > None:
		return fmt.Errorf("%w %q: unknown %s", ErrInvalidRule, r.Name, r.Headers)
	case len(r.Limits) == 0:
		return fmt.Errorf("%w %q: %w", ErrInvalidRule, r.Name, unprefixed{ErrNoLimits})
	}
	for i := 0; i < len(r.Name); i++ {
		if c := r.Name[i]; c <= ' ' || c > '~' || c == ':' || c == '{' || c == '}' {
			return fmt.Errorf("%w %q: Name may hold printable ASCII but no space, ':', '{' or '}'", ErrInvalidRule, r.Name)
		}
	}
	if r.Penalty != nil {
		if p := r.Penalty.problem(); p != "" {
			return fmt.Errorf("%w %q: %s", ErrInvalidRule, r.Name, p)
		}
	}
	if err := ruleLimits(r.Limits); err != nil {
		return fmt.Errorf("%w %q: %w", ErrInvalidRule, r.Name, unprefixed{err})
	}
	return nil
}

// ruleLimits checks the limits of a rule: those of every call (see
// validateLimits), with printable policy names, unique within the rule.
func ruleLimits(limits []Limit) error {
	if err := validateLimits(limits); err != nil {
		return err
	}
	for i, lim := range limits {
		name := lim.PolicyName()
		if !printable(name) {
			return fmt.Errorf("%w #%d: policy name %q is not printable ASCII", ErrInvalidLimit, i, name)
		}
		for j, prev := range limits[:i] {
			if prev.PolicyName() == name {
				return fmt.Errorf("%w: limits #%d and #%d have the policy name %q: set Limit.Name", ErrInvalidLimit, j, i, name)
			}
		}
	}
	return nil
}

// printable reports whether s is non-empty printable ASCII (%x20-7E), the
// characters of a structured-field string.
func printable(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// Enforcer applies one Rule with one Limiter to HTTP requests. It is the
// single implementation behind every adapter: the adapters only translate
// their framework's request and response to Handle. It is safe for
// concurrent use.
type Enforcer struct {
	l         *Limiter
	name      string
	prefix    string // name + ":"
	limits    []Limit
	key       func(*http.Request) (string, error)
	fallback  func(*http.Request) (string, error)
	cost      func(*http.Request) int64
	skip      func(*http.Request) bool
	onDenied  func(http.ResponseWriter, *http.Request, Result)
	onError   func(http.ResponseWriter, *http.Request, error)
	limitsFor func(*http.Request) ([]Limit, error)
	countIf   func(int) bool
	penalty   *Penalty
	style     HeaderStyle
	dryRun    bool
	problem   bool
	pk        bool
	hdr       headerSet
	sets      limitSets // LimitsFor's limits, validated, with their headers
	logs      errorLog  // OnError's default
}

// NewEnforcer validates rule and prepares what every request of it shares:
// the default key function and the header values of its limits.
func NewEnforcer(l *Limiter, rule Rule) (*Enforcer, error) {
	if l == nil {
		return nil, fmt.Errorf("%w %q: nil Limiter", ErrInvalidRule, rule.Name)
	}
	if err := rule.Validate(); err != nil {
		return nil, err
	}
	e := &Enforcer{
		l:        l,
		name:     rule.Name,
		prefix:   rule.Name + ":",
		limits:   slices.Clone(rule.Limits),
		key:      rule.Key,
		fallback: rule.FallbackKey,
		cost:     rule.Cost,
		skip:     rule.Skip,
		onDenied: rule.OnDenied,
		onError:  rule.OnError,
		style:    rule.Headers,
		dryRun:   rule.DryRun,
		problem:  rule.ProblemJSON,

		limitsFor: rule.LimitsFor,
		countIf:   rule.CountIf,
		pk:        rule.PartitionKey,
	}
	if rule.Penalty != nil {
		p := *rule.Penalty
		e.penalty = &p
	}
	if e.key == nil {
		e.key = keyfuncs.IP()
	}
	if e.fallback == nil {
		e.fallback = keyfuncs.IP()
	}
	e.hdr = newHeaderSet(e.limits)
	e.sets.seed = maphash.MakeSeed()
	return e, nil
}

// Name returns the rule's name.
func (e *Enforcer) Name() string { return e.name }

// Limits returns a copy of the rule's limits (Rule.Limits).
func (e *Enforcer) Limits() []Limit { return slices.Clone(e.limits) }

// Key returns the Limiter key of r under the rule: the rule's Name, ":",
// and the key function's result. An empty result is an error that matches
// keyfuncs.ErrNoKey.
func (e *Enforcer) Key(r *http.Request) (string, error) {
	k, err := e.key(r)
	if err != nil {
		return "", err
	}
	if k == "" {
		return "", errEmptyKey
	}
	return e.prefix + k, nil
}

// Cost returns the units r takes under the rule. A cost below 1 is an error
// that matches ErrInvalidCost.
func (e *Enforcer) Cost(r *http.Request) (int64, error) {
	if e.cost == nil {
		return 1, nil
	}
	n := e.cost(r)
	if n < 1 {
		return 0, fmt.Errorf("%w: the rule's Cost returned %d", ErrInvalidCost, n)
	}
	return n, nil
}

// Wait blocks until n units of key fit under the rule's limits and records
// them: Limiter.WaitN, with observers told the rule's name. key is what Key
// returned. It is the outbound side of a rule, used by nethttp.Transport.
func (e *Enforcer) Wait(ctx context.Context, key string, n int64) error {
	return e.l.waitN(ctx, e.name, key, n, e.limits)
}

var errEmptyKey = fmt.Errorf("%w: the key function returned an empty key", keyfuncs.ErrNoKey)

// Handle decides r under the rule and, when the request stops here, writes
// the response to w: 429 for a denial, 503 when the backend failed and the
// Limiter fails closed. route is the framework's route pattern of r
// ("/users/{id}"), or "" when there is none; it is stored with
// keyfuncs.WithRoute for the key function.
//
// Handle returns the request to pass on and true when the next handler
// should run: that request carries the route and the rule's decision in its
// context, so that a second rule on the same route shows the most
// restrictive of the two, in the same style (see Rule.Headers). It
// returns nil and false when it has answered.
func (e *Enforcer) Handle(w http.ResponseWriter, r *http.Request, route string) (*http.Request, bool) {
	return e.HandleFrom(w, r, route, nil)
}

// HandleFrom is Handle for a framework with a request context of its own,
// fc (*gin.Context, echo.Context): the rule's functions can read it back
// with FrameworkContext, for values that earlier middleware stored there
// (ginmw.Key, echomw.Key). It allocates nothing more than Handle.
func (e *Enforcer) HandleFrom(w http.ResponseWriter, r *http.Request, route string, fc any) (*http.Request, bool) {
	r, st := prepare(r, route)
	st.framework = fc
	if e.skip != nil && e.skip(r) {
		return r, true
	}
	key, err := e.Key(r)
	if err != nil {
		if e.report(w, r, err, fallbackMessage) {
			return nil, false
		}
		key = e.fallbackKey(r)
	}
	n, err := e.Cost(r)
	if err != nil {
		if e.report(w, r, err, fallbackMessage) {
			return nil, false
		}
		n = 1
	}
	limits, hs := e.limits, &e.hdr
	if e.limitsFor != nil {
		if ls, h, err := e.requestLimits(r); err == nil {
			limits, hs = ls, h
		} else if e.report(w, r, err, fallbackMessage) {
			return nil, false
		}
	}
	res, at, err := e.l.decide(r.Context(), OpAllow, e.name, key, n, limits, e.penalty)
	var pass bool
	switch {
	case err != nil: // no decision: the request's context ended
		e.undecided(w, r, hs, err)
		return nil, false
	case res.BackendErr != nil: // the failure mode's decision
		pass = e.failed(w, r, st, hs, key, res)
	default:
		pass = e.apply(w, r, st, hs, key, res)
	}
	// a charge to settle after the handler: units were recorded, by Redis
	// or by FailLocal's local store (FailOpen records none)
	if pass && e.countIf != nil && res.Allowed && (res.BackendErr == nil || e.l.mode == FailLocal) {
		st.charges = append(st.charges, charge{e: e, key: key, n: n, limits: limits, at: at, local: res.BackendErr != nil})
	}
	return passOn(r, pass)
}

// fallbackKey returns the Limiter key of a request whose key function
// failed: Name + ":nokey:" + FallbackKey's result, else Name + ":nokey".
func (e *Enforcer) fallbackKey(r *http.Request) string {
	if k, err := e.fallback(r); err == nil && k != "" {
		return e.prefix + noKey + ":" + k
	}
	return e.prefix + noKey
}

// noKey names the keys of requests whose key function failed (see
// Rule.FallbackKey). keyfuncs' keys all start with their kind ("ip:",
// "h:", "user:"), never with it.
const noKey = "nokey"

// undecided answers a request that got no decision: its own context ended
// first (err is ctx's error), or, which no valid rule does, the Limiter
// refused its arguments. It never passes: its handler would run
// uncounted. The answer is FailClosed's 503; a client that went away
// never reads it, and a server timeout gets a clear one. Only an error
// that is not the context's is reported: a client that leaves is no
// error of the rule.
func (e *Enforcer) undecided(w http.ResponseWriter, r *http.Request, hs *headerSet, err error) {
	if r.Context().Err() == nil && e.report(w, r, err, undecidedMessage) {
		return
	}
	hs.writeUnavailable(w, e.problem || acceptsProblem(r.Header[hdrAccept]))
}

// requestLimits returns the limits LimitsFor gives r, or the rule's when
// it gives none, and their header values. A set of limits seen before is
// found by its hash, with no allocation; a new one is validated first.
func (e *Enforcer) requestLimits(r *http.Request) ([]Limit, *headerSet, error) {
	limits, err := e.limitsFor(r)
	switch {
	case err != nil:
		return nil, nil, fmt.Errorf("the rule's LimitsFor: %w", err)
	case len(limits) == 0:
		return e.limits, &e.hdr, nil
	}
	set, err := e.sets.get(limits)
	if err != nil {
		return nil, nil, fmt.Errorf("the rule's LimitsFor: %w", err)
	}
	return set.limits, &set.hdr, nil
}

// Settles reports whether the rule settles a request's charge after its
// handler (Rule.CountIf): an adapter then runs the next handlers through
// SettleAfter (ServeNext does it for net/http).
func (e *Enforcer) Settles() bool { return e.countIf != nil }

// SettleAfter runs serve, which calls the next handlers of r (the request
// Handle returned) and returns the response's status, then gives back the
// units the rule charged r when Rule.CountIf rejects that status. A serve
// that panics counts as 500, and the panic goes on up. It does nothing
// more than serve for a rule without CountIf or a request not charged.
func (e *Enforcer) SettleAfter(r *http.Request, serve func() (status int)) {
	returned := false
	defer func() {
		if !returned { // the handler panicked
			e.settle(r, http.StatusInternalServerError)
		}
	}()
	status := serve()
	returned = true
	e.settle(r, status)
}

// settle gives back the units the rule charged r when Rule.CountIf rejects
// status, once per request.
func (e *Enforcer) settle(r *http.Request, status int) {
	if e.countIf == nil {
		return
	}
	st, _ := r.Context().Value(shownKey{}).(*shown)
	if st == nil {
		return
	}
	for i := range st.charges {
		c := &st.charges[i]
		if c.e != e || c.settled {
			continue
		}
		c.settled = true
		if e.countIf(status) {
			return
		}
		// the client may be gone: the units go back all the same
		ctx := context.WithoutCancel(r.Context())
		if err := e.l.refundAt(ctx, c.key, c.n, c.limits, c.at, c.local); err != nil {
			e.report(discard{}, r, fmt.Errorf("refund after status %d: %w", status, err), refundMessage)
		}
		return
	}
}

// ServeNext serves r with next: the adapters' call of the next handler for
// a request Handle passed. For a rule with CountIf, it captures the
// response status through a ResponseWriter that keeps http.Flusher,
// http.Hijacker, io.ReaderFrom and http.ResponseController working (it
// has Unwrap), and settles by it (see SettleAfter).
func (e *Enforcer) ServeNext(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if e.countIf == nil {
		next.ServeHTTP(w, r)
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	e.SettleAfter(r, func() int {
		next.ServeHTTP(sw, r)
		return sw.code()
	})
}

// passOn returns r and true when the request passes, else nil and false.
func passOn(r *http.Request, pass bool) (*http.Request, bool) {
	if !pass {
		return nil, false
	}
	return r, true
}

// apply answers a decision: the rate-limit fields, and a denial unless the
// rule is a dry run. It reports whether the request passes. hs holds the
// header values of the request's limits.
//
// A response shows one decision's fields, in one style (see shown): an
// allowed request the most restrictive decision of the rules that show
// theirs, a denied one the denial. A rule with CountIf shows its numbers
// only when it denies: an allowed request's units may be given back after
// the handler, so its numbers would be wrong.
func (e *Enforcer) apply(w http.ResponseWriter, r *http.Request, st *shown, hs *headerSet, key string, res Result) bool {
	h := w.Header()
	style := st.style(e.style)
	if res.Allowed || e.dryRun {
		if style != None && e.countIf == nil {
			earlier := st.e != nil
			if st.replace(e, res) {
				if earlier {
					clearRateHeaders(h)
				}
				hs.write(h, style, res, e.partition(key))
			}
		}
		return true
	}
	clearRateHeaders(h)
	hs.write(h, style, res, e.partition(key))
	if !res.Never() {
		h[hdrRetryAfter] = []string{strconv.FormatInt(retrySeconds(res.RetryAfter), 10)}
	}
	if e.onDenied != nil {
		e.onDenied(w, r, res)
	} else {
		hs.writeDenied(w, res, e.problem || acceptsProblem(r.Header[hdrAccept]))
	}
	return false
}

// partition returns the pk parameter of key's IETF fields, or "" when the
// rule has none.
func (e *Enforcer) partition(key string) string {
	if !e.pk || key == "" {
		return ""
	}
	return partitionKey(key)
}

// failed answers a decision of the failure mode, whose backend failure is
// in res.BackendErr: OnError first, then the failure mode. It reports
// whether the request passes.
func (e *Enforcer) failed(w http.ResponseWriter, r *http.Request, st *shown, hs *headerSet, key string, res Result) bool {
	if e.report(w, r, res.BackendErr, failureMessage) {
		return false
	}
	switch e.l.mode {
	case FailClosed:
		if e.dryRun {
			return true
		}
		hs.writeUnavailable(w, e.problem || acceptsProblem(r.Header[hdrAccept]))
		return false
	case FailLocal:
		return e.apply(w, r, st, hs, key, res)
	}
	return true
}

// report hands err, named by the rule, to OnError with w, and reports
// whether OnError wrote a response; without OnError, to the default log
// with msg, which says what the rule did about it.
func (e *Enforcer) report(w http.ResponseWriter, r *http.Request, err error, msg string) (wrote bool) {
	err = ruleError{e.name, err}
	if e.onError == nil {
		e.logs.log(err, msg, e.l.mode)
		return false
	}
	ew := &errorWriter{ResponseWriter: w}
	e.onError(ew, r, err)
	return ew.wrote
}

// discard is a ResponseWriter that writes nowhere.
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}

// errorWriter records whether OnError wrote a response.
type errorWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *errorWriter) WriteHeader(code int) { w.wrote = true; w.ResponseWriter.WriteHeader(code) }

func (w *errorWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap returns the ResponseWriter, for http.ResponseController.
func (w *errorWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// shownKey is the context key of a request's *shown.
type shownKey struct{}

// shown is the decision whose rate-limit fields a response carries, shared
// by every rule on the request's way through the middleware: a rule
// replaces the fields only with a more restrictive decision, so stacked
// rules show the most restrictive one, in whatever order they run.
type shown struct {
	context.Context
	e         *Enforcer
	res       Result
	fields    HeaderStyle // the response's style, once styled
	styled    bool
	framework any      // the adapter's own request context (HandleFrom)
	charges   []charge // units to settle after the handler (CountIf)
}

// charge is what a rule with CountIf took from a request, to give back by
// its response's status.
type charge struct {
	e       *Enforcer
	key     string
	n       int64
	limits  []Limit
	at      int64 // µs: the decision's time, the units' own
	local   bool  // FailLocal's local store recorded them
	settled bool
}

// frameworkKey is the context key of FrameworkContext.
type frameworkKey struct{}

// Value returns the shown itself for shownKey, the framework's context for
// frameworkKey, else the parent's value.
func (s *shown) Value(key any) any {
	switch key {
	case shownKey{}:
		return s
	case frameworkKey{}:
		return s.framework
	}
	return s.Context.Value(key)
}

// FrameworkContext returns the framework's own context of a request that an
// adapter passed to Enforcer.HandleFrom (*gin.Context for ginmw,
// echo.Context for echomw), or nil.
func FrameworkContext(r *http.Request) any { return r.Context().Value(frameworkKey{}) }

// style returns the style in which a rule of style own writes its fields:
// None when own is None (the rule shows none), else the style of the
// first rule on the request's way that shows fields, so that a response
// has one style whichever rule's numbers it carries. A nil s returns own.
func (s *shown) style(own HeaderStyle) HeaderStyle {
	switch {
	case own == None || s == nil:
		return own
	case !s.styled:
		s.fields, s.styled = own, true
	}
	return s.fields
}

// replace reports whether res of rule e is more restrictive than the shown
// decision, and if so records it. A nil s always replaces.
func (s *shown) replace(e *Enforcer, res Result) bool {
	if s == nil {
		return true
	}
	if s.e != nil && !moreRestrictive(e, res, s.e, s.res) {
		return false
	}
	s.e, s.res = e, res
	return true
}

// moreRestrictive orders allowed decisions: fewer remaining, then a later
// reset, then a smaller limit, then the names, so that the outcome does not
// depend on the order of the middleware.
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
	return e.name < e0.name
}

// prepare returns r with the route pattern (when given) and a shown in its
// context, reusing what an earlier rule stored, and the shown.
func prepare(r *http.Request, route string) (*http.Request, *shown) {
	ctx := r.Context()
	st, _ := ctx.Value(shownKey{}).(*shown)
	addRoute := false
	if route != "" {
		p, _ := keyfuncs.RouteFrom(ctx)
		addRoute = p != route
	}
	if st != nil && !addRoute {
		return r, st
	}
	if addRoute {
		ctx = keyfuncs.WithRoute(ctx, route)
	}
	if st == nil {
		st = &shown{Context: ctx}
		ctx = st
	}
	return r.WithContext(ctx), st
}

// ByIP returns the Rule of the adapters' LimitByIP: n requests per window
// for each client IP (keyfuncs.IP, no trusted proxy), named after the limit
// ("ip-100-per-1m"), so that two such rules with different limits never
// share counters. Two with the same limit do share them, on every route
// they guard: give a Rule its own Name to keep them apart.
func ByIP(n int64, window time.Duration) Rule {
	lim := Per(n, window)
	return Rule{Name: "ip-" + lim.PolicyName(), Limits: []Limit{lim}, Key: keyfuncs.IP()}
}
