package admin

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strconv"
	"time"

	"github.com/ratewindow/ratewindow/core"
)

// Access is what a request asks of the handler, for its authorization function.
type Access uint8

const (
	// Read is a GET or HEAD: the page, the rules, a key's usage and
	// override, the top denied keys.
	Read Access = iota
	// Write is any other method: reset, block, unblock, set or remove an override.
	Write
)

// String returns "read" or "write".
func (a Access) String() string {
	if a == Read {
		return "read"
	}
	return "write"
}

// ErrNoAuthorization is returned by New without an authorization function.
var ErrNoAuthorization = errors.New("ratewindow: admin handler needs an authorization function")

//go:embed page
var page embed.FS

// maxBody bounds a request's form: a rule, a key and a few limits.
const maxBody = 64 << 10

// New returns an http.Handler serving the operations of Ops on l as JSON,
// and a page to look at a key's usage and the top denied keys. Mount it
// under a path of its own with http.StripPrefix, the path ending in "/":
//
//	h, err := admin.New(l, authorize)
//	mux.Handle("/ratewindow/", http.StripPrefix("/ratewindow", h))
//
// authorize is asked first on every request, with the request and what it
// asks (Read for GET and HEAD, Write for any other method); a request it
// refuses gets 403 and nothing else, not even whether a rule or a key
// exists. New returns an error wrapping ErrNoAuthorization when authorize
// is nil. Writes are also refused when the browser says they come from
// another origin (http.CrossOriginProtection), so a page elsewhere cannot
// use an operator's session.
//
// Routes (parameters in the query string or, for writes, a form body):
//
//	GET    /                                     the page
//	GET    /api/rules                            the published rules
//	GET    /api/usage?rule=R&key=K               a key's usage
//	POST   /api/reset      rule, key             forget its counts, lift its block
//	POST   /api/block      rule, key, for        block it for a duration, such as 10m
//	POST   /api/unblock    rule, key             lift its block
//	GET    /api/override?rule=R&key=K            its override
//	PUT    /api/override   rule, key, limits, for   set it ("500/m, 20000/24h"; for: 0 or none until removed)
//	DELETE /api/override?rule=R&key=K            remove it
//	GET    /api/top?rule=R&n=10&since=5m         the keys denied most
//
// Answers are JSON: the types of this package, 204 for a write without an
// answer, or {"error": "..."} with 400 (bad input), 404 (unknown rule or
// key, no override), 409 (not blocked, rule not tracked) or 502 (Redis failed).
func New(l *core.Limiter, authorize func(r *http.Request, a Access) bool) (http.Handler, error) {
	if authorize == nil {
		return nil, ErrNoAuthorization
	}
	ops, err := NewOps(l)
	if err != nil {
		return nil, err
	}
	static, err := fs.Sub(page, "page")
	if err != nil {
		return nil, fmt.Errorf("ratewindow: admin page: %w", err)
	}
	a := api{ops: ops}
	mux := http.NewServeMux()
	files := pageHeaders(http.FileServerFS(static))
	for _, path := range []string{"/{$}", "/app.js", "/style.css"} {
		mux.Handle("GET "+path, files)
	}
	mux.HandleFunc("GET /api/rules", a.rules)
	mux.HandleFunc("GET /api/usage", a.usage)
	mux.HandleFunc("POST /api/reset", a.reset)
	mux.HandleFunc("POST /api/block", a.block)
	mux.HandleFunc("POST /api/unblock", a.unblock)
	mux.HandleFunc("GET /api/override", a.override)
	mux.HandleFunc("PUT /api/override", a.setOverride)
	mux.HandleFunc("DELETE /api/override", a.removeOverride)
	mux.HandleFunc("GET /api/top", a.top)
	return &handler{authorize: authorize, next: http.NewCrossOriginProtection().Handler(mux)}, nil
}

// handler asks authorize before anything else.
type handler struct {
	authorize func(*http.Request, Access) bool
	next      http.Handler
}

// ServeHTTP answers 403 to a request authorize refuses, else serves it.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	access := Write
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		access = Read
	}
	if !h.authorize(r, access) {
		writeJSON(w, http.StatusForbidden, errorBody{Error: "forbidden"})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	h.next.ServeHTTP(w, r)
}

