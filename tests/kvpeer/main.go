// SPDX-License-Identifier: Apache-2.0
// kvpeer: KubeVirt's own migration-proxy.go of one pinned release (compiled in by build-kvpeer)
// run for one migration behind tests/stockpeer's command line and output (its args.go and
// kubevirt.go are compiled in too): KubeVirt's real code on either end of a test migration.

package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"kubevirt.io/client-go/log"
	diskutils "kubevirt.io/kubevirt/pkg/ephemeral-disk-utils"
	"kubevirt.io/kubevirt/pkg/util/net/ip"
	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"
	migrationproxy "kubevirt.io/kubevirt/pkg/virt-handler/migration-proxy"
)

// kubevirtVersion: the folder of contrib/kubevirt/upstream this binary was built from (set by
// build-kvpeer with -ldflags -X).
var kubevirtVersion = "unknown"

// How long the copies of the pairs in flight get, after the listeners stopped, to log their
// byte counts before the process exits.
const stopLinger = 200 * time.Millisecond

const kvUsage = `kvpeer: KubeVirt's own migration proxy (virt-handler's migration-proxy.go of one KubeVirt
release, built in) for one migration, with the command line and output of tests/stockpeer.

  kvpeer target --key K --socket LOGICAL=PATH [--socket ...] [--advertise ADDR]
                [--tls --cert F --key F --ca F [--client-cn CN,...] [--min-tls 1.2|1.3]]
  kvpeer source --key K --target JSON --dir D [--tls --cert F --key F --ca F
                [--server-cn CN] [--old-client-cert F --old-client-key F]]
                [--socket-owner UID[:GID]]

target: StartTargetListener(K, the paths) then GetTargetListenerPorts(K): KubeVirt's code listens
on the zero address ("::", or "0.0.0.0" where IPv6 is disabled; --listen-host may only name that)
and takes the logical port from the path (49152 or 49153 when it contains K-49152 or K-49153, else
0); where LOGICAL= says otherwise, KubeVirt's code is given a symbolic link named for LOGICAL in a
private directory. Prints {"targetNodeAddress":A,"targetDirectMigrationNodePorts":{...}} (A:
--advertise, else the first global unicast address of an interface that is up).
source: StartSourceListener(K, JSON's address, JSON's map, D); prints the socket paths
(D/migrationproxy/K[-LOGICAL]-source.sock) sorted by logical port. Sockets chowned to
--socket-owner (default 107:107, KubeVirt's qemu user).
--tls: KubeVirt's TLS (pkg/util/tls) from these files; without it migrations.disableTLS is true.
The old client config of KubeVirt up to v1.9 (the fallback when the migration certificate's
handshake fails) is --old-client-cert/--old-client-key, else the migration pair. --copy is
accepted and ignored: KubeVirt's code copies with io.Copy as this Go toolchain builds it.
Both run until SIGTERM or SIGINT, then Stop{Target,Source}Listener(K).
Standard error: KubeVirt's log lines (JSON, component virt-handler, pos migration-proxy.go:N),
among them per connection "N bytes copied from inbound to outbound" and "N bytes copied outbound
to inbound" as each copy ends; and kvpeer's own (component kvpeer): start, one "tls handshake"
line per completed handshake (config, tls, cipher, peer), exit.
`

func main() {
	os.Exit(run(os.Args[1:]))
}

// takeOldClient removes --old-client-cert F and --old-client-key F (which stockpeer's parser
// does not know) from args.
func takeOldClient(args []string) ([]string, string, string, error) {
	var out []string
	var cert, key string
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--old-client-cert", "--old-client-key":
			if i+1 >= len(args) {
				return nil, "", "", fmt.Errorf("%s needs a value", args[i])
			}
			if args[i] == "--old-client-cert" {
				cert = args[i+1]
			} else {
				key = args[i+1]
			}
			i++
		default:
			out = append(out, args[i])
		}
	}
	if (cert == "") != (key == "") {
		return nil, "", "", errors.New("--old-client-cert and --old-client-key go together")
	}
	return out, cert, key, nil
}

