package nethttp

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/margin"
	"github.com/ratewindow/ratewindow/keyfuncs"
)

// Transport is an http.RoundTripper for outbound requests that waits for
// its Limiter instead of failing: the throttler for a third-party API with
// a quota shared by every replica of a service.
//
//	l, _ := core.New(redisClient)
//	client := &http.Client{Transport: &nethttp.Transport{
//		Limiter: l,
//		Rule:    core.Rule{Name: "pricing-api", Limits: []core.Limit{core.PerSecond(200)}},
//	}}
//
// Each request the client sends, a redirect's too, takes Rule.Cost units
// under every limit of the rule with Limiter.WaitN: on sliding-log limits
// one round trip reserves the earliest slot across all replicas and the
// request sleeps until then, in order; other algorithms poll. Then it is
// sent with Base. A request is never sent
// before its slot and never dropped: RoundTrip returns an error without
// sending only when the request's context ends first (its error), when the
// slot lies past the context's deadline (core.ErrWaitExceedsDeadline, at
// once, nothing counted), or when the key, the cost or the rule is bad. The
// request's body is closed then, as http.RoundTripper requires. When Redis
// fails, the Limiter's failure mode decides: FailOpen sends the request
// without waiting, FailClosed returns the error, FailLocal waits on this
// process's share of the limits.
//
// Of the Rule, Transport uses Name, Limits, Key, Cost and Skip; the other
// fields describe server answers and are ignored. The default Key is the
// request's host, "host:" + the lower-cased host of the URL, without the
// scheme's default port ("host:api.example.com", "host:10.0.0.7:8080"), so
// every host has its own quota. As for the middleware, the Limiter's key
// is the rule's Name, ":", and the key.
//
// # Obeying the upstream
//
// When a response refuses the request (429 Too Many Requests, or 503 with
// Retry-After) or says the quota is spent (an IETF RateLimit field with
// r=0), the Transport blocks the rule's key on every replica
// (core.Limiter.Block) for the time the upstream asked: Retry-After, as
// delta-seconds or an HTTP-date, else the t of the RateLimit field, else
// DefaultBlock (also for a refusal that asks for no time: Retry-After 0 or
// a past date); never longer than MaxBlock, so that a hostile upstream
// cannot freeze the fleet. A refused request is then sent again, up to
// MaxRetries times, when it can be replayed (no body, or GetBody set): it
// waits for its slot like any other, so the quota still holds. Only the
// last answer reaches the caller: when the next slot lies past the
// request's deadline, the caller gets the upstream's refusal, body intact,
// not an error.
//
// # Slots that survive the trip
//
// Requests that leave exactly a window apart can still arrive closer
// together, as each trip takes its own time, and a strict upstream then
// refuses the later one. The Transport therefore widens each limit's
// Window by Margin (default 1% of the window, at least 50ms but at most a
// tenth of it): at 10 per second it sends at most 10 per 1.05s, 5% below
// the nominal rate, and absorbs a start up to 10ms late (a later one takes
// another slot) and 40ms of the trip's jitter, which a loaded machine's
// scheduler alone makes 10–25ms. Every replica must use the same Margin:
// the window is part of the Redis key.
//
// A Transport is safe for concurrent use. Its fields must not change after
// its first request, and it must not be copied after that. NewTransport
// checks the rule at construction; a Transport built as a literal checks
// it on its first request, and every request fails while the rule is
// invalid.
type Transport struct {
	// Base sends the requests once they may go. Default
	// http.DefaultTransport.
	Base http.RoundTripper
	// Limiter decides when requests may go. Required.
	Limiter *core.Limiter
	// Rule names the limits, and the key and cost of a request.
	Rule core.Rule
	// OnWait, when set, is called with each request the rule counted and
	// the time it waited for the Limiter (a round trip at least), just
	// before it is sent; not for a request that Skip passes or that fails.
	// It is called on the goroutine of RoundTrip: keep it fast.
	OnWait func(*http.Request, time.Duration)
	// MaxRetries is how many times a refused request is sent again. Zero
	// means DefaultMaxRetries; a negative value turns retrying off.
	MaxRetries int
	// MaxBlock caps the time an upstream's refusal blocks the key. Zero
	// means DefaultMaxBlock.
	MaxBlock time.Duration
	// DefaultBlock is how long a refusal that names no time blocks the key.
	// Zero means DefaultRefusalBlock.
	DefaultBlock time.Duration
	// Margin widens each limit's Window, so that slots survive the
	// jitter of the trip (see above). Zero means 1% of each window, at
	// least 50ms but at most a tenth of it; a negative value, none.
	Margin time.Duration

	once sync.Once
	d    *core.Decider[*http.Request]
	err  error
}

