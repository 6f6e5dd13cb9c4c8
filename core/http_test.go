package core

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestCeilAndRetrySeconds(t *testing.T) {
	for _, tc := range []struct {
		d           time.Duration
		ceil, retry int64
	}{
		{-time.Second, 0, 1},
		{0, 0, 1},
		{time.Nanosecond, 1, 1},
		{999 * time.Millisecond, 1, 1},
		{time.Second, 1, 1},
		{time.Second + time.Nanosecond, 2, 2},
		{59*time.Second + 1, 60, 60},
		{time.Minute, 60, 60},
		{time.Duration(1<<63 - 1), 9223372037, 9223372037},
	} {
		if got := ceilSeconds(tc.d); got != tc.ceil {
			t.Errorf("ceilSeconds(%v) = %d, want %d", tc.d, got, tc.ceil)
		}
		if got := retrySeconds(tc.d); got != tc.retry {
			t.Errorf("retrySeconds(%v) = %d, want %d", tc.d, got, tc.retry)
		}
	}
}

func TestAppendSFString(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `""`},
		{"burst", `"burst"`},
		{"100-per-1m", `"100-per-1m"`},
		{`say "hi"`, `"say \"hi\""`},
		{`back\slash`, `"back\\slash"`},
		{"tab\there", `"tab?here"`},
		{"caf\u00e9", `"caf??"`},
		{"\x7f", `"?"`},
	} {
		if got := string(appendSFString(nil, tc.in)); got != tc.want {
			t.Errorf("appendSFString(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestAcceptsProblem(t *testing.T) {
	for _, tc := range []struct {
		accept []string
		want   bool
	}{
		{nil, false},
		{[]string{""}, false},
		{[]string{"application/problem+json"}, true},
		{[]string{"Application/Problem+JSON"}, true},
		{[]string{"text/html, application/problem+json;q=0.5"}, true},
		{[]string{"text/html", " application/problem+json ; charset=utf-8 ; q=1"}, true},
		{[]string{"application/problem+json;q=0"}, false},
		{[]string{"application/problem+json; q=0.000"}, false},
		{[]string{"application/problem+json;Q=0.001"}, true},
		{[]string{"application/json"}, false},
		{[]string{"*/*"}, false},
		{[]string{"application/problem+jsonx"}, false},
		{[]string{",,application/problem+json,"}, true},
	} {
		if got := acceptsProblem(tc.accept); got != tc.want {
			t.Errorf("acceptsProblem(%q) = %v, want %v", tc.accept, got, tc.want)
		}
	}
}

// TestHeaderSetWrite checks the exact fields of every style.
func TestHeaderSetWrite(t *testing.T) {
	burst := Limit{Name: "burst", Count: 10, Window: 1500 * time.Millisecond}
	minute := PerMinute(100)
	hs := newHeaderSet([]Limit{burst, minute})
	const policy = `"burst";q=10;w=2, "100-per-1m";q=100;w=60`
	allowed := Result{Allowed: true, Limit: minute, Remaining: 42, ResetAfter: 59*time.Second + time.Millisecond}
	denied := Result{Limit: burst, RetryAfter: 300 * time.Millisecond, ResetAfter: 1200 * time.Millisecond}
	never := Result{Limit: minute, RetryAfter: -1, ResetAfter: 30 * time.Second}
	scaled := Result{Allowed: true, Limit: Limit{Count: 50, Window: time.Minute}, Remaining: 7, ResetAfter: time.Minute}
	foreign := Result{Allowed: true, Limit: Limit{Count: 5, Window: time.Hour}, Remaining: 4, ResetAfter: time.Hour}
	for _, tc := range []struct {
		name  string
		style HeaderStyle
		res   Result
		want  map[string]string
	}{
		{"x allowed", XRateLimit, allowed, map[string]string{
			"X-Ratelimit-Limit": "100", "X-Ratelimit-Remaining": "42", "X-Ratelimit-Reset": "60",
		}},
		{"ietf allowed", IETF, allowed, map[string]string{
			"Ratelimit-Policy": policy, "Ratelimit": `"100-per-1m";r=42;t=60`,
		}},
		{"both denied", Both, denied, map[string]string{
			"X-Ratelimit-Limit": "10", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "2",
			"Ratelimit-Policy": policy, "Ratelimit": `"burst";r=0;t=1`,
		}},
		{"ietf never", IETF, never, map[string]string{
			"Ratelimit-Policy": policy, "Ratelimit": `"100-per-1m";r=0`,
		}},
		{"x scaled limit", Both, scaled, map[string]string{ // shown as the rule's limit, as RateLimit-Policy lists it
			"X-Ratelimit-Limit": "100", "X-Ratelimit-Remaining": "7", "X-Ratelimit-Reset": "60",
			"Ratelimit-Policy": policy, "Ratelimit": `"100-per-1m";r=7;t=60`,
		}},
		{"ietf limit not in the rule", IETF, foreign, map[string]string{
			"Ratelimit-Policy": policy, "Ratelimit": `"5-per-1h";r=4;t=3600`,
		}},
		{"none", None, allowed, map[string]string{}},
		{"denied: reset no earlier than retry", XRateLimit, Result{Limit: minute, RetryAfter: 2500 * time.Millisecond, ResetAfter: time.Second}, map[string]string{
			"X-Ratelimit-Limit": "100", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "3",
		}},
		{"negative remaining", XRateLimit, Result{Allowed: true, Limit: minute, Remaining: -3}, map[string]string{
			"X-Ratelimit-Limit": "100", "X-Ratelimit-Remaining": "0", "X-Ratelimit-Reset": "0",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			hs.write(h, tc.style, tc.res, nil)
			got := map[string]string{}
			for k, vs := range h {
				got[k] = strings.Join(vs, "\n")
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("got  %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestWriteDenied(t *testing.T) {
	l := Limit{Name: `q"\`, Count: 1, Window: time.Second}
	hs := newHeaderSet([]Limit{l})
	rec := httptest.NewRecorder()
	writeDenied(rec, Decision{Verdict: Denied, Result: Result{Limit: l, RetryAfter: time.Second}, hdr: &hs}, true)
	want := `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"violated-policies":["q\"\\"]}`
	if rec.Code != 429 || rec.Body.String() != want || rec.Header().Get("Content-Type") != "application/problem+json" ||
		rec.Header().Get("Content-Length") != strconv.Itoa(len(want)) {
		t.Errorf("problem: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	var p struct {
		Violated []string `json:"violated-policies"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || len(p.Violated) != 1 || p.Violated[0] != `q"\` {
		t.Errorf("problem body does not decode to the policy name: %v %q", err, p.Violated)
	}

	rec = httptest.NewRecorder()
	writeDenied(rec, Decision{Verdict: Denied, Result: Result{Limit: l, RetryAfter: time.Second}, hdr: &hs}, false)
	if rec.Code != 429 || rec.Body.String() != "Too Many Requests\n" || rec.Header().Get("Content-Length") != "18" {
		t.Errorf("text: %d %v %q", rec.Code, rec.Header(), rec.Body)
	}

	rec = httptest.NewRecorder()
	unavailable := Decision{Verdict: Unavailable, hdr: &hs} // Retry-After by SetFields, as Handle writes it
	new(Decider[exchange]).SetFields(rec.Header(), XRateLimit, unavailable)
	writeDenied(rec, unavailable, true)
	want = `{"type":"https://iana.org/assignments/http-problem-types#temporary-reduced-capacity","title":"Request cannot be satisfied due to temporary server capacity constraints","status":503,"violated-policies":["q\"\\"]}`
	if rec.Code != 503 || rec.Body.String() != want || rec.Header().Get("Retry-After") != "1" || !json.Valid(rec.Body.Bytes()) ||
		rec.Header().Get("Content-Length") != strconv.Itoa(len(want)) {
		t.Errorf("unavailable: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}

	// two limits denied: both are listed, in the rule's order
	two := []Limit{PerSecond(2), PerMinute(5)}
	hs = newHeaderSet(two)
	rec = httptest.NewRecorder()
	writeDenied(rec, Decision{Verdict: Denied, Result: Result{Limit: two[1], RetryAfter: time.Minute, violated: 0b11}, hdr: &hs}, true)
	want = `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"violated-policies":["2-per-1s","5-per-1m"]}`
	if rec.Body.String() != want || rec.Header().Get("Content-Length") != strconv.Itoa(len(want)) {
		t.Errorf("two violated: %v %s", rec.Header(), rec.Body)
	}
}

// FuzzHeaders writes the fields of arbitrary limits and results and checks
// that they never panic and always parse as what they claim to be:
// structured-field lists (RFC 8941) for RateLimit-Policy and RateLimit,
// non-negative integers for the X-RateLimit fields and Retry-After, and
// JSON for the problem body.
func FuzzHeaders(f *testing.F) {
	f.Fuzz(func(t *testing.T, name string, count, windowMs, remaining, retryMs, resetMs int64, allowed bool, style uint8, scaled bool) {
		lim := Limit{Name: name, Count: count, Window: time.Duration(windowMs) * time.Millisecond}
		hs := newHeaderSet([]Limit{lim, PerHour(1000)})
		res := Result{
			Allowed:    allowed,
			Limit:      lim,
			Remaining:  remaining,
			RetryAfter: time.Duration(retryMs) * time.Millisecond,
			ResetAfter: time.Duration(resetMs) * time.Millisecond,
		}
		if allowed {
			res.RetryAfter = 0
		}
		if scaled {
			res.Limit.Count = res.Limit.Count/2 + 1
		}
		h := http.Header{}
		st := HeaderStyle(style % 4)
		hs.write(h, st, res, nil)

		for _, k := range []string{hdrXLimit, hdrXRemaining, hdrXReset} {
			v, ok := h[k]
			if ok != (st == XRateLimit || st == Both) {
				t.Fatalf("style %s: field %s present: %v", st, k, ok)
			}
			if ok && (len(v) != 1 || !isDigits(v[0])) {
				t.Fatalf("%s: %q is not a non-negative integer", k, v)
			}
		}
		if _, ok := h[hdrPolicy]; ok != (st == IETF || st == Both) {
			t.Fatalf("style %s: RateLimit-Policy present: %v", st, ok)
		}
		if st == IETF || st == Both {
			items, err := parseSFList(h.Get(hdrPolicy))
			if err != nil || len(items) != 2 {
				t.Fatalf("RateLimit-Policy %q: %d items, %v", h.Get(hdrPolicy), len(items), err)
			}
			for _, it := range items {
				if q, ok := it.params["q"]; !ok || q < 0 {
					t.Fatalf("RateLimit-Policy %q: q %d", h.Get(hdrPolicy), q)
				}
				if w, ok := it.params["w"]; !ok || w < 1 {
					t.Fatalf("RateLimit-Policy %q: w %d", h.Get(hdrPolicy), w)
				}
			}
			if want := string(appendSFString(nil, lim.PolicyName())); `"`+strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(items[0].name)+`"` != want {
				t.Fatalf("RateLimit-Policy name %q, want %s", items[0].name, want)
			}
			items, err = parseSFList(h.Get(hdrRateLimit))
			if err != nil || len(items) != 1 {
				t.Fatalf("RateLimit %q: %d items, %v", h.Get(hdrRateLimit), len(items), err)
			}
			if r, ok := items[0].params["r"]; !ok || r < 0 {
				t.Fatalf("RateLimit %q: r %d", h.Get(hdrRateLimit), r)
			}
			if tt, ok := items[0].params["t"]; ok == res.Never() || tt < 0 {
				t.Fatalf("RateLimit %q for %+v: t %d", h.Get(hdrRateLimit), res, tt)
			}
		}

		rec := httptest.NewRecorder()
		writeDenied(rec, Decision{Verdict: Denied, Result: res, hdr: &hs}, true)
		var p struct {
			Type     string   `json:"type"`
			Status   int      `json:"status"`
			Violated []string `json:"violated-policies"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Type != ProblemQuotaExceeded || p.Status != 429 || len(p.Violated) != 1 {
			t.Fatalf("problem body %s: %v", rec.Body, err)
		}
		if rec.Header().Get(hdrContentLen) != strconv.Itoa(rec.Body.Len()) {
			t.Fatalf("Content-Length %s for %d bytes", rec.Header().Get(hdrContentLen), rec.Body.Len())
		}
	})
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// sfItem is an item of a structured-field list whose bare item is a
// string, with integer parameters.
type sfItem struct {
	name   string
	params map[string]int64
}

// parseSFList parses a structured-field List (RFC 8941 section 4.2.1) of
// the form this package writes: string items with integer parameters. It
// rejects anything else.
func parseSFList(s string) ([]sfItem, error) {
	s = strings.TrimLeft(s, " ")
	var items []sfItem
	for {
		var it sfItem
		var err error
		if it.name, s, err = parseSFString(s); err != nil {
			return nil, err
		}
		it.params = map[string]int64{}
		for strings.HasPrefix(s, ";") {
			s = strings.TrimLeft(s[1:], " ")
			var key string
			if key, s, err = parseSFKey(s); err != nil {
				return nil, err
			}
			if !strings.HasPrefix(s, "=") {
				return nil, fmt.Errorf("parameter %s is not an integer", key)
			}
			var v int64
			if v, s, err = parseSFInteger(s[1:]); err != nil {
				return nil, err
			}
			if _, dup := it.params[key]; dup {
				return nil, fmt.Errorf("parameter %s twice", key)
			}
			it.params[key] = v
		}
		items = append(items, it)
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			return items, nil
		}
		if s[0] != ',' {
			return nil, fmt.Errorf("expected a comma at %q", s)
		}
		s = strings.TrimLeft(s[1:], " \t")
		if s == "" {
			return nil, errors.New("trailing comma")
		}
	}
}

func parseSFString(s string) (string, string, error) {
	if !strings.HasPrefix(s, `"`) {
		return "", s, fmt.Errorf("expected a string at %q", s)
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			i++
			if i == len(s) || (s[i] != '"' && s[i] != '\\') {
				return "", s, errors.New("bad escape in string")
			}
			b.WriteByte(s[i])
		case c == '"':
			return b.String(), s[i+1:], nil
		case c < 0x20 || c > 0x7e:
			return "", s, fmt.Errorf("byte %#x in string", c)
		default:
			b.WriteByte(c)
		}
	}
	return "", s, errors.New("unterminated string")
}

func parseSFKey(s string) (string, string, error) {
	if s == "" || !(s[0] >= 'a' && s[0] <= 'z' || s[0] == '*') {
		return "", s, fmt.Errorf("bad key at %q", s)
	}
	i := 1
	for i < len(s) && (s[i] >= 'a' && s[i] <= 'z' || s[i] >= '0' && s[i] <= '9' || strings.IndexByte("_-.*", s[i]) >= 0) {
		i++
	}
	return s[:i], s[i:], nil
}

func parseSFInteger(s string) (int64, string, error) {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	start := i
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	if n := i - start; n == 0 || n > 15 {
		return 0, s, fmt.Errorf("integer of %d digits at %q", n, s)
	}
	v, err := strconv.ParseInt(s[:i], 10, 64)
	return v, s[i:], err
}
