package nethttp

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/ratewindow/ratewindow/core"
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

	once sync.Once
	enf  *core.Enforcer
	err  error
}

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
func (t *Transport) prepare() (*core.Enforcer, error) {
	t.once.Do(func() {
		rule := t.Rule
		if rule.Key == nil {
			rule.Key = hostKey
		}
		t.enf, t.err = core.NewEnforcer(t.Limiter, rule)
		if t.err != nil {
			t.err = fmt.Errorf("%w (nethttp.Transport)", t.err)
		}
	})
	return t.enf, t.err
}

// RoundTrip waits until the rule admits req, then sends it with Base.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	enf, err := t.prepare()
	if err != nil {
		return nil, closeBody(req, err)
	}
	if t.Rule.Skip != nil && t.Rule.Skip(req) {
		return t.base().RoundTrip(req)
	}
	key, err := enf.Key(req)
	if err != nil {
		return nil, closeBody(req, fmt.Errorf("ratewindow: transport rule %q: key: %w", enf.Name(), err))
	}
	n, err := enf.Cost(req)
	if err != nil {
		return nil, closeBody(req, fmt.Errorf("ratewindow: transport rule %q: %w", enf.Name(), err))
	}
	start := time.Now()
	if err := enf.Wait(req.Context(), key, n); err != nil {
		return nil, closeBody(req, fmt.Errorf("ratewindow: transport rule %q: %w", enf.Name(), err))
	}
	if t.OnWait != nil {
		t.OnWait(req, time.Since(start))
	}
	return t.base().RoundTrip(req)
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
