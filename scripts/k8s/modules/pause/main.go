// Command pause is the pod sandbox's process for Cordon's test cluster (scripts/k8s.sh): it
// holds the pod's namespaces, reaps the children a shared PID namespace gives it, and exits
// 0 on SIGINT or SIGTERM, as the Kubernetes pause image does. Built by
// scripts/setup.d/80-k8s.sh; put in the cluster's pause image by scripts/k8s.sh.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if os.Getpid() != 1 {
		os.Stderr.WriteString("pause: warning: not PID 1\n")
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
