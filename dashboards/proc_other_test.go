//go:build !linux

package dashboards

import "os/exec"

// setProcAttr does nothing here: t.Cleanup stops the child.
func setProcAttr(*exec.Cmd) {}
