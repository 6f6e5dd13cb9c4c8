//go:build linux

package dashboards

import (
	"os/exec"
	"syscall"
)

// setProcAttr has the kernel kill the child when the test binary dies (a
// panic, a -timeout) before t.Cleanup could stop it.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
