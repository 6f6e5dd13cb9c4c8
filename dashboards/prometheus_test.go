package dashboards

import (
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/redistest"
	"github.com/ratewindow/ratewindow/keyfuncs"
	"github.com/ratewindow/ratewindow/nethttp"
	ratewindowprom "github.com/ratewindow/ratewindow/prometheus"
)

// The load of TestDashboardQueries. Each key of the rule "api" sends
// perKey requests under a limit of allowedPerKey a minute: perKey -
// allowedPerKey of them are denied, a denial ratio of 3/5 whatever the
// speed of the machine. Each key also sends one request to the rule
// "down", whose Redis closes every connection: the failure mode answers
// (fail-open), and after 3 failures in a row the circuit breaker does.
const (
	loadKeys      = 300              // keys of the main load, at most
	loadWorkers   = 4                // keys sent at once
	perKey        = 5                // requests of each key to "api"
	allowedPerKey = 2                // the limit of "api": a minute
	loadBudget    = 20 * time.Second // no key starts after it; every started key ends
	// ratioTolerance bounds |panel - load| for the denial ratio. rate()
	// extrapolates every series of a window alike when the load's
	// proportions hold from its first sample on, which the warm-up key
	// ensures; the tolerance covers a scrape that lands inside that key.
	ratioTolerance = 0.01

	scrapeInterval = time.Second
	readyTimeout   = 60 * time.Second // for Prometheus to start, on a busy machine
	scrapeTimeout  = 30 * time.Second // for a value to reach Prometheus
	jobName        = "ratewindow"
)

// TestDashboardQueries evaluates every query of the dashboard through a real
// Prometheus's HTTP API, as Grafana would: Prometheus scrapes a server whose
// ratewindow middleware (on a real Redis, and on a Redis that fails) takes a
// load of known denial ratio. Every query must return data under every
// selection of the variables; the denial-ratio panels must show the load's
// ratio and the breaker panel the breaker's state.
func TestDashboardQueries(t *testing.T) {
	bin := prometheusBinary(t)
	d := readDashboard(t)

	metrics := ratewindowprom.NewCollector(ratewindowprom.Opts{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)
	srv := redistest.New(t)
	prefix := fmt.Sprintf("dashboards%d:", time.Now().UnixNano()) // keys of this run only
	// A generous timeout: no decision of a loaded machine is shed, so the
	// load's answers are the limit's.
	api, err := core.New(srv.Client(t), core.WithPrefix(prefix), core.WithTimeout(5*time.Second), core.WithObserver(metrics.Observe))
	if err != nil {
		t.Fatal(err)
	}
	broken := redis.NewClient(&redis.Options{Addr: closingListener(t), MaxRetries: -1})
	t.Cleanup(func() { broken.Close() })
	down, err := core.New(broken, core.WithFailureMode(core.FailOpen), core.WithObserver(metrics.Observe))
	if err != nil {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	mux := http.NewServeMux()
	mux.Handle("/api", nethttp.Limit(api, core.Rule{Name: "api", Limits: []core.Limit{core.PerMinute(allowedPerKey)},
		Key: keyfuncs.Header("X-Client")})(ok))
	mux.Handle("/down", nethttp.Limit(down, core.Rule{Name: "down", Limits: []core.Limit{core.PerMinute(1000)},
		OnError: func(http.ResponseWriter, *http.Request, error) {}})(ok)) // not logged: every call fails
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	app := httptest.NewServer(mux)
	t.Cleanup(app.Close)

	prom := startPrometheus(t, bin, app.Listener.Addr().String())
	prom.waitFor(t, "the server's first scrape", func() (bool, string) {
		up, err := prom.query(`up{job="`+jobName+`"}`, time.Now())
		return err == nil && len(up) == 1 && up[0].value == 1, fmt.Sprint(up, err)
	})

	// The warm-up key: the series start with the load's proportions, and
	// Prometheus has them before the load.
	requests := &load{client: app.Client(), base: app.URL, counts: map[string]*counts{}}
	requests.client.Timeout = 10 * time.Second
	start := time.Now()
	requests.run(t, 0, 1, 1, time.Time{})
	prom.waitForTotals(t, "the warm-up", requests.totals())
	circuitBefore := counterValue(t, reg, "ratewindow_circuit_open_total")

	requests.run(t, 1, 1+loadKeys, loadWorkers, time.Now().Add(loadBudget))
	prom.waitForTotals(t, "the load", requests.totals())
	circuitAfter := counterValue(t, reg, "ratewindow_circuit_open_total")
	at := time.Now()
	t.Logf("load: %d keys in %v; responses %v", requests.keys, at.Sub(start).Round(time.Millisecond), requests)
	if c := requests.counts["api"]; c.denied*perKey != c.total*(perKey-allowedPerKey) {
		t.Fatalf("api: %d of %d requests denied, want %d/%d", c.denied, c.total, perKey-allowedPerKey, perKey)
	}

	// $__rate_interval as Grafana sets it for a range as long as the load:
	// the window holds every sample since the warm-up.
	window := fmt.Sprintf("%ds", int(at.Sub(start).Seconds())+10)

	// The variables' values, asked of Prometheus as Grafana asks them.
	all := d.allValues()
	offered := map[string][]string{}
	for _, v := range d.queryVars() {
		sel, label, err := parseLabelValues(v.Definition)
		if err != nil {
			t.Fatal(err)
		}
		if sel, err = expand(sel, all, window); err != nil {
			t.Fatal(err)
		}
		if offered[v.Name], err = prom.labelValues(label, sel); err != nil {
			t.Fatalf("variable %s: %v", v.Name, err)
		}
	}
	if !slices.Contains(offered["job"], jobName) || !slices.Contains(offered["rule"], "api") || !slices.Contains(offered["rule"], "down") {
		t.Fatalf("the variables offer %v", offered)
	}

	// Every selection of the variables: All, then each rule alone.
	selections := []map[string]string{all}
	for _, rule := range offered["rule"] {
		one := map[string]string{"job": regexp.QuoteMeta(jobName), "rule": regexp.QuoteMeta(rule)}
		selections = append(selections, one)
	}
	for _, values := range selections {
		rules := slices.Collect(maps.Keys(requests.counts))
		if values["rule"] != ".*" {
			rules = []string{values["rule"]}
		}
		for _, p := range d.Panels {
			for _, q := range p.Targets {
				expr, err := expand(q.Expr, values, window)
				if err != nil {
					t.Fatal(err)
				}
				where := fmt.Sprintf("panel %q query %s, rules %v", p.Title, q.RefID, rules)
				samples, err := prom.query(expr, at)
				if err != nil {
					t.Errorf("%s: %v", where, err)
					continue
				}
				if !slices.ContainsFunc(samples, func(s sample) bool { return !math.IsNaN(s.value) && !math.IsInf(s.value, 0) }) {
					t.Errorf("%s: no data: %v\n%s", where, samples, expr)
					continue
				}
				t.Logf("%s: %v", where, samples)
				for _, s := range samples {
					of := rules // the series' own rule, or the selection's
					if r, ok := s.metric["rule"]; ok {
						of = []string{r}
					}
					switch {
					case strings.HasPrefix(p.Title, "Denial ratio"):
						if want := requests.ratio(of); math.Abs(s.value-want) > ratioTolerance {
							t.Errorf("%s: %v shows a denial ratio of %.4f, the load's is %.4f (±%v)", where, s.metric, s.value, want, ratioTolerance)
						}
					case p.Title == "Circuit breaker":
						want := 0.0 // open (1) when the open breaker answered some call in the window
						for _, r := range of {
							if circuitAfter[r] > circuitBefore[r] {
								want = 1
							}
						}
						if s.value != want {
							t.Errorf("%s: %v is %v, want %v (calls answered by the open breaker: %v, then %v)", where, s.metric, s.value, want, circuitBefore, circuitAfter)
						}
					}
				}
			}
		}
	}
}

// prometheusBinary returns the path of the prometheus executable, or skips
// the test without one, unless RATEWINDOW_REQUIRE_REDIS=1 (as in CI), where
// a missing binary fails it.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err == nil {
		return bin
	}
	if os.Getenv("RATEWINDOW_REQUIRE_REDIS") == "1" {
		t.Fatalf("RATEWINDOW_REQUIRE_REDIS=1 and no prometheus binary in PATH (%v): install it, e.g. apt-get install -y prometheus", err)
	}
	t.Skipf("the dashboard's queries are not checked: no prometheus binary in PATH (%v); install it, e.g. apt-get install -y prometheus", err)
	return ""
}

