// SPDX-License-Identifier: Apache-2.0
// stockpeer: KubeVirt's stock migration proxy (virt-handler's migration-proxy.go), rebuilt from
// ../shared/reference/kubevirt-dropin.md §5 so that vmigd's tests and bench can put it on either
// end of a migration. One migration (key) per process; not a ProxyManager (no cache, no
// idempotent restarts, no certificate rotation). Standard library only.

package main

import (
	"fmt"
	"log"
	"os"
	"os/signal"
	"runtime"
	"syscall"
)

type role interface {
	describe() []string
	serve()
	stopListening()
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 || (args[0] != "target" && args[0] != "source") {
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
			fmt.Print(usage)
			return 0
		}
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	o, err := parseArgs(args[0], args[1:])
	if err != nil {
		if err.Error() == "help" {
			fmt.Print(usage)
			return 0
		}
		fmt.Fprintf(os.Stderr, "stockpeer %s: %v\n", args[0], err)
		return 2
	}
	logger := log.New(os.Stderr, "stockpeer "+o.role+": ", log.LstdFlags|log.Lmicroseconds)
	p := newPeer(o.role, o.key, o.copyMode, logger)
	// Signals first: a SIGTERM that arrives once the line is printed must find the handler.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	var r role
	var out []string
	switch o.role {
	case "target":
		t, err := newTarget(o, p)
		if err != nil {
			logger.Printf("key %s: %v", o.key, err)
			return 1
		}
		r, out = t, []string{t.info.marshal()}
	case "source":
		s, err := newSource(o, p)
		if err != nil {
			logger.Printf("key %s: %v", o.key, err)
			return 1
		}
		r, out = s, s.paths()
	}
	logger.Printf("key %s: %s, copy %s, pid %d", o.key, runtime.Version(), o.copyMode,
		os.Getpid())
	for _, line := range r.describe() {
		logger.Printf("key %s: %s", o.key, line)
	}
	r.serve()
	for _, line := range out {
		fmt.Println(line)
	}
	sig := <-sigs
	logger.Printf("key %s: %v: closing the listeners; pairs in flight end now", o.key, sig)
	r.stopListening()
	p.shutdown()
	logger.Printf("key %s: %d connections in all; exit", o.key, p.seq.Load())
	return 0
}
