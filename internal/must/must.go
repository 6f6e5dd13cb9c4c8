// Package must turns the error of a middleware constructor into a panic at
// start-up, for the adapters' Limit functions, whose frameworks leave no
// room for an error.
package must

import (
	"errors"
	"fmt"
	"runtime"
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

// ByIP returns core.ByIP(n, window) for an adapter's LimitByIP, or panics
// with what is wrong named after that call ("nethttp.LimitByIP(l, 0,
// 1m0s)"), not after the rule it builds, which is not the user's.
func ByIP(l *core.Limiter, n int64, window time.Duration) core.Rule {
	err := core.Per(n, window).Validate()
	if l == nil {
		err = errors.New("ratewindow: nil Limiter")
	}
	if err != nil {
		panic(fmt.Errorf("%w (%s(l, %d, %s))", err, caller(), n, window))
	}
	return core.ByIP(n, window)
}

// caller names the function that called Build: "package.Function".
func caller() string {
	pc, _, _, _ := runtime.Caller(2)     // there always is one (else FuncForPC(0).Name() is "")
	name := runtime.FuncForPC(pc).Name() // "github.com/ratewindow/ratewindow/chimw.Limit"
	return name[strings.LastIndexByte(name, '/')+1:]
}
