package core

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/maphash"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Policy is the transport-independent part of a rule, for requests of type
// R (grpcmw builds one for gRPC calls). Its fields mean what Rule's do.
type Policy[R any] struct {
	Name   string                  // the rule's namespace
	Limits []Limit                 // must all admit a request for it to pass
	Key    func(R) (string, error) // required
	// FallbackKey keys a request whose Key failed; nil: Name + ":nokey".
	FallbackKey  func(R) (string, error)
	Cost         func(R) int64            // nil means 1
	Skip         func(R) bool             // reports requests that pass uncounted
	LimitsFor    func(R) ([]Limit, error) // each request's limits
	Penalty      *Penalty                 // bans a key that keeps being denied
	DryRun       bool                     // decide and count every request, never deny
	PartitionKey bool                     // adds pk to the IETF fields
	TrackDenied  bool                     // records the keys denied (Limiter.TopDenied)
	// CountIf, when set, counts only the requests whose status it accepts
	// (Charges.Settle, Charges.Stop): an HTTP status, or the transport's
	// own (grpcmw: a codes.Code).
	CountIf func(status int) bool
	// RefundIfStopped gives a request's units back when a later rule stops
	// it (Charges.Stop); not with a Penalty.
	RefundIfStopped bool
	// OnError is called with every error of the functions above and of
	// the backend, and reports whether it answered the request itself
	// (Verdict Answered). Nil: errors are logged, at most a line a second.
	OnError func(R, error) bool
}

// Decider applies one Policy with one Limiter, for a transport that writes
// the Decision's answer. It is safe for concurrent use.
type Decider[R any] struct {
	l    *Limiter
	p    Policy[R] // validated, with its own Limits and Penalty (none for a dry run)
	hdr  headerSet
	sets limitSets // LimitsFor's limits, validated, with their headers
	logs errorLog  // OnError's default
}

// NewDecider validates p as Rule.Validate does (Key is required).
func NewDecider[R any](l *Limiter, p Policy[R]) (*Decider[R], error) {
	switch {
	case l == nil:
		return nil, fmt.Errorf("%w %q: nil Limiter", ErrInvalidRule, p.Name)
	case p.Key == nil:
		return nil, fmt.Errorf("%w %q: nil Key", ErrInvalidRule, p.Name)
	}
	if err := validateRule(p.Name, p.Limits, p.Penalty, p.RefundIfStopped); err != nil {
		return nil, err
	}
	p.Limits = slices.Clone(p.Limits)
	switch {
	case p.DryRun: // a dry run bans nobody: its bans would deny under the rule enforced
		p.Penalty = nil
	case p.Penalty != nil:
		pen := *p.Penalty
		p.Penalty = &pen
	}
	if p.TrackDenied {
		l.track(p.Name)
	}
	return &Decider[R]{l: l, p: p, hdr: newHeaderSet(p.Limits), sets: limitSets{seed: maphash.MakeSeed()}}, nil
}

// Key returns the Limiter key of r: Name, ":", and Key's result, escaped as
// Rule.FallbackKey says. An empty result matches keyfuncs.ErrNoKey.
func (d *Decider[R]) Key(r R) (string, error) {
	k, err := d.p.Key(r)
	switch {
	case err != nil:
		return "", err
	case k == "":
		return "", errEmptyKey
	}
	return RuleKey(d.p.Name, k), nil
}

// RuleKey returns the Limiter key under which the Rule or Policy named rule
// counts the requests its Key gives key: rule + ":" + key, with "~" before
// a key that starts with "nokey" or "~" (see Rule.FallbackKey). Tools look
// a rule's keys up with it (Limiter.Usage, SetOverride).
func RuleKey(rule, key string) string {
	if strings.HasPrefix(key, keyEscape) || strings.HasPrefix(key, noKey) {
		return rule + ":" + keyEscape + key
	}
	return rule + ":" + key
}

// fallbackKey returns the Limiter key of a request whose Key failed.
func (d *Decider[R]) fallbackKey(r R) string {
	if d.p.FallbackKey != nil {
		if k, err := d.p.FallbackKey(r); err == nil && k != "" {
			return d.p.Name + ":" + noKey + ":" + k
		}
	}
	return d.p.Name + ":" + noKey
}