func run(args []string) int {
	if len(args) == 0 || (args[0] != "target" && args[0] != "source") {
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
			fmt.Print(kvUsage)
			return 0
		}
		fmt.Fprint(os.Stderr, kvUsage)
		return 2
	}
	rest, oldCert, oldKey, err := takeOldClient(args[1:])
	var o *options
	if err == nil {
		o, err = parseArgs(args[0], rest)
	}
	if err == nil && oldCert != "" && (!o.tls || o.role != "source") {
		err = errors.New("--old-client-cert: a TLS source's option")
	}
	if err != nil {
		if err.Error() == "help" {
			fmt.Print(kvUsage)
			return 0
		}
		fmt.Fprintf(os.Stderr, "kvpeer %s: %v\n", args[0], err)
		return 2
	}
	hl := log.Log.With("component", "kvpeer", "role", o.role, "uid", o.key)
	fail := func(err error) int {
		hl.Reason(err).Error("cannot start")
		return 1
	}
	diskutils.DefaultOwnershipManager = &diskutils.OwnershipManager{UID: o.uid, GID: o.gid}
	var server, oldClient, migration *tls.Config
	if o.tls {
		if oldCert == "" {
			oldCert, oldKey = o.cert, o.tlsKey
		}
		if server, err = serverConfig(o.cert, o.tlsKey, o.ca, o.clientCNs, o.minTLS, hl); err != nil {
			return fail(err)
		}
		if migration, err = clientConfig(o.cert, o.tlsKey, o.ca, o.serverCN, "migration", hl); err != nil {
			return fail(err)
		}
		if oldClient, err = clientConfig(oldCert, oldKey, o.ca, o.serverCN, "old-client", hl); err != nil {
			return fail(err)
		}
	}
	m := newManager(server, oldClient, migration, virtconfig.NewClusterConfig(!o.tls))
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	hl.Infof("KubeVirt %s migration-proxy.go, %s, tls %v, old client fallback %v, pid %d",
		kubevirtVersion, runtime.Version(), o.tls, oldClientFallback && o.tls, os.Getpid())

	var out []string
	var cleanup func()
	switch o.role {
	case "target":
		out, cleanup, err = startTarget(m, o, hl)
	case "source":
		out, err = startSource(m, o)
	}
	if cleanup != nil {
		defer cleanup()
	}
	if err != nil {
		return fail(err)
	}
	for _, line := range out {
		fmt.Println(line)
	}
	sig := <-sigs
	if o.role == "target" {
		m.StopTargetListener(o.key)
	} else {
		m.StopSourceListener(o.key)
	}
	time.Sleep(stopLinger)
	hl.Infof("%v: listeners stopped; exit", sig)
	return 0
}

// startTarget gives KubeVirt's code the paths (or links named for their logical port) and
// returns the target's line.
func startTarget(m migrationproxy.ProxyManager, o *options,
	hl *log.FilteredLogger) ([]string, func(), error) {
	zero := ip.GetIPZeroAddress()
	if o.listenHost != "" && o.listenHost != zero {
		return nil, nil, fmt.Errorf("--listen-host %s: KubeVirt's proxy listens on the zero "+
			"address, %s here", o.listenHost, zero)
	}
	var paths []string
	linkDir := ""
	cleanup := func() {
		if linkDir != "" {
			os.RemoveAll(linkDir)
		}
	}
	for _, s := range o.sockets {
		if logicalPortOf(o.key, s.path) == s.logical {
			paths = append(paths, s.path)
			continue
		}
		if s.logical != 0 && logicalPortOf(o.key, constructProxyKey(o.key, s.logical)) != s.logical {
			cleanup()
			return nil, nil, fmt.Errorf("--socket %d=%s: KubeVirt's proxy knows only the "+
				"logical ports 0, 49152 and 49153", s.logical, s.path)
		}
		if linkDir == "" {
			var err error
			if linkDir, err = os.MkdirTemp("", "kvpeer-"); err != nil {
				return nil, nil, err
			}
		}
		link := filepath.Join(linkDir, constructProxyKey(o.key, s.logical)+".sock")
		if err := os.Symlink(s.path, link); err != nil {
			cleanup()
			return nil, nil, err
		}
		hl.Infof("logical port %d: %s given to KubeVirt's code as %s", s.logical, s.path, link)
		paths = append(paths, link)
	}
	if err := m.StartTargetListener(o.key, paths); err != nil {
		cleanup()
		return nil, nil, err
	}
	addr, err := advertiseAddress(o.advertise, zero)
	if err != nil {
		m.StopTargetListener(o.key)
		cleanup()
		return nil, nil, err
	}
	info := targetInfo{Address: addr, Ports: m.GetTargetListenerPorts(o.key)}
	return []string{info.marshal()}, cleanup, nil
}

// startSource starts KubeVirt's source listeners from the target's line; the socket paths,
// sorted by logical port as stockpeer prints them.
func startSource(m migrationproxy.ProxyManager, o *options) ([]string, error) {
	addr, entries, err := parseTargetJSON(o.target)
	if err != nil {
		return nil, err
	}
	ports := map[string]int{}
	for _, e := range entries {
		ports[e.tcpPort] = e.logical
	}
	if err := m.StartSourceListener(o.key, addr, ports, o.dir); err != nil {
		return nil, err
	}
	made := map[string]bool{}
	for _, f := range m.GetSourceListenerFiles(o.key) {
		made[f] = true
	}
	var out []string
	for _, e := range entries {
		p := sourceSocketPath(o.dir, o.key, e.logical)
		if !made[p] {
			m.StopSourceListener(o.key)
			return nil, fmt.Errorf("KubeVirt's code made no %s (it made %v)", p, made)
		}
		out = append(out, p) // one line per entry, as stockpeer
	}
	return out, nil
}
