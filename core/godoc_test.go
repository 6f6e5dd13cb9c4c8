package core

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
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
