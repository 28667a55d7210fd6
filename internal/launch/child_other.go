//go:build !linux

package launch

import "syscall"

// dieWithParent does nothing: the parent-death signal is Linux's, where the tests and CI
// run; elsewhere a child may outlive a parent killed before it stopped the child.
func dieWithParent(*syscall.SysProcAttr) {}
