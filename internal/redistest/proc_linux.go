//go:build linux

package redistest

import (
	"os/exec"
	"syscall"
)

// setProcAttr puts the child in its own process group, so that killGroup also
// reaches what it forks, and has the kernel kill it when the test binary dies
// (a panic, a -timeout, SIGKILL) before Main or t.Cleanup could stop it.
// Pdeathsig follows the thread that started the child; the Go runtime does not
// end its threads while the program runs unless a goroutine exits locked to one,
// which nothing in a test binary's start path does.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup sends SIGKILL to the child's process group.
func killGroup(cmd *exec.Cmd) {
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}
