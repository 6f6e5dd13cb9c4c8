// Package must turns the error of a middleware constructor into a panic at
// start-up, for the adapters' Limit functions, whose frameworks leave no
// room for an error.
package must

import (
	"errors"
	"fmt"
	"path"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/ratewindow/ratewindow/core"
)

// Build returns mw, or panics with err named after the function that
// called Build ("chimw.Limit"), where the invalid rule was given.
func Build[T any](mw T, err error) T {
	if err != nil {
		panic(fmt.Errorf("%w (%s)", err, caller()))
	}
	return mw
}

// ByIP returns core.ByIP(n, window) for an adapter's LimitByIP, named
// after the limit and the line that called LimitByIP
// ("ip-100-per-1m@api/routes.go#42"), or panics with what is wrong named
// after that call ("nethttp.LimitByIP(l, 0, 1m0s)"), not after the rule it
// builds, which is not the user's. The call site keeps two one-liners of
// the same limit on two routes apart (named after the limit alone, they
// shared one counter), and names the same rule in every replica built from
// the same code: it is the file's directory and name, not its path on the
// machine that built it.
func ByIP(l *core.Limiter, n int64, window time.Duration) core.Rule {
	err := core.Per(n, window).Validate()
	if l == nil {
		err = errors.New("ratewindow: nil Limiter")
	}
	if err != nil {
		panic(fmt.Errorf("%w (%s(l, %d, %s))", err, caller(), n, window))
	}
	rule := core.ByIP(n, window)
	_, file, line, _ := runtime.Caller(2) // the caller of the adapter's LimitByIP
	rule.Name += "@" + callSite(file, line, maxName-len(rule.Name)-1)
	return rule
}

// maxName is the longest rule name core accepts (core.Rule.Name).
const maxName = 64

// callSite names file:line in at most room bytes as "dir/file.go#line"
// (the line alone if even "file.go#line" does not fit), with the bytes a
// rule's name may not hold (space, ':', '{', '}', non-printable) as '_'.
func callSite(file string, line, room int) string {
	at := "#" + strconv.Itoa(line)
	site := path.Base(path.Dir(file)) + "/" + path.Base(file) + at
	if len(site) > room {
		site = path.Base(file) + at
	}
	if len(site) > room {
		site = at
	}
	return strings.Map(func(r rune) rune {
		if r <= ' ' || r > '~' || r == ':' || r == '{' || r == '}' {
			return '_'
		}
		return r
	}, site)
}

// caller names the function that called Build: "package.Function".
func caller() string {
	pc, _, _, _ := runtime.Caller(2)     // there always is one (else FuncForPC(0).Name() is "")
	name := runtime.FuncForPC(pc).Name() // "github.com/ratewindow/ratewindow/chimw.Limit"
	return name[strings.LastIndexByte(name, '/')+1:]
}
