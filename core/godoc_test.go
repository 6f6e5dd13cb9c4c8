package core

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestGoDocSpeaksToUsers: the documentation of core's exported names
// (what go doc shows) names no source file of the engine: those are for
// contributors, in comments that go doc does not show.
func TestGoDocSpeaksToUsers(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	files := []*ast.File{}
	for _, f := range pkgs["core"].Files {
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, "github.com/ratewindow/ratewindow/core")
	if err != nil {
		t.Fatal(err)
	}
	source := regexp.MustCompile(`\b[a-z_]+\.go\b`)
	check := func(name, text string) {
		if m := source.FindString(text); m != "" {
			t.Errorf("go doc of %s names the source file %s", name, m)
		}
	}
	check("package core", p.Doc)
	for _, f := range p.Funcs {
		check(f.Name, f.Doc)
	}
	for _, v := range append(p.Consts, p.Vars...) {
		check(strings.Join(v.Names, ", "), v.Doc)
	}
	for _, typ := range p.Types {
		check(typ.Name, typ.Doc)
		for _, f := range append(typ.Funcs, typ.Methods...) {
			check(typ.Name+"."+f.Name, f.Doc)
		}
		for _, v := range append(typ.Consts, typ.Vars...) {
			check(strings.Join(v.Names, ", "), v.Doc)
		}
	}
}

// TestEngineLayers: the layering is a fact of the imports. The engine
// beneath core (the seam and both backends) imports no net/http, the seam
// no backend, and neither backend the other.
func TestEngineLayers(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./internal/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/ratewindow/ratewindow/core/internal/"
	forbidden := map[string][]string{
		mod + "store":      {"net/http", mod + "memstore", mod + "redisstore"},
		mod + "memstore":   {"net/http", mod + "redisstore"},
		mod + "redisstore": {"net/http", mod + "memstore"},
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		deps[f[0]] = f[1:]
	}
	var reach func(pkg string, seen map[string]bool)
	reach = func(pkg string, seen map[string]bool) {
		for _, d := range deps[pkg] {
			if !seen[d] {
				seen[d] = true
				reach(d, seen)
			}
		}
	}
	for pkg, bad := range forbidden {
		seen := map[string]bool{}
		reach(pkg, seen)
		for _, b := range bad {
			if seen[b] {
				t.Errorf("%s imports %s", pkg, b)
			}
		}
	}
}
