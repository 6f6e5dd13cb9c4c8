//go:build unix && !linux

package redistest

import (
	"os/exec"
	"syscall"
)

// setProcAttr puts the child in its own process group, so that killGroup also
// reaches what it forks.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// killGroup sends SIGKILL to the child's process group.
func killGroup(cmd *exec.Cmd) {
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}
