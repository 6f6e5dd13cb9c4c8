//go:build !unix

package redistest

import "os/exec"

// setProcAttr does nothing where there are no process groups.
func setProcAttr(*exec.Cmd) {}

// killGroup kills the child.
func killGroup(cmd *exec.Cmd) {
	_ = cmd.Process.Kill()
}
