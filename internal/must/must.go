// Package must turns the error of a middleware constructor into a panic at
// start-up, for the adapters' Limit functions, whose frameworks leave no
// room for an error.
package must

import (
	"fmt"
	"runtime"
	"strings"
)

// Build returns mw, or panics with err named after the function that
// called Build ("chimw.Limit"), so that the message says where the invalid
// rule was given.
func Build[T any](mw T, err error) T {
	if err != nil {
		panic(fmt.Errorf("%w (%s)", err, caller()))
	}
	return mw
}

// caller names the function that called Build: "package.Function".
func caller() string {
	pc, _, _, ok := runtime.Caller(2)
	if !ok {
		return "unknown"
	}
	name := runtime.FuncForPC(pc).Name() // "github.com/ratewindow/ratewindow/chimw.Limit"
	return name[strings.LastIndexByte(name, '/')+1:]
}
