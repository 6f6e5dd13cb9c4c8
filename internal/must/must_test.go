package must

import (
	"errors"
	"testing"
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
