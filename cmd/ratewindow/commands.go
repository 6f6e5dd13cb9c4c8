package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ratewindow/ratewindow/admin"
)

func (c *cli) rules(_ []string) error {
	rules, err := c.ops.Rules(c.ctx)
	if err != nil {
		return err
	}
	if c.opt.json {
		return c.printJSON(rules)
	}
	if len(rules) == 0 {
		fmt.Fprintf(c.stdout, "no rule is published under the prefix %q (the application publishes its rules with Limiter.Publish)\n", c.opt.prefix)
		return nil
	}
	t := c.table("RULE", "LIMITS", "PENALTY", "TOP")
	for _, r := range rules {
		penalty := "-"
		if p := r.Penalty; p != nil {
			penalty = fmt.Sprintf("%d denials in %s: ban %s", p.Denials, span(p.Within), span(p.Ban))
		}
		t.row(r.Name, limits(r.Limits), penalty, yesNo(r.TrackDenied))
	}
	return t.flush()
}

func (c *cli) usage(args []string) error {
	u, err := c.ops.Usage(c.ctx, args[0], args[1])
	if err != nil {
		return err
	}
	if c.opt.json {
		return c.printJSON(u)
	}
	t := c.table()
	t.row("rule", u.Rule)
	t.row("key", u.Key)
	blocked := "no"
	if u.Blocked > 0 {
		blocked = "for " + span(u.Blocked)
	}
	t.row("blocked", blocked)
	override := "none"
	if u.Override != nil {
		override = overrideText(*u.Override)
	}
	t.row("override", override)
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(c.stdout)
	t = c.table("LIMIT", "USED", "REMAINING", "FULL AGAIN IN")
	for _, lu := range u.Limits {
		t.row(lu.Limit.String(), fmt.Sprint(lu.Used), fmt.Sprint(lu.Remaining), span(lu.ResetAfter))
	}
	return t.flush()
}

func (c *cli) reset(args []string) error {
	return c.each("reset", args, func(rule, key string) error { return c.ops.Reset(c.ctx, rule, key) })
}

func (c *cli) block(args []string) error {
	return c.each("block", args, func(rule, key string) error { return c.ops.Block(c.ctx, rule, key, c.opt.dur) })
}

func (c *cli) unblock(args []string) error {
	return c.each("unblock", args, func(rule, key string) error { return c.ops.Unblock(c.ctx, rule, key) })
}

func (c *cli) overrideRm(args []string) error {
	return c.each("override rm", args, func(rule, key string) error { return c.ops.RemoveOverride(c.ctx, rule, key) })
}

func (c *cli) overrideSet(args []string) error {
	ov, err := c.ops.SetOverride(c.ctx, args[0], args[1], args[2], c.opt.dur)
	if err != nil {
		return err
	}
	return c.printOverride(ov)
}

func (c *cli) overrideGet(args []string) error {
	ov, err := c.ops.Override(c.ctx, args[0], args[1])
	if err != nil {
		return err
	}
	return c.printOverride(ov)
}

func (c *cli) printOverride(ov admin.Override) error {
	if c.opt.json {
		return c.printJSON(ov)
	}
	t := c.table()
	t.row("rule", ov.Rule)
	t.row("key", ov.Key)
	t.row("override", overrideText(ov))
	return t.flush()
}

func (c *cli) top(args []string) error {
	top, err := c.ops.Top(c.ctx, args[0], c.opt.n, c.opt.since)
	if err != nil {
		return err
	}
	if c.opt.json {
		return c.printJSON(top)
	}
	if len(top.Keys) == 0 {
		fmt.Fprintf(c.stdout, "no key was denied under rule %q in the last %s\n", top.Rule, span(top.Since))
		return nil
	}
	t := c.table("KEY", "DENIALS")
	for _, k := range top.Keys {
		t.row(k.Key, fmt.Sprint(k.Denials))
	}
	return t.flush()
}

// outcome is what a command did to one key, as -json prints it.
type outcome struct {
	Rule  string `json:"rule"`
	Key   string `json:"key"`
	Done  bool   `json:"done"`
	Error string `json:"error,omitempty"`
}

// each runs op on every key of args (the rule, then the keys), says what
// it did to each, and fails when it failed on any.
func (c *cli) each(name string, args []string, op func(rule, key string) error) error {
	rule, keys := args[0], args[1:]
	var outcomes []outcome
	failed := 0
	for _, key := range keys {
		o := outcome{Rule: rule, Key: key, Done: true}
		if err := op(rule, key); err != nil {
			o.Done, o.Error = false, err.Error()
			failed++
			report(c.stderr, err)
		} else if !c.opt.json {
			fmt.Fprintf(c.stdout, "%s: %q under rule %q\n", done(name), key, rule)
		}
		outcomes = append(outcomes, o)
	}
	if c.opt.json {
		if err := c.printJSON(outcomes); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%s: failed on %d of %d keys", name, failed, len(keys))
	}
	return nil
}

// done is the past of a command's name, for its report.
func done(name string) string {
	switch name {
	case "reset":
		return "reset"
	case "override rm":
		return "override removed"
	}
	return name + "ed"
}

// printJSON prints v as indented JSON.
func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table is a plain-text table on stdout.
type table struct{ w *tabwriter.Writer }

// table starts a table, with a header line when head is given.
func (c *cli) table(head ...string) table {
	t := table{tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)}
	if len(head) > 0 {
		t.row(head...)
	}
	return t
}

// row adds a line to the table; a cell's tabs and line ends become spaces,
// so that a key cannot break the table.
func (t table) row(cells ...string) {
	for i, s := range cells {
		cells[i] = strings.Map(func(r rune) rune {
			if r == '\t' || r == '\n' || r == '\r' {
				return ' '
			}
			return r
		}, s)
	}
	fmt.Fprintln(t.w, strings.Join(cells, "\t"))
}

// flush writes the table out.
func (t table) flush() error { return t.w.Flush() }

// limits writes a list of limits.
func limits(ls []admin.Limit) string {
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = l.String()
	}
	return strings.Join(s, ", ")
}

// overrideText writes an override's limits and how long it lasts.
func overrideText(ov admin.Override) string {
	if ov.TTL == 0 {
		return limits(ov.Limits) + " until removed"
	}
	return limits(ov.Limits) + " for " + span(ov.TTL)
}

// span writes a duration for a person: whole seconds from a minute up,
// milliseconds below (42.125s, 1m30s, 1h).
func span(d admin.Duration) string {
	v := time.Duration(d)
	if v >= time.Minute {
		return admin.Duration(v.Round(time.Second)).String()
	}
	return admin.Duration(v.Round(time.Millisecond)).String()
}

// yesNo writes a bool as yes or no.
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
