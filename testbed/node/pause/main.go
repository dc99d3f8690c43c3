// Command pause is the pod sandbox ("pause") container of the test-only real node (testbed/realnode.py): it holds
// the pod's namespaces and sleeps until SIGTERM or SIGINT, like registry.k8s.io/pause, which we cannot pull
// here. Built statically by scripts/build-images.sh. As PID 1 of the sandbox it also reaps orphaned children.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
