package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestGoLines: comments, blank lines and rewrapped comments count
// nothing; code lines count once each, a raw string each line it spans.
func TestGoLines(t *testing.T) {
	src := "// Package p.\npackage p\n\n/* a\nblock */\n\n// f does.\nfunc f() int { // trailing\n\treturn len(`a\nb`)\n}\n"
	n, err := goLines("p.go", []byte(src))
	if err != nil || n != 5 { // package, func, return and the raw string's 2nd line, }
		t.Fatalf("goLines = %d, %v, want 5", n, err)
	}
	rewrapped := strings.Replace(src, "// f does.", "// f\n// does.\n\n", 1)
	if m, _ := goLines("p.go", []byte(rewrapped)); m != n {
		t.Fatalf("rewrapping a comment changed the count: %d, want %d", m, n)
	}
	if _, err := goLines("bad.go", []byte("package p\nvar s = \"open\n")); err == nil {
		t.Fatal("a file that does not scan was counted")
	}
}

func TestLuaLines(t *testing.T) {
	if n := luaLines([]byte("-- a comment\n\nlocal x = 1 -- why\n  -- more\nreturn x\n")); n != 2 {
		t.Fatalf("luaLines = %d, want 2", n)
	}
}

// TestRun counts the repository's engine from its root.
func TestRun(t *testing.T) {
	t.Chdir("../..")
	var out bytes.Buffer
	if err := run(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"core/limiter.go", "core/internal/redisstore/transport.go", "Go code lines of the engine", "Lua code lines"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	for _, not := range []string{"core/rule.go", "_test.go"} {
		if strings.Contains(out.String(), not) {
			t.Errorf("%q counted:\n%s", not, out.String())
		}
	}
}
