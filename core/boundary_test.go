package core

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// policyFiles are core's HTTP and policy files: rules, deciders and their
// answers. Every other non-test file of the package is the engine (the
// Limiter down to the store).
var policyFiles = []string{
	"charges.go",   // Charges: stacked rules' settlement
	"errlog.go",    // the rules' default OnError
	"http.go",      // header fields and answers
	"limitsets.go", // LimitsFor's validated sets
	"outbound.go",  // Decider.Throttle and Refused
	"policy.go",    // Policy, Decider, Decision, Verdict
	"rule.go",      // Rule, Enforcer, HeaderStyle
	"published.go", // RuleInfo, Publish, TopDenied
	"status.go",    // the status of a response (CountIf)
}

// TestEngineNamesNoPolicy: no engine file names a declaration of a policy
// file (Rule, Enforcer, Policy, Decider, Decision, Verdict, HeaderStyle,
// headerSet, ...), so the engine builds and reads without the policy.
func TestEngineNamesNoPolicy(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	parsed := map[string]*ast.File{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		parsed[name] = f
	}
	policy := map[string]string{} // a policy file's top-level name → its file
	for _, name := range policyFiles {
		f, ok := parsed[name]
		if !ok {
			t.Fatalf("policy file %s is gone: update policyFiles", name)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					policy[d.Name.Name] = name
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						policy[s.Name.Name] = name
					case *ast.ValueSpec:
						for _, n := range s.Names {
							policy[n.Name] = name
						}
					}
				}
			}
		}
	}
	for _, want := range []string{"Rule", "Enforcer", "Policy", "Decider", "Decision", "Verdict", "HeaderStyle", "Charges", "Outbound"} {
		if _, ok := policy[want]; !ok {
			t.Fatalf("%s is declared in no policy file: update policyFiles", want)
		}
	}
	var engine []string
	for name := range parsed {
		if !slices.Contains(policyFiles, name) {
			engine = append(engine, name)
		}
	}
	slices.Sort(engine)
	for _, name := range engine {
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(src), `"net/http"`) {
			t.Errorf("engine file %s imports net/http", name)
		}
		walk(t, fset, parsed[name], policy)
	}
	t.Logf("engine files: %v", engine)
}

// walk reports every identifier under n that names a declaration of a
// policy file: not a field or method name (x.Name, Name: in a literal, a
// field's or a parameter's own name), which is no top-level name.
func walk(t *testing.T, fset *token.FileSet, n ast.Node, policy map[string]string) {
	t.Helper()
	ast.Inspect(n, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			walk(t, fset, n.X, policy)
			return false
		case *ast.KeyValueExpr:
			walk(t, fset, n.Value, policy)
			return false
		case *ast.Field:
			walk(t, fset, n.Type, policy)
			return false
		case *ast.Ident:
			if file, found := policy[n.Name]; found {
				t.Errorf("%s names %s, a declaration of the policy file %s", fset.Position(n.Pos()), n.Name, file)
			}
		}
		return true
	})
}