// Defaults of the Transport's fields: core.Outbound's.
const (
	DefaultMaxRetries   = core.DefaultMaxRetries
	DefaultMaxBlock     = core.DefaultMaxBlock
	DefaultRefusalBlock = core.DefaultRefusalBlock
)

// NewTransport returns a Transport that sends requests with base (nil:
// http.DefaultTransport) when l and rule admit them, or the error of an
// invalid rule or a nil Limiter.
func NewTransport(base http.RoundTripper, l *core.Limiter, rule core.Rule) (*Transport, error) {
	t := &Transport{Base: base, Limiter: l, Rule: rule}
	if _, err := t.prepare(); err != nil {
		return nil, err
	}
	return t, nil
}

// prepare checks the rule once and keeps what every request shares.
func (t *Transport) prepare() (*core.Decider[*http.Request], error) {
	t.once.Do(func() {
		rule := t.Rule
		if rule.Key == nil {
			rule.Key = hostKey
		}
		p := core.Policy[*http.Request]{Name: rule.Name, Limits: margin.Widen(rule.Limits, t.Margin), Key: rule.Key, Cost: rule.Cost}
		if err := rule.Validate(); err != nil {
			t.err = fmt.Errorf("%w (nethttp.Transport)", err)
			return
		}
		t.d, t.err = core.NewDecider(t.Limiter, p)
		if t.err != nil {
			t.err = fmt.Errorf("%w (nethttp.Transport)", t.err)
		}
	})
	return t.d, t.err
}

// RoundTrip waits until the rule admits req, then sends it with Base; a
// refused request blocks the key and goes again (see Transport).
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	d, err := t.prepare()
	if err != nil {
		return nil, closeBody(req, err)
	}
	if t.Rule.Skip != nil && t.Rule.Skip(req) {
		return t.base().RoundTrip(req)
	}
	key, err := d.Key(req)
	if err != nil {
		return nil, closeBody(req, fmt.Errorf("ratewindow: transport rule %q: key: %w", t.Rule.Name, err))
	}
	n, err := d.Cost(req)
	if err != nil {
		return nil, closeBody(req, fmt.Errorf("ratewindow: transport rule %q: %w", t.Rule.Name, err))
	}
	var resp *http.Response // the last answer: a refusal the next attempt replaces
	var failed error        // send's: the request is the base's, closed
	o := core.Outbound{MaxRetries: t.MaxRetries, MaxBlock: t.MaxBlock, DefaultBlock: t.DefaultBlock}
	err = d.Throttle(req.Context(), key, n, o, func(attempt int, waited time.Duration) (core.Upstream, error) {
		if t.OnWait != nil {
			t.OnWait(req, waited)
		}
		send := req
		if attempt > 0 {
			drainClose(resp.Body)
			resp = nil
			var err error
			if send, err = replay(req); err != nil {
				failed = fmt.Errorf("ratewindow: transport rule %q: replay: %w", t.Rule.Name, err)
				return core.Upstream{}, failed
			}
		}
		if resp, failed = t.base().RoundTrip(send); failed != nil {
			return core.Upstream{}, failed
		}
		delay, refused, spent := refusal(resp, time.Now())
		return core.Upstream{Refused: refused, Spent: spent, Delay: delay, Final: !replayable(req)}, nil
	})
	switch {
	case err == nil:
		return resp, nil // the upstream's answer, body intact
	case failed != nil:
		return nil, failed
	case resp != nil: // a refusal whose retry cannot go
		drainClose(resp.Body)
	}
	return nil, closeBody(req, fmt.Errorf("ratewindow: transport rule %q: %w", t.Rule.Name, err))
}

// replayable reports whether req can be sent again: no body, or GetBody.
func replayable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// replay returns a copy of req with a fresh body.
func replay(req *http.Request) (*http.Request, error) {
	r := req.Clone(req.Context())
	if req.Body != nil && req.Body != http.NoBody {
		body, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		r.Body = body
	}
	return r, nil
}

