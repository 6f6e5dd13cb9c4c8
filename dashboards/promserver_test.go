package dashboards

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// promServer is a prometheus process started by a test.
type promServer struct {
	url     string // http://127.0.0.1:port
	logPath string
	client  *http.Client
}

// startPrometheus starts bin on a free port of 127.0.0.1, with its own
// configuration and storage in a temporary directory, scraping target's
// /metrics every scrapeInterval, and returns when it is ready. It is killed
// at t.Cleanup.
func startPrometheus(t *testing.T, bin, target string) *promServer {
	t.Helper()
	dir := t.TempDir()
	config := filepath.Join(dir, "prometheus.yml")
	yml := fmt.Sprintf(`global:
  scrape_interval: %[1]v
  scrape_timeout: %[1]v
  evaluation_interval: %[1]v
scrape_configs:
  - job_name: %[2]q
    static_configs:
      - targets: [%[3]q]
`, scrapeInterval, jobName, target)
	if err := os.WriteFile(config, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	const tries = 3 // a port found free may be taken before Prometheus binds it
	for try := 1; ; try++ {
		addr := freeAddr(t)
		p := &promServer{url: "http://" + addr, logPath: filepath.Join(dir, fmt.Sprintf("prometheus-%d.log", try)),
			client: &http.Client{Timeout: 10 * time.Second}}
		log, err := os.Create(p.logPath)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin,
			"--config.file="+config,
			"--storage.tsdb.path="+filepath.Join(dir, fmt.Sprintf("data-%d", try)),
			"--web.listen-address="+addr)
		cmd.Stdout, cmd.Stderr = log, log
		setProcAttr(cmd)
		if err := cmd.Start(); err != nil {
			log.Close()
			t.Fatal(err)
		}
		log.Close()
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			<-exited
		})
		err = p.waitReady(exited)
		if err == nil {
			return p
		}
		if try < tries && strings.Contains(p.log(), "address already in use") {
			continue
		}
		t.Fatalf("prometheus: %v\n%s", err, p.log())
	}
}

// waitReady waits until Prometheus answers /-/ready, it exits, or
// readyTimeout passes.
func (p *promServer) waitReady(exited <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		resp, err := p.client.Get(p.url + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("exited before it was ready")
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %v", readyTimeout, err)
		}
	}
}

// log returns the end of the process's output.
func (p *promServer) log() string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > 4<<10 {
		b = b[len(b)-4<<10:]
	}
	return string(b)
}

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// sample is one value of a query's result: a vector's element, or a scalar
// (no labels).
type sample struct {
	metric map[string]string
	value  float64
}

func (s sample) String() string { return fmt.Sprintf("%v=%v", s.metric, s.value) }

// apiResponse is the envelope of every answer of Prometheus's HTTP API.
type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
	Warnings  []string        `json:"warnings"`
}

// get calls the API at path with the parameters and returns its data.
func (p *promServer) get(path string, params url.Values) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+path+"?"+params.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var r apiResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%s: status %d, %w: %.200s", path, resp.StatusCode, err, body)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: status %d, %s: %s", path, resp.StatusCode, r.ErrorType, r.Error)
	}
	if len(r.Warnings) > 0 {
		return nil, fmt.Errorf("%s: warnings %v", path, r.Warnings)
	}
	return r.Data, nil
}

// query evaluates expr at the instant at through /api/v1/query. Its result
// is a vector (one sample a series) or a scalar (one sample, no labels); a
// string or a matrix, which no panel's query returns, is an error.
func (p *promServer) query(expr string, at time.Time) ([]sample, error) {
	params := url.Values{"query": {expr}, "time": {strconv.FormatFloat(float64(at.UnixMilli())/1e3, 'f', 3, 64)}}
	data, err := p.get("/api/v1/query", params)
	if err != nil {
		return nil, err
	}
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, err
	}
	switch d.ResultType {
	case "vector":
		var v []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"` // [unix time, "value"]
		}
		if err := json.Unmarshal(d.Result, &v); err != nil {
			return nil, err
		}
		samples := make([]sample, 0, len(v))
		for _, e := range v {
			f, err := parseValue(e.Value)
			if err != nil {
				return nil, err
			}
			samples = append(samples, sample{e.Metric, f})
		}
		return samples, nil
	case "scalar":
		var v [2]any
		if err := json.Unmarshal(d.Result, &v); err != nil {
			return nil, err
		}
		f, err := parseValue(v)
		return []sample{{map[string]string{}, f}}, err
	}
	return nil, fmt.Errorf("result type %q, want a vector or a scalar", d.ResultType)
}

// parseValue reads the value of a sample, a string ("NaN" and "+Inf" too).
func parseValue(v [2]any) (float64, error) {
	s, ok := v[1].(string)
	if !ok {
		return 0, fmt.Errorf("sample %v: the value is not a string", v)
	}
	return strconv.ParseFloat(s, 64)
}

// labelValues returns the values of label among the series selector
// matches, through /api/v1/label/<label>/values: what Grafana asks for a
// variable's label_values(selector, label).
func (p *promServer) labelValues(label, selector string) ([]string, error) {
	data, err := p.get("/api/v1/label/"+url.PathEscape(label)+"/values", url.Values{"match[]": {selector}})
	if err != nil {
		return nil, err
	}
	var values []string
	return values, json.Unmarshal(data, &values)
}

// waitFor polls done until it reports true or scrapeTimeout passes, then
// fails the test with done's last state and the scrape target's health.
func (p *promServer) waitFor(t *testing.T, what string, done func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(scrapeTimeout)
	for {
		ok, state := done()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			targets, err := p.get("/api/v1/targets", nil)
			t.Fatalf("Prometheus has not scraped %s after %v: %s\ntargets: %s %v\n%s", what, scrapeTimeout, state, targets, err, p.log())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitForTotals waits until Prometheus's latest scrape holds want, the
// number of decisions of each rule.
func (p *promServer) waitForTotals(t *testing.T, what string, want map[string]float64) {
	t.Helper()
	p.waitFor(t, what, func() (bool, string) {
		samples, err := p.query(`sum by (rule) (ratewindow_decisions_total{job="`+jobName+`"})`, time.Now())
		got := map[string]float64{}
		for _, s := range samples {
			got[s.metric["rule"]] = s.value
		}
		return err == nil && maps.Equal(got, want), fmt.Sprintf("decisions %v, want %v (%v)", got, want, err)
	})
}
