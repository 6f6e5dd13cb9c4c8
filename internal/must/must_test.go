package must

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ratewindow/ratewindow/core"
)

var errBad = errors.New("ratewindow: bad rule")

func limit(err error) int { return Build(42, err) }

func TestBuild(t *testing.T) {
	if got := limit(nil); got != 42 {
		t.Fatalf("Build = %d, want 42", got)
	}
	defer func() {
		err, _ := recover().(error)
		if !errors.Is(err, errBad) || err.Error() != "ratewindow: bad rule (must.limit)" {
			t.Fatalf("panic %v, want the error named after its caller", err)
		}
	}()
	limit(errBad)
}

// byIP stands for an adapter's LimitByIP: ByIP names the rule after its
// caller's line.
func byIP(l *core.Limiter) core.Rule { return ByIP(l, 5, time.Minute) }

// TestByIPNamedByCallSite: a one-liner's rule is named after its limit and
// the line that called the adapter (file's directory and name, not the
// build machine's path), two lines give two names, and the name is valid
// however long or odd the file's name.
func TestByIPNamedByCallSite(t *testing.T) {
	l := core.NewMemory()
	_, _, line, _ := runtime.Caller(0)
	a := byIP(l)
	b := byIP(l)
	if want := fmt.Sprintf("ip-5-per-1m@must/must_test.go#%d", line+1); a.Name != want {
		t.Fatalf("name %q, want %q", a.Name, want)
	}
	if a.Name == b.Name {
		t.Fatalf("two call sites share the name %q", a.Name)
	}
	for _, tc := range []struct {
		file string
		line int
		room int
		want string
	}{
		{"/home/ci/src/api/routes.go", 42, 50, "api/routes.go#42"},
		{"/tmp/build-1/api/routes.go", 42, 50, "api/routes.go#42"}, // the same code built elsewhere
		{"/x/a very:odd{dir}/é.go", 7, 50, "a_very_odd_dir_/_.go#7"},
		{"/x/" + strings.Repeat("d", 40) + "/routes.go", 42, 20, "routes.go#42"},
		{"/x/d/" + strings.Repeat("f", 40) + ".go", 42, 20, "#42"},
	} {
		if got := callSite(tc.file, tc.line, tc.room); got != tc.want {
			t.Errorf("callSite(%q, %d, %d) = %q, want %q", tc.file, tc.line, tc.room, got, tc.want)
		}
		r := core.ByIP(5, time.Minute)
		r.Name += "@" + callSite(tc.file, tc.line, maxName-len(r.Name)-1)
		if err := r.Validate(); err != nil {
			t.Errorf("%s: %v", tc.file, err)
		}
	}
	long := core.ByIP(core.MaxLogCount, core.MaxWindow-time.Millisecond)
	long.Name += "@" + callSite("/x/"+strings.Repeat("d", 60)+"/"+strings.Repeat("f", 60)+".go", 123456, maxName-len(long.Name)-1)
	if err := long.Validate(); err != nil {
		t.Errorf("the longest limit's name: %v", err)
	}
}
