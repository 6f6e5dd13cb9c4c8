package core

import (
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ratewindow/ratewindow/internal/httpx"
)

// Header names, in the canonical form of http.Header's keys.
const (
	hdrXLimit     = "X-Ratelimit-Limit"
	hdrXRemaining = "X-Ratelimit-Remaining"
	hdrXReset     = "X-Ratelimit-Reset"
	hdrPolicy     = "Ratelimit-Policy"
	hdrRateLimit  = "Ratelimit"
	hdrRetryAfter = "Retry-After"
	hdrContentLen = "Content-Length"
)

// Problem types of draft-ietf-httpapi-ratelimit-headers-11 (section 5), for
// problem+json bodies, which list the policies in "violated-policies".
const (
	// ProblemQuotaExceeded: a denial (429), listing the policies that denied.
	ProblemQuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	// ProblemReducedCapacity: the 503 of FailClosed, listing every policy.
	ProblemReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
	// ProblemAbnormalUsage: the 429 of a banned or blocked key, no policy.
	ProblemAbnormalUsage = "https://iana.org/assignments/http-problem-types#abnormal-usage-detected"
)

const (
	problemType  = "application/problem+json"
	textType     = "text/plain; charset=utf-8"
	maxSFInteger = 999_999_999_999_999 // RFC 8941: at most 15 digits
	// The problem bodies up to "violated-policies" (problemBody), and one without.
	quotaExceeded   = `{"type":"` + ProblemQuotaExceeded + `","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429`
	reducedCapacity = `{"type":"` + ProblemReducedCapacity + `","title":"Request cannot be satisfied due to temporary server capacity constraints","status":503`
	abnormalUsage   = `{"type":"` + ProblemAbnormalUsage + `","title":"Request not satisfied due to detection of abnormal request pattern","status":429}`
)

// headerSet holds the header values of a rule's limits, computed once.
type headerSet struct {
	policy      string   // RateLimit-Policy: every limit of the rule
	items       []string // its items, to add pk to each
	limits      []limitHeaders
	unavailable []byte // the problem+json body of FailClosed's 503
}

// limitHeaders holds the precomputed values of one limit.
type limitHeaders struct {
	limit      Limit
	name       string // its PolicyName
	count      string // X-RateLimit-Limit
	item       string // the RateLimit item up to r's value: `"name";r=`
	problem    []byte // the application/problem+json body of a denial
	problemLen string
}

func newHeaderSet(limits []Limit) headerSet {
	hs := headerSet{limits: make([]limitHeaders, len(limits)), items: make([]string, len(limits))}
	names := make([]string, len(limits))
	for i, l := range limits {
		hs.limits[i] = newLimitHeaders(l)
		names[i] = hs.limits[i].name
		item := appendSFString(nil, names[i]) // "name";q=Count;w=seconds
		item = strconv.AppendInt(append(item, ";q="...), min(max(l.Count, 0), maxSFInteger), 10)
		item = strconv.AppendInt(append(item, ";w="...), min(max(ceilSeconds(l.Window), 1), maxSFInteger), 10)
		hs.items[i] = string(item)
	}
	hs.policy = strings.Join(hs.items, ", ")
	hs.unavailable = problemBody(reducedCapacity, names...)
	return hs
}

// problemBody returns the problem+json body that starts with head, listing policies.
func problemBody(head string, policies ...string) []byte {
	b := append([]byte(head), `,"violated-policies":[`...)
	for i, p := range policies {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendSFString(b, p)
	}
	return append(b, "]}"...)
}

func newLimitHeaders(l Limit) limitHeaders {
	name := l.PolicyName()
	body := problemBody(quotaExceeded, name)
	return limitHeaders{limit: l, name: name, count: strconv.FormatInt(max(l.Count, 0), 10),
		item: string(append(appendSFString(nil, name), ";r="...)), problem: body, problemLen: strconv.Itoa(len(body))}
}

// lookup returns the values of the rule's limit of the binding limit l's
// algorithm and window (no two limits of a rule share them): FailLocal's
// scaled limit shows as the rule's, as RateLimit-Policy lists it, with the
// local Remaining; computed when the rule has none.
func (hs *headerSet) lookup(l Limit) *limitHeaders {
	for i := range hs.limits {
		if o := hs.limits[i].limit; o.Algorithm == l.Algorithm && o.Window == l.Window {
			return &hs.limits[i]
		}
	}
	lh := newLimitHeaders(l)
	return &lh
}

