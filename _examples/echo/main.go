// Command echo is a echo server rate-limited by ratewindow: a global limit
// per client IP; failed logins per IP on POST /login, with a ban for a
// client that keeps failing, and per account; an API whose limits follow the plan of the
// caller's API key; and an export that costs 5 units. Run it with
//
//	go run ./_examples/echo
//
// It uses REDIS_URL when set, else an embedded Redis, and listens on ADDR
// (default 127.0.0.1:8080). It reads top to bottom: Redis, the Limiter and
// its readiness check, the rules, the routes with their middleware, and the
// server.
package main

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/ratewindow/ratewindow/_examples/internal/redisenv"
	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/echomw"
	"github.com/ratewindow/ratewindow/keyfuncs"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// Redis: REDIS_URL, or an embedded one for a first try.
	rdb, embedded, closeRedis, err := redisenv.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer closeRedis()

	// One Limiter per process, shared by every rule. Stop here unless
	// Redis answers, takes the password, lets us run the scripts and will
	// not evict our keys: otherwise every request would pass unlimited (the
	// failure mode, FailOpen, answers). The embedded miniredis has no
	// eviction policy to read (ErrCheckIncomplete).
	l, err := core.New(rdb, core.WithPrefix("rw:example:"))
	if err != nil {
		log.Fatal(err)
	}
	checkCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.Check(checkCtx); err != nil && !(embedded && errors.Is(err, core.ErrCheckIncomplete)) {
		log.Fatalf("redis: %v", err)
	}

	// OnError sees key and Redis errors; it writes no response, so the
	// failure mode (fail open, the default) decides.
	onError := func(_ http.ResponseWriter, r *http.Request, err error) {
		log.Printf("%s %s: %v", r.Method, r.URL.Path, err)
	}
	global := core.Rule{ // every route but the health check, per client IP
		Name:   "global",
		Limits: []core.Limit{core.PerSecond(20), core.PerMinute(300)},
		// The peer address. Behind proxies, list the proxies' own addresses,
		// such as keyfuncs.IP(netip.MustParsePrefix("10.1.0.7/32")), never a
		// whole range such as 10.0.0.0/8: a host of that range that reaches
		// this server directly could write any X-Forwarded-For, and get
		// another client banned by a Penalty (docs/rules-and-keys.md).
		Key:  keyfuncs.IP(),
		Skip: func(r *http.Request) bool { return r.URL.Path == "/healthz" },
		// The IETF RateLimit and RateLimit-Policy fields. A response shows
		// one style, that of the outermost rule: this one.
		Headers: core.IETF,
		OnError: onError,
	}
	// Failed logins only, per client IP: a successful login (200) gives its
	// unit back, a wrong password (401) keeps it. An IP denied 3 times
	// within a minute is banned for 15 minutes, on every replica. No user
	// is signed in before a login: the keys come from the request.
	login := core.Rule{
		Name:    "login",
		Limits:  []core.Limit{core.PerMinute(5)},
		Key:     keyfuncs.IP(),
		CountIf: func(status int) bool { return status == http.StatusUnauthorized },
		Penalty: &core.Penalty{Denials: 3, Within: time.Minute, Ban: 15 * time.Minute},
		OnError: onError,
	}
	// Failed logins per account, from the form's user field, whatever the
	// address they come from: 20 an hour. No Penalty here: a ban of an
	// account would let anyone lock its owner out.
	loginAccount := core.Rule{
		Name:    "login-account",
		Limits:  []core.Limit{core.PerHour(20)},
		Key:     account,
		CountIf: func(status int) bool { return status == http.StatusUnauthorized },
		OnError: onError,
	}
	// The API's limits follow the plan of the caller's API key (a real
	// server looks it up, or reads it from a token's claims); callers
	// without a known key get the rule's Limits, per IP.
	plans := map[string][]core.Limit{
		"free-key": {{Name: "free", Count: 10, Window: time.Minute}},
		"pro-key":  {{Name: "pro", Count: 100, Window: time.Minute}, {Name: "pro-burst", Count: 10, Window: time.Second}},
	}
	byIP := keyfuncs.IP()
	api := core.Rule{
		Name:   "api",
		Limits: []core.Limit{{Name: "anonymous", Count: 5, Window: time.Minute}},
		Key: func(r *http.Request) (string, error) {
			if k := r.Header.Get("X-Api-Key"); plans[k] != nil {
				return "key:" + k, nil
			}
			return byIP(r)
		},
		LimitsFor: func(r *http.Request) ([]core.Limit, error) { return plans[r.Header.Get("X-Api-Key")], nil },
		OnError:   onError,
	}
	export := core.Rule{ // 20 units a minute per client IP; an export costs 5
		Name:    "export",
		Limits:  []core.Limit{core.PerMinute(20)},
		Cost:    func(*http.Request) int64 { return 5 },
		OnError: onError,
	}

	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Use(echomw.Limit(l, global))
	e.GET("/", func(c echo.Context) error {
		return c.String(http.StatusOK, "ratewindow echo example: POST /login (form fields user, password=letmein), GET /api/orders (X-Api-Key: free-key or pro-key), GET /export, GET /healthz\n")
	})
	e.GET("/healthz", func(c echo.Context) error { return c.String(http.StatusOK, "ok\n") })
	e.POST("/login", func(c echo.Context) error {
		user := c.FormValue("user")
		if user == "" || c.FormValue("password") != "letmein" {
			return c.String(http.StatusUnauthorized, "wrong user or password\n")
		}
		return c.String(http.StatusOK, "welcome, "+user+"\n")
	}, echomw.Limit(l, login), echomw.Limit(l, loginAccount))
	e.GET("/api/orders", func(c echo.Context) error {
		return c.Blob(http.StatusOK, "application/json", []byte(`[{"id":1,"total":42}]`+"\n"))
	}, echomw.Limit(l, api))
	e.GET("/export", func(c echo.Context) error {
		return c.Blob(http.StatusOK, "text/csv", []byte("id,name\n1,alice\n2,bob\n"))
	}, echomw.Limit(l, export))
	handler := e

	// The server, until SIGINT or SIGTERM; requests in flight finish.
	ln, err := net.Listen("tcp", redisenv.Addr())
	if err != nil {
		log.Fatal(err)
	}
	log.SetFlags(log.Ltime)
	log.SetOutput(os.Stdout)
	log.Printf("limits: global 20/s and 300/min per IP; login 5 failed/min per IP, banned 15m after 3 denials, and 20 failed/h per account; api by plan (free-key 10/min, pro-key 100/min and 10/s, others 5/min per IP); export 20 units/min per IP, 5 a call")
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	os.Stdout.WriteString("listening on http://" + ln.Addr().String() + "\n")
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// account keys a login by the account it is for, from the form's user
// field (lower-cased): no user is signed in before a login, so there is
// nothing for keyfuncs.User to read. A request without one gets no key
// here; it is a key error, which the rule's OnError sees.
func account(r *http.Request) (string, error) {
	name := strings.ToLower(strings.TrimSpace(r.PostFormValue("user")))
	if name == "" {
		return "", keyfuncs.ErrNoKey
	}
	return "account:" + name, nil
}
