package launch

import "syscall"

// dieWithParent asks the kernel to kill the child when its parent dies.
func dieWithParent(attr *syscall.SysProcAttr) {
	attr.Pdeathsig = syscall.SIGKILL
}
