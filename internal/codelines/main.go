// Command codelines counts the code lines of the engine: lines that hold
// code, neither blank nor only comment, so that deleting comments or
// rewrapping code does not change the reading. The files are an explicit
// list (engineFiles): core's Go files but the policy files (the HTTP and
// RPC policy: rules, headers, answers), and core/internal/{store,
// redisstore,memstore}, tests excluded; the Lua of redisstore is counted
// apart. Run it from the repository root:
//
//	go run ./internal/codelines
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/scanner"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// engineFiles are the globs of the engine's Go files; policyFiles are the
// files of core they match that hold the policy, not the engine.
var (
	engineFiles = []string{"core/*.go", "core/internal/store/*.go", "core/internal/redisstore/*.go", "core/internal/memstore/*.go"}
	policyFiles = []string{"core/errlog.go", "core/http.go", "core/limitsets.go", "core/policy.go", "core/rule.go", "core/status.go"}
	luaFiles    = "core/internal/redisstore/lua/*.lua"
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "codelines:", err)
		os.Exit(1)
	}
}

func run(w io.Writer) error {
	goFiles, err := expand(engineFiles, func(f string) bool {
		return strings.HasSuffix(f, "_test.go") || slices.Contains(policyFiles, f)
	})
	if err != nil {
		return err
	}
	lua, err := expand([]string{luaFiles}, func(string) bool { return false })
	if err != nil {
		return err
	}
	var goTotal, luaTotal int
	for _, f := range goFiles {
		src, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		n, err := goLines(f, src)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%6d  %s\n", n, f)
		goTotal += n
	}
	for _, f := range lua {
		src, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		n := luaLines(src)
		fmt.Fprintf(w, "%6d  %s\n", n, f)
		luaTotal += n
	}
	fmt.Fprintf(w, "%6d  Go code lines of the engine (%d files)\n%6d  Lua code lines (%d files)\n", goTotal, len(goFiles), luaTotal, len(lua))
	return nil
}

// expand returns the files the globs match, sorted, but those skip reports.
func expand(globs []string, skip func(string) bool) ([]string, error) {
	var files []string
	for _, g := range globs {
		m, err := filepath.Glob(g)
		if err != nil {
			return nil, err
		}
		if len(m) == 0 {
			return nil, fmt.Errorf("%s matches no file: run from the repository root", g)
		}
		for _, f := range m {
			if !skip(filepath.ToSlash(f)) {
				files = append(files, f)
			}
		}
	}
	slices.Sort(files)
	return files, nil
}

// goLines counts the lines of src on which a Go token starts, comments and
// the semicolons the scanner inserts at line ends excluded. A token over
// several lines (a raw string) counts each line it spans.
func goLines(name string, src []byte) (int, error) {
	fset := token.NewFileSet()
	file := fset.AddFile(name, -1, len(src))
	var s scanner.Scanner
	var errs scanner.ErrorList
	s.Init(file, src, func(pos token.Position, msg string) { errs.Add(pos, msg) }, 0)
	lines := map[int]bool{}
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		if tok == token.SEMICOLON && lit == "\n" {
			continue
		}
		first := file.Line(pos)
		last := first + strings.Count(lit, "\n")
		for l := first; l <= last; l++ {
			lines[l] = true
		}
	}
	if len(errs) > 0 {
		return 0, errors.Join(errs[0], errors.New(name))
	}
	return len(lines), nil
}

// luaLines counts the lines of src that are neither blank nor a comment
// alone ("-- ..."); the Lua here has no block comments.
func luaLines(src []byte) int {
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(src))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line != "" && !strings.HasPrefix(line, "--") {
			n++
		}
	}
	return n
}