// Cost returns the units r takes. A cost below 1 is an error that matches
// ErrInvalidCost.
func (d *Decider[R]) Cost(r R) (int64, error) {
	if d.p.Cost == nil {
		return 1, nil
	}
	n := d.p.Cost(r)
	if n < 1 {
		return 0, fmt.Errorf("%w: the rule's Cost returned %d", ErrInvalidCost, n)
	}
	return n, nil
}

// wait is Limiter.WaitN of key (what Key returned) under the policy's
// limits, with observers told the rule's name.
func (d *Decider[R]) wait(ctx context.Context, key string, n int64) error {
	return d.l.waitN(ctx, d.p.Name, key, n, d.p.Limits)
}

// Verdict is what becomes of a request a Decider decided.
type Verdict uint8

const (
	// Pass: the request goes on (allowed, skipped, a dry run, or the
	// failure mode admitted it).
	Pass Verdict = iota
	// Denied: the limits refused it (HTTP 429, gRPC RESOURCE_EXHAUSTED).
	Denied
	// Unavailable: the Limiter fails closed, shed the decision (ErrShed) or
	// the request's context ended (HTTP 503 with Retry-After: 1, gRPC UNAVAILABLE).
	Unavailable
	// Answered: OnError answered the request itself.
	Answered
)

// String returns "pass", "denied", "unavailable" or "answered".
func (v Verdict) String() string { return enumName(v, verdicts[:], "verdict") }

var verdicts = [...]string{"pass", "denied", "unavailable", "answered"}

// Decision is a Decider's answer to one request.
type Decision struct {
	Verdict Verdict // what becomes of the request
	Result  Result  // the Limiter's decision; zero when skipped or none
	Key     string  // the Limiter key the request was counted under, or ""
	// Shown reports whether the rate-limit fields describe the request:
	// false when skipped, undecided, or answered by FailOpen or FailClosed.
	Shown bool

	hdr     *headerSet
	units   taken
	charged bool // units were recorded (by Redis or FailLocal)
}

// taken is what a decision recorded, to give back.
type taken struct {
	n      int64
	limits []Limit
	at     int64 // µs: the decision's time, the units' own
	local  bool  // FailLocal's local store recorded them
}

// Banned reports whether a denial is a ban (Penalty) or a Limiter.Block.
func (dec Decision) Banned() bool { return dec.Result.blocked }

// Policies returns the policy names of the limits a Denied decision's
// denied (none for a ban), or of an Unavailable one, every limit.
func (dec Decision) Policies() []string {
	if dec.hdr == nil || dec.Verdict == Denied && dec.Result.blocked {
		return nil
	}
	var names []string
	for i := range dec.hdr.limits {
		if dec.Verdict != Denied || dec.Result.violated&(1<<i) != 0 {
			names = append(names, dec.hdr.limits[i].name)
		}
	}
	if len(names) == 0 && dec.Verdict == Denied {
		names = append(names, dec.hdr.lookup(dec.Result.Limit).name)
	}
	return names
}

// Charged reports whether the request's units were recorded (see GiveBack).
func (dec Decision) Charged() bool { return dec.charged }

// Decide decides r, ctx the request's own; errors go to OnError (see
// Rule.OnError).
func (d *Decider[R]) Decide(ctx context.Context, r R) Decision {
	if d.p.Skip != nil && d.p.Skip(r) {
		return Decision{}
	}
	key, err := d.Key(r)
	if err != nil && d.report(r, err, fallbackMessage) {
		return Decision{Verdict: Answered}
	} else if err != nil {
		key = d.fallbackKey(r)
	}
	n, err := d.Cost(r)
	if err != nil && d.report(r, err, fallbackMessage) {
		return Decision{Verdict: Answered}
	} else if err != nil {
		n = 1
	}
	limits, hs := d.p.Limits, &d.hdr
	if d.p.LimitsFor != nil { // none: the rule's
		var set *limitSet
		ls, err := d.p.LimitsFor(r)
		if err == nil && len(ls) > 0 {
			set, err = d.sets.get(ls)
		}
		if err != nil && d.report(r, fmt.Errorf("the rule's LimitsFor: %w", err), fallbackMessage) {
			return Decision{Verdict: Answered}
		} else if set != nil {
			limits, hs = set.limits, &set.hdr
		}
	}
	res, at, err := d.l.decide(ctx, OpAllow, d.p.Name, key, n, limits, d.p.Penalty)
	dec := Decision{Result: res, Key: key, hdr: hs, units: taken{n: n, limits: limits, at: at, local: res.BackendErr != nil}}
	switch {
	case err != nil: // no decision: the request's context ended, or is nil
		dec.Verdict = Unavailable
		if (ctx == nil || ctx.Err() == nil) && d.report(r, err, undecidedMessage) {
			dec.Verdict = Answered
		}
		return dec
	case res.BackendErr != nil && d.report(r, res.BackendErr, failureMessage):
		dec.Verdict, dec.charged = Answered, res.Allowed && d.l.guard.mode == FailLocal
		return dec
	}
	dec.Verdict, dec.Shown = verdict(res, d.l.guard.mode, d.p.DryRun)
	dec.charged = dec.Verdict == Pass && res.Allowed && (res.BackendErr == nil || d.l.guard.mode == FailLocal)
	return dec
}

