package admin_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/ratewindow/ratewindow/core"
	"github.com/ratewindow/ratewindow/internal/redistest"
)

// chromium returns the path of the chromium binary. Without one the test
// is skipped, or fails under RATEWINDOW_REQUIRE_REDIS=1 (CI), where nothing
// may skip.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	const msg = "no chromium in PATH: the page's test drives a real headless browser (apt-get install -y chromium)"
	if os.Getenv("RATEWINDOW_REQUIRE_REDIS") == "1" {
		t.Fatal(msg + ", and RATEWINDOW_REQUIRE_REDIS=1 forbids skipping")
	}
	t.Skip(msg)
	return ""
}

// browser starts a headless chromium with a fresh profile and returns a
// context of one of its tabs, cancelled at t.Cleanup.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(cancelTab)
	return bctx
}

func TestPageInBrowser(t *testing.T) {
	ctx := browser(t)
	srv := redistest.New(t)
	if !srv.Real {
		t.Skip("no redis-server: the page's test needs a real Redis")
	}
	a := newApp(t, srv.Client(t))
	a.header = "Bearer page-token" // the page's calls must carry the operator's credentials

	// A rule keyed by a header a client chooses: its key is shown as text,
	// never as markup.
	user := core.Rule{
		Name: "user", Limits: []core.Limit{core.PerMinute(1)}, TrackDenied: true,
		Key: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil },
	}
	if err := a.l.Publish(context.Background(), user.Info()); err != nil {
		t.Fatal(err)
	}
	e, err := core.NewEnforcer(a.l, user)
	if err != nil {
		t.Fatal(err)
	}
	const evil = `<img src=x onerror="window.pwned=1">`
	for range 3 {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-User", evil)
		e.Handle(httptest.NewRecorder(), r, "/")
	}
	const ip = "10.0.0.9"
	key := "ip:" + ip
	a.hit(t, ip, 8) // 5 counted, 3 denied
	a.header = ""
	waitTop(t, a, key)
	a.header = "Bearer page-token"

	// The page's calls carry the operator's credentials: the browser adds
	// them to every request, as a session cookie or a proxy would.
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": "Bearer page-token"}}); err != nil {
		t.Fatal(err)
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	// The rules fill the select; the top of the first rule ("api") shows.
	do("load the page",
		chromedp.Navigate(a.srv.URL+"/ops/"),
		chromedp.WaitReady(chromedp.CSS(`#rule option[value="user"]`)),
		chromedp.WaitReady(chromedp.CSS(`#top-rows button.key`)),
	)
	if got := text(`#top-rows button.key`); got != key {
		t.Errorf("top of api shows %q first, want %q", got, key)
	}

	// Look a key up.
	do("look a key up",
		chromedp.SetValue(chromedp.CSS(`#key`), key),
		chromedp.Click(chromedp.CSS(`#lookup button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#usage`)),
	)
	usageKey, rows, blocked, override := text(`#usage-key`), text(`#usage-rows`), text(`#blocked`), text(`#override`)
	if usageKey != key || !strings.Contains(rows, "5 per 1m") || !strings.Contains(blocked, "Not blocked") || !strings.Contains(override, "No override") {
		t.Errorf("usage shows key %q, rows %q, %q, %q", usageKey, rows, blocked, override)
	}
	// The row reads: the limit, 5 used, 0 remaining, the time until full.
	if f := strings.Fields(rows); len(f) < 6 || f[3] != "5" || f[4] != "0" {
		t.Errorf("usage row %q: want 5 used and 0 remaining", rows)
	}

	// The rule "user": its top holds a key that looks like markup; a click
	// on it looks it up, and it shows as text.
	do("the top of user",
		chromedp.SetValue(chromedp.CSS(`#rule`), "user"),
		chromedp.Click(chromedp.CSS(`#top-form button[type="submit"]`)),
		chromedp.Poll[chromedp.Void](`document.getElementById("top-rule").textContent === "user" && document.querySelector("#top-rows button.key") !== null`),
		chromedp.Click(chromedp.CSS(`#top-rows button.key`)),
		chromedp.Poll[chromedp.Void](`document.getElementById("usage-rule").textContent === "user"`),
	)
	imgs, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("img").length`))
	if err != nil {
		t.Fatal(err)
	}
	pwned, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.pwned === 1`))
	if err != nil {
		t.Fatal(err)
	}
	if got := text(`#usage-key`); got != evil || imgs != 0 || pwned {
		t.Errorf("a key that looks like markup: shown as %q, %d img elements, its script ran: %v", got, imgs, pwned)
	}

	// An unknown key: the handler's error shows.
	do("look an unknown key up",
		chromedp.SetValue(chromedp.CSS(`#key`), "ip:10.9.9.9"),
		chromedp.Click(chromedp.CSS(`#lookup button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#error`)),
	)
	if got := text(`#error`); !strings.Contains(got, "unknown key") {
		t.Errorf("an unknown key shows %q", got)
	}
}