// drainClose reads a little of a body that is thrown away, so that the
// connection can be reused, and closes it.
func drainClose(body io.ReadCloser) {
	_, _ = io.CopyN(io.Discard, body, 4<<10)
	_ = body.Close()
}

// refusal reads a response: refused for 429, or 503 with Retry-After;
// spent when a RateLimit field item says r=0; d is the time the upstream
// asked for (Retry-After, else the RateLimit t), or 0 when it names none.
func refusal(resp *http.Response, now time.Time) (d time.Duration, refused, spent bool) {
	retryAfter, hasRetry := parseRetryAfter(resp.Header.Get("Retry-After"), now)
	refused = resp.StatusCode == http.StatusTooManyRequests ||
		(resp.StatusCode == http.StatusServiceUnavailable && hasRetry)
	t, spent := parseRateLimit(resp.Header.Values("RateLimit"))
	switch {
	case hasRetry && (refused || spent):
		return retryAfter, refused, spent
	case spent:
		return t, refused, spent
	}
	return 0, refused, spent
}

// parseRetryAfter reads a Retry-After value: delta-seconds, or an
// HTTP-date (a time past is 0). ok is false when there is none or it is
// malformed.
func parseRetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, ok := parseSeconds(v); ok {
		return time.Duration(min(secs, int64(core.MaxBlock/time.Second))) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(at.Sub(now), 0), true
}

// parseSeconds reads a count of seconds (delta-seconds, RateLimit's t): a
// number too large for an int64 is the largest (RFC 9111 1.2.2: never read
// as a small one); false for a negative or malformed one.
func parseSeconds(v string) (int64, bool) {
	secs, err := strconv.ParseInt(v, 10, 64)
	if errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(v, "-") {
		return math.MaxInt64, true
	}
	return secs, err == nil && secs >= 0
}

// parseRateLimit reads IETF RateLimit field values (draft-10 and -11: a
// list of items `"name";r=0;t=5`): spent when an item has r=0, and then
// the longest t of those items. Malformed items are skipped.
func parseRateLimit(values []string) (t time.Duration, spent bool) {
	for _, v := range values {
		for _, item := range splitUnquoted(v, ',') {
			params := splitUnquoted(item, ';')
			if len(params) < 2 {
				continue
			}
			r, tt := int64(-1), int64(0)
			for _, p := range params[1:] {
				name, val, ok := strings.Cut(strings.TrimSpace(p), "=")
				if !ok {
					continue
				}
				n, ok := parseSeconds(val)
				if !ok {
					continue
				}
				switch name {
				case "r":
					r = n
				case "t":
					tt = min(n, int64(core.MaxBlock/time.Second))
				}
			}
			if r == 0 {
				spent = true
				t = max(t, time.Duration(tt)*time.Second)
			}
		}
	}
	return t, spent
}

// splitUnquoted splits s at each sep outside a structured field's string
// ("...", where \ escapes the next byte): a policy name may hold sep.
func splitUnquoted(s string, sep byte) []string {
	var parts []string
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++ // the escaped byte
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
}

// CloseIdleConnections closes the idle connections of Base, when it can,
// so that http.Client.CloseIdleConnections reaches it.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base().(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

// closeBody closes req's body, which a RoundTripper must do even when it
// fails, and returns err.
func closeBody(req *http.Request, err error) error {
	if req.Body != nil {
		_ = req.Body.Close()
	}
	return err
}

var errNoHost = fmt.Errorf("%w: the request has no host", keyfuncs.ErrNoKey)

// hostKey is the Transport's default key: "host:" + the request's host,
// lower-cased, without the scheme's default port.
func hostKey(r *http.Request) (string, error) {
	host := r.Host
	if r.URL != nil && r.URL.Host != "" {
		host = r.URL.Host
	}
	if host == "" {
		return "", errNoHost
	}
	host = strings.ToLower(host)
	scheme := ""
	if r.URL != nil {
		scheme = strings.ToLower(r.URL.Scheme)
	}
	switch {
	case scheme == "https" && strings.HasSuffix(host, ":443"):
		host = strings.TrimSuffix(host, ":443")
	case scheme == "http" && strings.HasSuffix(host, ":80"):
		host = strings.TrimSuffix(host, ":80")
	}
	return "host:" + host, nil
}

var _ http.RoundTripper = (*Transport)(nil)
