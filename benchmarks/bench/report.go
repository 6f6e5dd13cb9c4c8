package bench

import (
	"bytes"
	"cmp"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Command is the one command that regenerates the results.
const Command = "cd benchmarks && go run ./cmd/rwbench"

// setting is one cell of the throughput grid: on one server, or on the
// Cluster.
type setting struct {
	g, keys int
	cluster bool
}

// label names s in headings and columns.
func (s setting) label() string {
	l := fmt.Sprintf("%d goroutine(s), %s", s.g, keysLabel(s.keys))
	if s.cluster {
		l += fmt.Sprintf(", Cluster of %d", clusterMasters)
	}
	return l
}

// settings are the grid's settings that were measured: the server's, then
// the Cluster's.
func (r *Report) settings() []setting {
	var out []setting
	for _, cluster := range []bool{false, true} {
		gs := r.Config.Goroutines
		if cluster {
			gs = r.Config.ClusterGoroutines
		}
		for _, k := range r.Config.Keys {
			for _, g := range gs {
				s := setting{g, k, cluster}
				for _, t := range r.Throughput {
					if t.Goroutines == g && t.Keys == k && t.Cluster == cluster {
						out = append(out, s)
						break
					}
				}
			}
		}
	}
	return out
}

func (r *Report) peer(name string) bool {
	for _, c := range r.Contenders {
		if c.Name == name {
			return c.Peer
		}
	}
	return false
}

// row returns the throughput of contender name in setting s.
func (r *Report) row(name string, s setting) (Throughput, bool) {
	for _, t := range r.Throughput {
		if t.Contender == name && t.Goroutines == s.g && t.Keys == s.keys && t.Cluster == s.cluster {
			return t, true
		}
	}
	return Throughput{}, false
}

// Baseline returns the contender the ratios of setting (g, keys, on the
// Cluster or not) refer to: Config.Baseline, or the fastest peer there.
func (r *Report) Baseline(g, keys int, cluster bool) (Throughput, bool) {
	return r.baseline(setting{g, keys, cluster})
}

func (r *Report) baseline(s setting) (Throughput, bool) {
	if r.Config.Baseline != "" {
		return r.row(r.Config.Baseline, s)
	}
	var best Throughput
	found := false
	for _, t := range r.Throughput {
		if t.Goroutines == s.g && t.Keys == s.keys && t.Cluster == s.cluster && r.peer(t.Contender) && (!found || t.PerSecond() > best.PerSecond()) {
			best, found = t, true
		}
	}
	return best, found
}

func keysLabel(n int) string {
	if n == 1 {
		return "1 hot key"
	}
	return thousands(int64(n)) + " keys"
}

func thousands(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func ratio(v, base float64) string {
	if base <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", v/base)
}

func dur(d time.Duration) string {
	switch {
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	case d >= time.Microsecond:
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	}
	return fmt.Sprintf("%d ns", d)
}

// Markdown writes the report as Markdown tables: only those of what the
// run measured, none empty.
//
// Each throughput figure is the median over the rounds, followed by its
// spread (the smallest and largest round) when there is more than one.
func (r *Report) Markdown(w io.Writer) error {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	cfg := r.Config
	settings := r.settings()
	p("# ratewindow side by side\n\n")
	p("Run %s on Redis %s, %s, %d CPUs; took %s. Regenerate: `%s`.\n\n",
		r.Started.UTC().Format("2006-01-02 15:04 UTC"), r.Redis, r.Go, r.CPUs, r.Took.Round(time.Second), Command)
	if len(settings) > 0 {
		r.throughputIntro(p)
	}
	if len(settings) > 0 || len(r.Admission) > 0 {
		p("## Contenders\n\n| contender | method | the call Redis sees |\n|---|---|---|\n")
		for _, c := range r.Contenders {
			p("| %s | %s | %s |\n", c.Name, c.Method, r.callNames(c.Name))
		}
		p("\n")
	}
	if len(settings) > 0 {
		r.throughputTables(p, settings)
	}

	if len(r.Deny) > 0 {
		p("## Hot denied key: ratewindow's deny cache\n\n")
		p("One key whose limit (1 per hour) is used up, so every request is denied: sliding log with the deny cache on (the default) and off (`core.WithDenyCache(0)`).\n\n")
		p("| goroutines | cache on, decisions/s | cache off, decisions/s | on / off | allocs/decision on |\n|---:|---:|---:|---:|---:|\n")
		for _, d := range r.Deny {
			p("| %d | %s | %s | %s | %.1f |\n", d.Goroutines, thousands(int64(d.On.PerSecond())), thousands(int64(d.Off.PerSecond())),
				ratio(d.On.PerSecond(), d.Off.PerSecond()), d.On.AllocsPerDecision())
		}
		p("\n")
	}

	if len(r.Admission) > 0 {
		p("## Worst count in one 1 s window (limit 100 per second)\n\n")
		p("%d goroutines drive one key as hard as they can for %s. Each admitted request's call start and end are recorded; it was admitted somewhere in between. ", cfg.AdmitGoroutines, cfg.AdmitFor)
		p("The figure counts the admitted requests whose whole call lies inside one window (t−1s, t], the worst over all t: a lower bound of the true worst window that the client's latency cannot inflate, so any figure above 100 is proven over-admission.\n\n")
		p("| contender | method | worst 1 s window | admitted in all | errors |\n|---|---|---:|---:|---:|\n")
		for _, a := range r.Admission {
			p("| %s | %s | %d | %d in %s | %d |\n", a.Contender, r.method(a.Contender), a.Worst, a.Admitted, a.For, a.Errors)
		}
		p("\n")
	}

	if len(r.Flood) > 0 {
		p("## Flood: %d replicas hit one key\n\n", cfg.FloodProcesses)
		p("%d OS processes (replicas), each with its own client, a Limiter with the default options (100 ms timeout, fail open) and %d goroutines, hit one key limited to 100 per second as hard as they can for %s. ", cfg.FloodProcesses, cfg.FloodGoroutines, cfg.FloodFor)
		p("The worst 1 s window is fleet-wide, counted as above; every decision the failure mode answered was admitted.\n\n")
		p("| algorithm | worst 1 s window | admitted in all | decisions | answered by the failure mode | p99 |\n|---|---:|---:|---:|---:|---:|\n")
		for _, f := range r.Flood {
			p("| %s | %d | %d in %s | %s | %d | %s |\n", f.Contender, f.Worst, f.Admitted, f.For, thousands(f.Decisions), f.FailureAnswers, dur(f.P99))
		}
		p("\n")
	}

	switch {
	case len(r.Memory) > 0:
		small := r.smallestPeerMemory()
		p("## Redis memory per key\n\n")
		p("FLUSHALL, then %s keys (`user:0` …) with %d requests each under a limit of 100 per hour; the figure is the growth of INFO memory `used_memory` less `mem_clients_normal` (connection buffers), divided by the keys. Again with one request per key. ",
			thousands(int64(cfg.MemKeys)), cfg.MemRequests)
		p("Ratios are to the smallest peer at %d requests. A figure of 0 or less is the server's own churn, larger than the keys' memory: it shows as —.\n\n", cfg.MemRequests)
		p("| contender | bytes/key at %d requests | × smallest peer | bytes/key at 1 request | failed requests |\n|---|---:|---:|---:|---:|\n", cfg.MemRequests)
		for _, m := range r.Memory {
			x := "—"
			if m.PerKey > 0 {
				x = ratio(m.PerKey, small)
			}
			p("| %s | %s | %s | %s | %d |\n", m.Contender, bytesPerKey(m.PerKey), x, bytesPerKey(m.PerKeyOne), m.Errors)
		}
		p("\n")
	case r.MemoryNote != "":
		p("## Redis memory per key\n\n%s.\n\n", r.MemoryNote)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// bytesPerKey formats a memory figure; one of 0 or less is noise (see
// MinMemKeys), shown as —.
func bytesPerKey(v float64) string {
	if v <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f", v)
}

// throughputIntro says how the throughput was measured.
func (r *Report) throughputIntro(p func(string, ...any)) {
	cfg := r.Config
	p("Each contender runs in a process of its own, one process per contender, setting and round, against the same Redis; ")
	if r.Flushed {
		p("the server is flushed (FLUSHALL) before each process. ")
	} else {
		p("the server is not the program's own and was not flushed. ")
	}
	pool := fmt.Sprintf("a pool of %d connections in every setting", maxInt(cfg.Goroutines))
	switch {
	case cfg.Client == DefaultClient:
		pool = fmt.Sprintf("at go-redis's defaults: `redis.NewClient(&redis.Options{Addr: addr})`, on the Cluster `redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})`, so go-redis's default pool (%s connections) and no ContextTimeoutEnabled",
			r.pools())
	case len(cfg.Goroutines) == 0:
		pool = fmt.Sprintf("a pool of %d connections a master in every setting", maxInt(cfg.ClusterGoroutines))
	}
	p("A process opens its go-redis client (%s), warms up for %s (connections open, scripts loaded), then decides for %s. ",
		pool, cfg.Warm, cfg.Slice)
	p("The rounds interleave: in each setting, round 1 runs every contender once, then round 2 again, the order rotating by one each round. ")
	p("%s\n\n", roundsNote(cfg.Rounds))
	p("Client CPU is the process's own (getrusage); Redis CPU is the server's INFO cpu (user + system), so it includes reading and answering the connections. ")
	p("Redis's own µs a call is INFO commandstats' usec over calls of the contender's call (CONFIG RESETSTAT before each slice): the time Redis spends executing the call, its script's Lua and the commands inside included, without the connection's I/O; decisions a call is above 1 where decisions are merged into one call. ")
	p("The throughput limit (%s per %s, for every contender) admits every request (the tables count the denied: 0 is as it should be). Ratios are to the baseline: %s (by median decisions/s). ", thousands(int64(cfg.Count)), cfg.Window, baselineName(cfg))
	p("The hot denied key, the worst window and the memory are measured in the program itself, with one client, one contender after another.\n\n")
	if len(cfg.ClusterGoroutines) > 0 {
		p("The Cluster settings run on a Redis Cluster of %d masters without replicas that the program starts on loopback, every contender through a cluster client (go-redis's ClusterClient, rueidis's own), ", clusterMasters)
		clusterPool := fmt.Sprintf("a pool of %d connections a master", maxInt(cfg.ClusterGoroutines))
		if cfg.Client == DefaultClient {
			clusterPool = "go-redis's default pool a master"
		}
		p("the masters flushed and their statistics reset before each process (%s); Redis CPU and the commands' figures are summed over the masters.", clusterPool)
		for _, c := range r.Contenders {
			if c.NoCluster != "" {
				p(" %s is not among them: %s.", c.Name, c.NoCluster)
			}
		}
		p("\n\n")
	}
}

// throughputTables writes the summaries and a table for each setting.
func (r *Report) throughputTables(p func(string, ...any), settings []setting) {
	cfg := r.Config
	summary := func(title, about string, cell func(t, base Throughput, bok bool) string) {
		p("## %s\n\n%s\n\n| contender |", title, about)
		for _, s := range settings {
			p(" %s |", s.label())
		}
		p("\n|---|")
		for range settings {
			p("---:|")
		}
		p("\n")
		for _, c := range r.Contenders {
			p("| %s |", c.Name)
			for _, s := range settings {
				t, ok := r.row(c.Name, s)
				base, bok := r.baseline(s)
				if !ok {
					p(" — |")
					continue
				}
				p(" %s |", cell(t, base, bok))
			}
			p("\n")
		}
		p("\n")
	}
	summary("Decisions per second (median)", "× the baseline of each setting (more is better); — where a contender did not run.", func(t, base Throughput, bok bool) string {
		if !bok {
			return thousands(int64(t.PerSecond()))
		}
		return fmt.Sprintf("%s (%s)", thousands(int64(t.PerSecond())), ratio(t.PerSecond(), base.PerSecond()))
	})
	summary("Redis CPU µs a decision (median)", "The server's CPU (user + system, on a Cluster summed over the masters) per decision, × the baseline's of each setting (less is better).", func(t, base Throughput, bok bool) string {
		m, _, _ := t.Median(Slice.RedisMicros)
		if !bok {
			return fmt.Sprintf("%.1f", m)
		}
		bm, _, _ := base.Median(Slice.RedisMicros)
		return fmt.Sprintf("%.1f (%s)", m, ratio(m, bm))
	})

	for _, s := range settings {
		base, _ := r.baseline(s)
		p("### %s (baseline: %s)\n\n", s.label(), base.Contender)
		p("| contender | decisions/s | × baseline | p50 | p99 | allocs/decision | client CPU µs/decision | Redis CPU µs/decision | Redis's own µs a call | decisions a call | denied | errors |\n")
		p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range r.Contenders {
			t, ok := r.row(c.Name, s)
			if !ok {
				continue
			}
			p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %d |\n", c.Name,
				spread(t, Slice.PerSecond, count), ratio(t.PerSecond(), base.PerSecond()),
				spread(t, p50, durNs), spread(t, p99, durNs), spread(t, Slice.AllocsPerDecision, oneDigit),
				spread(t, Slice.ClientMicros, oneDigit), spread(t, Slice.RedisMicros, oneDigit),
				spread(t, Slice.CallMicros, twoDigits), spread(t, Slice.DecisionsPerCall, oneDigit), t.Denied(), t.Errors())
		}
		p("\n")
	}

	if low := r.lowestGoroutines(); low > 0 {
		p("## Redis's own time a call, %d goroutine(s) (INFO commandstats)\n\n", low)
		p("The call's µs, the commands Redis ran inside it (each command's µs per call, and how many per call where not one), their sum, and the rest: the call's own work around them (for a script, its Lua). Medians over the rounds, spreads in brackets.\n\n")
		for _, nk := range cfg.Keys {
			s := setting{low, nk, false}
			if !slices.Contains(settings, s) {
				continue
			}
			p("### %s\n\n", s.label())
			p("| contender | call | µs a call | decisions a call | the commands inside, µs a call | inside | the rest |\n|---|---|---:|---:|---|---:|---:|\n")
			for _, c := range r.Contenders {
				t, ok := r.row(c.Name, s)
				if !ok {
					continue
				}
				p("| %s | %s | %s | %s | %s | %s | %s |\n", c.Name, r.callNames(c.Name),
					spread(t, Slice.CallMicros, twoDigits), spread(t, Slice.DecisionsPerCall, oneDigit),
					insideList(t), spread(t, Slice.InsideMicros, twoDigits), spread(t, Slice.RestMicros, twoDigits))
			}
			p("\n")
		}
	}
}

// pools lists the pool sizes the throughput processes' go-redis clients
// had (Slice.Pool), the server's first: "20", or "20; on the Cluster, 10 a
// master".
func (r *Report) pools() string {
	var server, cluster []int
	for _, t := range r.Throughput {
		for _, s := range t.Rounds {
			dst := &server
			if t.Cluster {
				dst = &cluster
			}
			if s.Pool > 0 && !slices.Contains(*dst, s.Pool) {
				*dst = append(*dst, s.Pool)
			}
		}
	}
	list := func(v []int) string {
		slices.Sort(v)
		parts := make([]string, len(v))
		for i, n := range v {
			parts[i] = fmt.Sprint(n)
		}
		return strings.Join(parts, ", ")
	}
	switch {
	case len(server) == 0 && len(cluster) == 0:
		return "unknown"
	case len(cluster) == 0:
		return list(server)
	case len(server) == 0:
		return list(cluster) + " a master"
	}
	return list(server) + "; on the Cluster, " + list(cluster) + " a master"
}

func (r *Report) method(name string) string {
	for _, c := range r.Contenders {
		if c.Name == name {
			return c.Method
		}
	}
	return ""
}

func (r *Report) smallestPeerMemory() float64 {
	small := math.Inf(1)
	for _, m := range r.Memory {
		if r.peer(m.Contender) && m.PerKey > 0 && m.PerKey < small {
			small = m.PerKey
		}
	}
	if math.IsInf(small, 1) {
		return 0
	}
	return small
}

func roundsNote(rounds int) string {
	if rounds == 1 {
		return "One round: each figure is that round's."
	}
	return fmt.Sprintf("Each figure is the median of the %d rounds, followed by its spread (smallest–largest) in brackets.", rounds)
}

// callNames names the calls contender name sent in any setting.
func (r *Report) callNames(name string) string {
	var names []string
	for _, t := range r.Throughput {
		if t.Contender != name {
			continue
		}
		for _, s := range t.Rounds {
			if s.Call.Name != "" && !slices.Contains(names, s.Call.Name) {
				names = append(names, s.Call.Name)
			}
		}
	}
	if len(names) == 0 {
		return "—"
	}
	return strings.Join(names, ", ")
}

// lowestGoroutines is the smallest goroutine count of the server's grid;
// 0 when it was not run.
func (r *Report) lowestGoroutines() int {
	low := 0
	for _, t := range r.Throughput {
		if !t.Cluster && (low == 0 || t.Goroutines < low) {
			low = t.Goroutines
		}
	}
	return low
}

func p50(s Slice) float64 { return float64(s.P50) }
func p99(s Slice) float64 { return float64(s.P99) }

// A unit formats a figure's median and, with spread, its smallest and
// largest round.
type unit func(med, lo, hi float64, spread bool) string

func count(med, lo, hi float64, spread bool) string {
	if !spread {
		return thousands(int64(med))
	}
	return fmt.Sprintf("%s (%s–%s)", thousands(int64(med)), thousands(int64(lo)), thousands(int64(hi)))
}

func digits(n int) unit {
	return func(med, lo, hi float64, spread bool) string {
		if !spread {
			return fmt.Sprintf("%.*f", n, med)
		}
		return fmt.Sprintf("%.*f (%.*f–%.*f)", n, med, n, lo, n, hi)
	}
}

var oneDigit, twoDigits = digits(1), digits(2)

// durNs formats nanoseconds in the unit the median reads best in.
func durNs(med, lo, hi float64, spread bool) string {
	div, name, prec := 1.0, "ns", 0
	switch {
	case med >= 1e6:
		div, name, prec = 1e6, "ms", 2
	case med >= 1e3:
		div, name = 1e3, "µs"
	}
	if !spread {
		return fmt.Sprintf("%.*f %s", prec, med/div, name)
	}
	return fmt.Sprintf("%.*f %s (%.*f–%.*f)", prec, med/div, name, prec, lo/div, prec, hi/div)
}

// spread formats fig of t's rounds in u.
func spread(t Throughput, fig func(Slice) float64, u unit) string {
	med, lo, hi := t.Median(fig)
	return u(med, lo, hi, len(t.Rounds) > 1)
}

// insideList lists the commands inside t's calls, most time first: each
// one's median µs per call over the rounds, and its count per call where
// that is not one.
func insideList(t Throughput) string {
	var names []string
	for _, s := range t.Rounds {
		for _, c := range s.Inside {
			if !slices.Contains(names, c.Name) {
				names = append(names, c.Name)
			}
		}
	}
	type item struct {
		name        string
		usec, calls float64
	}
	items := make([]item, len(names))
	for i, name := range names {
		per := func(f func(CommandStat) int64) func(Slice) float64 {
			return func(s Slice) float64 {
				for _, c := range s.Inside {
					if c.Name == name && s.Call.Calls > 0 {
						return float64(f(c)) / float64(s.Call.Calls)
					}
				}
				return 0
			}
		}
		usec, _, _ := t.Median(per(func(c CommandStat) int64 { return c.Usec }))
		calls, _, _ := t.Median(per(func(c CommandStat) int64 { return c.Calls }))
		items[i] = item{strings.ToUpper(strings.ReplaceAll(name, "|", " ")), usec, calls}
	}
	slices.SortStableFunc(items, func(a, b item) int { return cmp.Compare(b.usec, a.usec) })
	var parts []string
	for _, it := range items {
		if it.calls < 0.995 || it.calls >= 1.005 {
			parts = append(parts, fmt.Sprintf("%s ×%.2g %.2f", it.name, it.calls, it.usec))
		} else {
			parts = append(parts, fmt.Sprintf("%s %.2f", it.name, it.usec))
		}
	}
	if len(parts) == 0 {
		return "—"
	}
	return strings.Join(parts, ", ")
}

func baselineName(cfg Config) string {
	if cfg.Baseline != "" {
		return cfg.Baseline
	}
	return "the fastest peer of each setting"
}

func maxInt(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// SVG writes a chart: decisions per second at the most goroutines and keys,
// and the worst count in one second for a limit of 100, per contender.
func (r *Report) SVG(w io.Writer) error {
	s := setting{maxInt(r.Config.Goroutines), maxInt(r.Config.Keys), false}
	type bar struct {
		name  string
		value float64
		label string
		ours  bool
	}
	var speed, admit []bar
	for _, c := range r.Contenders {
		ours := !c.Peer && strings.HasPrefix(c.Name, "ratewindow")
		if t, ok := r.row(c.Name, s); ok {
			speed = append(speed, bar{c.Name, t.PerSecond(), thousands(int64(t.PerSecond())) + "/s", ours})
		}
		for _, a := range r.Admission {
			if a.Contender == c.Name {
				admit = append(admit, bar{c.Name, float64(a.Worst), fmt.Sprint(a.Worst), ours})
			}
		}
	}
	const (
		width  = 760
		left   = 230
		barW   = 420
		rowH   = 22
		titleH = 34
		gap    = 24
	)
	height := titleH + len(speed)*rowH + gap + titleH + len(admit)*rowH + 30
	var b bytes.Buffer
	esc := func(s string) string {
		var e bytes.Buffer
		_ = xml.EscapeText(&e, []byte(s))
		return e.String()
	}
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	panel := func(y int, title string, bars []bar, limit float64) int {
		fmt.Fprintf(&b, `<text x="10" y="%d" font-size="14" font-weight="bold">%s</text>`+"\n", y+20, esc(title))
		y += titleH
		top := 0.0
		for _, x := range bars {
			top = max(top, x.value)
		}
		top = max(top, limit*1.25)
		if top <= 0 {
			top = 1
		}
		for i, x := range bars {
			yy := y + i*rowH
			fill := "#9aa5b1"
			if x.ours {
				fill = "#2b7bb9"
			}
			wpx := x.value / top * barW
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", left-8, yy+14, esc(x.name))
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", left, yy+3, wpx, rowH-6, fill)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s</text>`+"\n", float64(left)+wpx+6, yy+14, esc(x.label))
		}
		if limit > 0 {
			lx := float64(left) + limit/top*barW
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#c0392b" stroke-dasharray="4 3"/>`+"\n", lx, y, lx, y+len(bars)*rowH)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#c0392b" text-anchor="middle">limit %.0f</text>`+"\n", lx, y+len(bars)*rowH+14, limit)
		}
		return y + len(bars)*rowH
	}
	y := panel(0, fmt.Sprintf("Decisions per second, %d goroutines, %s (more is better)", s.g, keysLabel(s.keys)), speed, 0)
	panel(y+gap, "Worst count in one 1 s window, limit 100 per second (at most 100 is exact)", admit, 100)
	fmt.Fprintf(&b, "</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}
