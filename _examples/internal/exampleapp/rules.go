package exampleapp

import (
	"fmt"
	"io"
	"net/http"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/keyfuncs"
)

// The numbers behind the rules.
const (
	GlobalPerSecond = 20  // requests per client IP per second, every route
	GlobalPerMinute = 300 // requests per client IP per minute, every route
	LoginPerMinute  = 5   // login attempts per user per minute
	ExportPerMinute = 20  // export units per client IP per minute
	ExportCost      = 5   // units one export costs: 4 exports a minute
)

// Paths of the routes every example serves.
const (
	PathHome   = "/"
	PathHealth = "/healthz" // not limited
	PathLogin  = "/login"   // POST, with the user in the X-User header
	PathExport = "/export"
)

// Rules are the three rules every example installs.
type Rules struct {
	// Global covers every request but the health check, keyed by client
	// IP: a burst limit and a sustained one.
	Global core.Rule
	// Login is stricter: per user and route, on POST /login.
	Login core.Rule
	// Export charges ExportCost units per request against a per-IP budget.
	Export core.Rule
}

// newRules returns the rules, with the OnError hook that onError returns
// for each rule's name.
func newRules(onError func(rule string) func(http.ResponseWriter, *http.Request, error)) Rules {
	return Rules{
		Global: core.Rule{
			Name:    "global",
			Limits:  []core.Limit{core.PerSecond(GlobalPerSecond), core.PerMinute(GlobalPerMinute)},
			Key:     keyfuncs.IP(), // behind a proxy: keyfuncs.IP(netip.MustParsePrefix("10.0.0.0/8"))
			Skip:    func(r *http.Request) bool { return r.URL.Path == PathHealth },
			OnError: onError("global"),
		},
		Login: core.Rule{
			Name:   "login",
			Limits: []core.Limit{core.PerMinute(LoginPerMinute)},
			// A real server takes the user from its session:
			// keyfuncs.User(func(ctx context.Context) (string, bool) { ... }).
			Key:     keyfuncs.Join(keyfuncs.Header("X-User"), keyfuncs.Route()),
			Headers: core.Both, // X-RateLimit-* and the IETF RateLimit, RateLimit-Policy
			OnError: onError("login"),
		},
		Export: core.Rule{
			Name:    "export",
			Limits:  []core.Limit{core.PerMinute(ExportPerMinute)},
			Key:     keyfuncs.IP(),
			Cost:    func(*http.Request) int64 { return ExportCost },
			OnError: onError("export"),
		},
	}
}

func (rs Rules) all() []core.Rule { return []core.Rule{rs.Global, rs.Login, rs.Export} }

// print lists the rules, one line each.
func (rs Rules) print(w io.Writer) {
	fmt.Fprintf(w, "limits:\n")
	fmt.Fprintf(w, "  global  %d/s and %d/min per client IP        every route but %s\n", GlobalPerSecond, GlobalPerMinute, PathHealth)
	fmt.Fprintf(w, "  login   %d/min per user (X-User) and route    POST %s\n", LoginPerMinute, PathLogin)
	fmt.Fprintf(w, "  export  %d units/min per client IP, %d a call  GET %s\n", ExportPerMinute, ExportCost, PathExport)
}

// Home is the body of GET /.
func Home(name string) string {
	return fmt.Sprintf("ratewindow %s example: POST %s (X-User header), GET %s, GET %s\n", name, PathLogin, PathExport, PathHealth)
}

// Login answers POST /login for the user named in the X-User header: the
// status and the body. The example checks no password.
func Login(user string) (int, string) {
	if user == "" {
		return http.StatusBadRequest, "X-User header required\n"
	}
	return http.StatusOK, "welcome, " + user + "\n"
}

// ExportCSV is the body of GET /export.
const ExportCSV = "id,name\n1,alice\n2,bob\n"