// closingListener returns the address of a server on 127.0.0.1 that closes
// every connection at once: a Redis that fails every call, on a port this
// test owns.
func closingListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// counts are the answers the load received under one rule.
type counts struct{ total, denied int }

// load sends requests to the server and counts its answers by rule.
type load struct {
	client *http.Client
	base   string

	mu     sync.Mutex
	counts map[string]*counts // by rule
	keys   int                // keys sent
}

// run sends the keys [from, to) with workers at once: each key perKey
// requests to /api, then one to /down. No key starts after deadline, when
// set; a started key always ends, so every key holds the load's ratio.
func (l *load) run(t *testing.T, from, to, workers int, deadline time.Time) {
	t.Helper()
	keys := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for k := range keys {
				for range perKey {
					l.send(t, "api", fmt.Sprintf("client-%d", k))
				}
				l.send(t, "down", "")
			}
		})
	}
	for k := from; k < to && (deadline.IsZero() || time.Now().Before(deadline)); k++ {
		keys <- k
		l.mu.Lock()
		l.keys++
		l.mu.Unlock()
	}
	close(keys)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

// send sends one request to the rule's route and counts its answer: 200
// allowed, 429 denied; anything else fails the test.
func (l *load) send(t *testing.T, rule, client string) {
	req, err := http.NewRequest(http.MethodGet, l.base+"/"+rule, nil)
	if err != nil {
		t.Error(err)
		return
	}
	if client != "" {
		req.Header.Set("X-Client", client)
	}
	resp, err := l.client.Do(req)
	if err != nil {
		t.Errorf("%s: %v", rule, err)
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("%s: status %d", rule, resp.StatusCode)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.counts[rule]
	if c == nil {
		c = &counts{}
		l.counts[rule] = c
	}
	c.total++
	if resp.StatusCode == http.StatusTooManyRequests {
		c.denied++
	}
}

// totals returns the number of decisions of each rule: one a request.
func (l *load) totals() map[string]float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := map[string]float64{}
	for rule, c := range l.counts {
		m[rule] = float64(c.total)
	}
	return m
}

// ratio returns the denial ratio of the rules' answers together.
func (l *load) ratio(rules []string) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var total, denied int
	for _, r := range rules {
		if c := l.counts[r]; c != nil {
			total, denied = total+c.total, denied+c.denied
		}
	}
	return float64(denied) / float64(total)
}

func (l *load) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var parts []string
	for _, rule := range slices.Sorted(maps.Keys(l.counts)) {
		c := l.counts[rule]
		parts = append(parts, fmt.Sprintf("%s: %d denied of %d", rule, c.denied, c.total))
	}
	return strings.Join(parts, ", ")
}

// counterValue returns the values of a counter of reg by rule.
func counterValue(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "rule" {
					m[l.GetValue()] = s.GetCounter().GetValue()
				}
			}
		}
	}
	return m
}
