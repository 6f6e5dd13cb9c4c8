package admin

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ratewindow/ratewindow/core"
)

// Duration is a time.Duration that JSON writes as a string
// time.ParseDuration reads back, without zero units: "1h", "1m30s", "0s".
type Duration time.Duration

// String writes d as time.Duration's String does, less its zero minutes
// and seconds: "1h" for "1h0m0s", "15m" for "15m0s".
func (d Duration) String() string {
	s := time.Duration(d).String()
	if t, ok := strings.CutSuffix(s, "m0s"); ok {
		s = t + "m"
	}
	if t, ok := strings.CutSuffix(s, "h0m"); ok {
		s = t + "h"
	}
	return s
}

// MarshalText writes d as String does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads d as time.ParseDuration does, so that a Go client
// decodes the answers into this package's types.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%w: %w", core.ErrInvalidDuration, err)
	}
	*d = Duration(v)
	return nil
}

// Limit is a core.Limit as the operations show it.
type Limit struct {
	Name      string   `json:"name,omitempty"`
	Count     int64    `json:"count"`
	Window    Duration `json:"window"`
	Algorithm string   `json:"algorithm"` // "sliding-log", "sliding-buckets" or "sliding-counter"
	Precision Duration `json:"precision,omitempty"`
}

// String writes l as ParseOverride reads it, "<count>/<window>" such as
// "100/1m", followed by its algorithm when it is not a sliding log
// ("100000/1h sliding-buckets") and its name when it has one.
func (l Limit) String() string {
	s := strconv.FormatInt(l.Count, 10) + "/" + l.Window.String()
	if l.Algorithm != core.SlidingLog.String() {
		s += " " + l.Algorithm
	}
	if l.Name != "" {
		s += " (" + l.Name + ")"
	}
	return s
}

// Penalty is a core.Penalty as the operations show it.
type Penalty struct {
	Denials int64    `json:"denials"`
	Within  Duration `json:"within"`
	Ban     Duration `json:"ban"`
}

// Rule is a published rule.
type Rule struct {
	Name        string   `json:"name"`
	Limits      []Limit  `json:"limits"`
	Penalty     *Penalty `json:"penalty,omitempty"`
	TrackDenied bool     `json:"track_denied"` // the rule records its denied keys (Top)
}

// Usage is what a key holds under a rule.
type Usage struct {
	Rule    string       `json:"rule"`
	Key     string       `json:"key"`
	Limits  []LimitUsage `json:"limits"`  // one per limit of the rule, the override applied
	Blocked Duration     `json:"blocked"` // time left on a block or ban; 0s: not blocked
	// Override is the key's own limits in force; null: none.
	Override *Override `json:"override"`
}

// LimitUsage is a key's usage of one limit.
type LimitUsage struct {
	Limit      Limit    `json:"limit"` // the limit in force: the override's count when one applies
	Used       int64    `json:"used"`  // units counted in the window now
	Remaining  int64    `json:"remaining"`
	ResetAfter Duration `json:"reset_after"` // until the limit is back to its full count
}

// Override is a key's own limits under a rule.
type Override struct {
	Rule   string   `json:"rule"`
	Key    string   `json:"key"`
	Limits []Limit  `json:"limits"`
	TTL    Duration `json:"ttl"` // time left; 0s: until removed
}

// Top is a rule's most denied keys.
type Top struct {
	Rule  string      `json:"rule"`
	Since Duration    `json:"since"`
	Keys  []DeniedKey `json:"keys"` // most denied first
}

// DeniedKey is a key and its denials under a rule.
type DeniedKey struct {
	Key     string `json:"key"` // the key function's result, without the rule's name
	Denials int64  `json:"denials"`
}

// limitView returns l as the operations show it.
func limitView(l core.Limit) Limit {
	return Limit{Name: l.Name, Count: l.Count, Window: Duration(l.Window), Algorithm: l.Algorithm.String(), Precision: Duration(l.Precision)}
}

// limitViews returns limits as the operations show them.
func limitViews(limits []core.Limit) []Limit {
	v := make([]Limit, len(limits))
	for i, l := range limits {
		v[i] = limitView(l)
	}
	return v
}

// ruleView returns a published rule as the operations show it.
func ruleView(info core.RuleInfo) Rule {
	r := Rule{Name: info.Name, Limits: limitViews(info.Limits), TrackDenied: info.TrackDenied}
	if p := info.Penalty; p != nil {
		r.Penalty = &Penalty{Denials: p.Denials, Within: Duration(p.Within), Ban: Duration(p.Ban)}
	}
	return r
}

// overrideView returns key's override under rule as the operations show it.
func overrideView(rule, key string, ov core.Override) Override {
	return Override{Rule: rule, Key: key, Limits: limitViews(ov.Limits), TTL: Duration(ov.TTL)}
}