// pageHeaders sets the page's headers: its scripts and styles come from
// this handler only, so a key shown on it cannot bring in a script.
func pageHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// api serves the JSON routes.
type api struct{ ops *Ops }

func (a api) rules(w http.ResponseWriter, r *http.Request) {
	rules, err := a.ops.Rules(r.Context())
	answer(w, rules, err)
}

func (a api) usage(w http.ResponseWriter, r *http.Request) {
	u, err := a.ops.Usage(r.Context(), r.FormValue("rule"), r.FormValue("key"))
	answer(w, u, err)
}

func (a api) reset(w http.ResponseWriter, r *http.Request) {
	answer(w, nil, a.ops.Reset(r.Context(), r.FormValue("rule"), r.FormValue("key")))
}

func (a api) block(w http.ResponseWriter, r *http.Request) {
	d, err := duration(r, "for", 0)
	if err == nil {
		err = a.ops.Block(r.Context(), r.FormValue("rule"), r.FormValue("key"), d)
	}
	answer(w, nil, err)
}

func (a api) unblock(w http.ResponseWriter, r *http.Request) {
	answer(w, nil, a.ops.Unblock(r.Context(), r.FormValue("rule"), r.FormValue("key")))
}

func (a api) override(w http.ResponseWriter, r *http.Request) {
	ov, err := a.ops.Override(r.Context(), r.FormValue("rule"), r.FormValue("key"))
	answer(w, ov, err)
}

func (a api) setOverride(w http.ResponseWriter, r *http.Request) {
	ttl, err := duration(r, "for", 0)
	if err != nil {
		answer(w, nil, err)
		return
	}
	ov, err := a.ops.SetOverride(r.Context(), r.FormValue("rule"), r.FormValue("key"), r.FormValue("limits"), ttl)
	answer(w, ov, err)
}

func (a api) removeOverride(w http.ResponseWriter, r *http.Request) {
	answer(w, nil, a.ops.RemoveOverride(r.Context(), r.FormValue("rule"), r.FormValue("key")))
}

func (a api) top(w http.ResponseWriter, r *http.Request) {
	n := DefaultTopN
	if s := r.FormValue("n"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			answer(w, nil, fmt.Errorf("%w: n=%q is not a whole number", errBadInput, s))
			return
		}
	}
	since, err := duration(r, "since", DefaultTopSince)
	if err != nil {
		answer(w, nil, err)
		return
	}
	t, err := a.ops.Top(r.Context(), r.FormValue("rule"), n, since)
	answer(w, t, err)
}

// duration reads the form value name as a duration; def when it is absent.
func duration(r *http.Request, name string, def time.Duration) (time.Duration, error) {
	s := r.FormValue(name)
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %s=%q is not a duration such as 10m or 1h30m", core.ErrInvalidDuration, name, s)
	}
	return d, nil
}

// errorBody is the answer of a failed request.
type errorBody struct {
	Error string `json:"error"`
}

// answer writes v as JSON (204 when v is nil), or err with its status.
func answer(w http.ResponseWriter, v any, err error) {
	switch {
	case err != nil:
		writeJSON(w, status(err), errorBody{Error: err.Error()})
	case v == nil:
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
	default:
		writeJSON(w, http.StatusOK, v)
	}
}

// status is the HTTP status of a failed operation.
func status(err error) int {
	switch {
	case errors.Is(err, ErrUnknownRule), errors.Is(err, ErrUnknownKey), errors.Is(err, core.ErrNoOverride):
		return http.StatusNotFound
	case errors.Is(err, ErrNotBlocked), errors.Is(err, ErrNotTracked):
		return http.StatusConflict
	case errors.Is(err, errBadInput), errors.Is(err, core.ErrInvalidKey), errors.Is(err, core.ErrInvalidLimit),
		errors.Is(err, core.ErrInvalidDuration), errors.Is(err, core.ErrNoLimits):
		return http.StatusBadRequest
	}
	return http.StatusBadGateway
}

// writeJSON writes v as the answer with status code.
func writeJSON(w http.ResponseWriter, code int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