// verdict answers res under failure mode mode, and reports whether its
// rate-limit fields are shown (see Verdict).
func verdict(res Result, mode FailureMode, dryRun bool) (Verdict, bool) {
	if res.BackendErr != nil {
		if errors.Is(res.BackendErr, ErrShed) {
			mode = FailClosed
		}
		switch {
		case mode == FailOpen || mode == FailClosed && dryRun:
			return Pass, false
		case mode == FailClosed:
			return Unavailable, false
		}
	}
	if res.Allowed || dryRun {
		return Pass, true
	}
	return Denied, true
}

// GiveBack gives back the units dec recorded (when Charged), at most once
// per Decision. why is quoted in the error OnError receives when the refund
// fails (a nil ctx is such an error). ctx's cancellation is ignored.
func (d *Decider[R]) GiveBack(ctx context.Context, r R, dec Decision, why string) {
	if dec.charged {
		d.giveBack(ctx, r, dec.Key, dec.units, why)
	}
}

// giveBack gives back the units u that a decision of key recorded.
func (d *Decider[R]) giveBack(ctx context.Context, r R, key string, u taken, why string) {
	err := errNilContext
	if ctx != nil {
		err = d.l.refundAt(context.WithoutCancel(ctx), key, u.n, u.limits, u.at, u.local)
	}
	if err != nil {
		d.report(r, fmt.Errorf("refund (%s): %w", why, err), refundMessage)
	}
}

// report hands err to OnError, or logs it with msg, and reports whether
// OnError answered the request.
func (d *Decider[R]) report(r R, err error, msg string) (answered bool) {
	err = ruleError{d.p.Name, unprefixed{err}}
	if d.p.OnError == nil {
		d.logs.log(err, msg, d.l.guard.mode)
		return false
	}
	return d.p.OnError(r, err)
}

// SetFields sets in h the fields of an HTTP answer to dec: for a Shown
// decision the rate-limit fields of style, and for a denial Retry-After
// (seconds rounded up, none when it never passes); for Unavailable,
// Retry-After: 1. It replaces only those.
func (d *Decider[R]) SetFields(h http.Header, style HeaderStyle, dec Decision) {
	switch {
	case dec.Verdict == Unavailable:
		h[hdrRetryAfter] = []string{"1"}
		return
	case !dec.Shown || dec.hdr == nil:
		return
	}
	var pk []byte // ";pk=:<base64 of the first 12 bytes of the key's SHA-256>:" (PartitionKey)
	if d.p.PartitionKey && dec.Key != "" {
		var buf [len(";pk=::") + 16]byte
		sum := sha256.Sum256([]byte(dec.Key))
		pk = append(base64.StdEncoding.AppendEncode(append(buf[:0], ";pk=:"...), sum[:12]), ':')
	}
	dec.hdr.write(h, style, dec.Result, pk)
	if dec.Verdict == Denied && !dec.Result.Never() {
		h[hdrRetryAfter] = []string{strconv.FormatInt(retrySeconds(dec.Result.RetryAfter), 10)}
	}
}

// The key of a request whose Key failed, and the escape (Rule.FallbackKey).
const (
	noKey     = "nokey"
	keyEscape = "~"
)