// write sets the rate-limit fields of style for res: seconds rounded up, a
// reset never before Retry-After, t of a denial its Retry-After, integers
// of at most 15 digits, pk on every IETF item.
func (hs *headerSet) write(h http.Header, style HeaderStyle, res Result, pk []byte) {
	if style == None || style > Both {
		return
	}
	lh := hs.lookup(res.Limit)
	remaining := max(res.Remaining, 0)
	reset := ceilSeconds(res.ResetAfter)
	t := reset // RateLimit's t: a denial's Retry-After
	if !res.Allowed && !res.Never() {
		t = retrySeconds(res.RetryAfter)
		reset = max(reset, t) // full again no earlier than the request fits
	}
	var buf [160]byte // one string sliced per field: two allocations in all
	b := strconv.AppendInt(buf[:0], remaining, 10)
	endRemaining := len(b)
	b = strconv.AppendInt(b, reset, 10)
	endReset := len(b)
	if style != XRateLimit {
		b = append(b, lh.item...)
		b = strconv.AppendInt(b, min(remaining, maxSFInteger), 10)
		if !res.Never() {
			b = strconv.AppendInt(append(b, ";t="...), min(t, maxSFInteger), 10)
		}
		b = append(b, pk...)
	}
	endItem := len(b)
	if len(pk) > 0 && style != XRateLimit {
		for i, item := range hs.items {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = append(append(b, item...), pk...)
		}
	}
	str := string(b)
	v := []string{lh.count, str[:endRemaining], str[endRemaining:endReset], hs.policy, str[endReset:endItem]}
	if len(pk) > 0 {
		v[3] = str[endItem:]
	}
	if style != IETF {
		h[hdrXLimit] = v[0:1:1]
		h[hdrXRemaining] = v[1:2:2]
		h[hdrXReset] = v[2:3:3]
	}
	if style != XRateLimit {
		h[hdrPolicy] = v[3:4:4]
		h[hdrRateLimit] = v[4:5:5]
	}
}

// clearRateHeaders deletes every rate-limit field.
func clearRateHeaders(h http.Header) {
	for _, k := range rateHeaders {
		delete(h, k)
	}
}

// rateHeaders are the rate-limit fields a rule writes.
var rateHeaders = [...]string{hdrXLimit, hdrXRemaining, hdrXReset, hdrPolicy, hdrRateLimit}

// writeDenied writes the default answer to a Denied or Unavailable dec, 429
// or 503: a short text, or with problem set, the problem (quota-exceeded,
// abnormal-usage for a banned key, temporary-reduced-capacity for a 503).
func writeDenied(w http.ResponseWriter, dec Decision, problem bool) {
	code := http.StatusTooManyRequests
	if dec.Verdict == Unavailable {
		code = http.StatusServiceUnavailable
	}
	switch {
	case !problem:
		writeBody(w, code, textType, []byte(http.StatusText(code)+"\n"), "")
	case code == http.StatusServiceUnavailable:
		writeBody(w, code, problemType, dec.hdr.unavailable, "")
	case dec.Result.blocked:
		writeBody(w, code, problemType, []byte(abnormalUsage), "")
	case bits.OnesCount16(dec.Result.violated) > 1:
		writeBody(w, code, problemType, problemBody(quotaExceeded, dec.Policies()...), "")
	default:
		lh := dec.hdr.lookup(dec.Result.Limit)
		writeBody(w, code, problemType, lh.problem, lh.problemLen)
	}
}

// writeBody writes a response, size its length or "". Text is marked nosniff.
func writeBody(w http.ResponseWriter, code int, ctype string, body []byte, size string) {
	h := w.Header()
	h["Content-Type"] = []string{ctype}
	if ctype == textType {
		h["X-Content-Type-Options"] = []string{"nosniff"}
	}
	if size == "" {
		size = strconv.Itoa(len(body))
	}
	h[hdrContentLen] = []string{size}
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// ceilSeconds returns d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d-1)/time.Second) + 1
}

// retrySeconds is the Retry-After of a denial that passes after d: at least 1.
func retrySeconds(d time.Duration) int64 { return max(ceilSeconds(d), 1) }

// appendSFString appends s as a structured-field string (RFC 8941 3.3.3),
// also a JSON string: '"' and '\' escaped, bytes outside %x20-7E as '?'.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < ' ' || c > '~':
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// acceptsProblem reports whether Accept lists problem+json with a weight above 0.
func acceptsProblem(accept []string) bool {
	for _, v := range accept {
	ranges:
		for rng := range strings.SplitSeq(v, ",") {
			typ, params, _ := strings.Cut(rng, ";")
			if !strings.EqualFold(httpx.TrimOWS(typ), problemType) {
				continue
			}
			for p := range strings.SplitSeq(params, ";") {
				if p = httpx.TrimOWS(p); len(p) >= 2 && p[0]|0x20 == 'q' && p[1] == '=' {
					if q := httpx.TrimOWS(p[2:]); q != "" && q[0] == '0' && strings.Trim(q[1:], ".0") == "" {
						continue ranges // a zero weight: "0", "0.", "0.000"
					}
					break
				}
			}
			return true
		}
	}
	return false
}
