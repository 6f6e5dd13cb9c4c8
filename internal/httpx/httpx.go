// Package httpx holds the small HTTP text helpers that keyfuncs, core and
// nethttp share, so that each exists once.
package httpx

import "strings"

// TrimOWS removes the optional white space of RFC 9110 (spaces and tabs)
// around s.
func TrimOWS(s string) string { return strings.Trim(s, " \t") }

// StripMethod removes the "METHOD " part of an [http.ServeMux] pattern:
// "GET /users/{id}" gives "/users/{id}"; a pattern without a space or a
// tab is returned unchanged.
func StripMethod(pattern string) string {
	if i := strings.IndexAny(pattern, " \t"); i >= 0 {
		return strings.TrimLeft(pattern[i:], " \t")
	}
	return pattern
}
