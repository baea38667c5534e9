// SPDX-License-Identifier: Apache-2.0
// The command line of stockpeer: one hand-written parser, because the agreed command line uses
// --key twice (the migration key, and after --tls the private key file), which no flag package
// can express.

package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Client names a stock target accepts by default: --migration-cn-types' binary default
// ["virt-handler", "migration"] (kubevirt-dropin.md §4).
var defaultClientCNs = []string{
	"kubevirt.io:system:client:migration",
	"kubevirt.io:system:client:virt-handler",
}

// The only name a stock source accepts from a target.
const defaultServerCN = "kubevirt.io:system:node:virt-handler"

// KubeVirt's non-root QEMU user (pkg/util/util.go NonRootUID), the source sockets' owner.
const defaultOwner = 107

// The two ways of copying plain text between TCP and unix (see copyConns in peer.go).
const (
	copyGo126 = "go1.26"
	copyGo119 = "go1.19"
)

type socketArg struct {
	logical int
	path    string
}

type options struct {
	role       string // "target" or "source"
	key        string // the migration key (the VMI UID)
	sockets    []socketArg
	listenHost string
	advertise  string
	target     string // source: the KubeVirt target JSON
	dir        string // source: the base directory (migrationproxy/ goes under it)
	tls        bool
	cert       string
	tlsKey     string
	ca         string
	clientCNs  []string
	serverCN   string
	minTLS     uint16
	uid, gid   int
	copyMode   string
}

const usage = `stockpeer: a stock KubeVirt migration proxy (virt-handler's migration-proxy.go) for tests
and benchmarks; one migration per process.

  stockpeer target --key K --socket LOGICAL=PATH [--socket ...] [--listen-host ADDR]
                   [--advertise ADDR] [--tls --cert F --key F --ca F [--client-cn CN,...]
                   [--min-tls 1.2|1.3]] [--copy go1.26|go1.19]
  stockpeer source --key K --target JSON --dir D [--tls --cert F --key F --ca F
                   [--server-cn CN]] [--socket-owner UID[:GID]] [--copy go1.26|go1.19]

target: one TCP listener per --socket on --listen-host (default :: , or 0.0.0.0 when
/proc/sys/net/ipv6/conf/default/disable_ipv6 is 1), port chosen by the kernel; prints one line
{"targetNodeAddress":A,"targetDirectMigrationNodePorts":{"<tcp port>":LOGICAL,...}}
(A: --advertise, else the listen host if it is an address, else the first global unicast
address of an interface that is up) and serves until SIGTERM or SIGINT. Each accepted
connection dials its unix PATH at once. A --socket without LOGICAL= takes KubeVirt's rule:
49152 or 49153 if PATH contains K-49152 or K-49153, else 0.
source: for each entry of JSON (the target's line; other fields are ignored) a unix listener at
D/migrationproxy/K[-LOGICAL]-source.sock (removed first; directory 0755; socket chowned to
--socket-owner, default 107:107); prints the socket paths one per line, sorted by logical port,
and serves until SIGTERM or SIGINT. Each accepted connection dials TARGETADDR:PORT.
--tls: mutual TLS as KubeVirt's: the target requires a client certificate from --ca whose CN is
in --client-cn (default kubevirt.io:system:client:migration,kubevirt.io:system:client:virt-handler),
the source presents --cert as its client certificate and accepts only --server-cn (default
kubevirt.io:system:node:virt-handler). After --tls, the first --key names the private key file
(--tls-key F says the same anywhere; --tls-cert and --tls-ca are accepted too).
--copy: go1.26 (default) copies plain TCP<->unix with splice(2) through a 1 MiB pipe in both
directions, as io.Copy does in the Go KubeVirt builds with; go1.19 is this toolchain's io.Copy
as it is (splice unix->TCP only; TCP->unix through a 32 KiB buffer). TLS is io.Copy either way.
One line per connection on stderr when its pair has ended: where it came from, what was
dialled, TLS version, cipher and peer name, which copy ended it, the bytes each way, the error.
`

// parseArgs reads the arguments after the role. It returns the options or an error that names
// the problem; "help" as the error's text means --help was asked for.
func parseArgs(role string, args []string) (*options, error) {
	o := &options{role: role, minTLS: tls.VersionTLS12, uid: defaultOwner, gid: defaultOwner,
		serverCN: defaultServerCN, copyMode: copyGo126}
	o.clientCNs = append([]string(nil), defaultClientCNs...)
	explicitTLSKey := false
	for _, a := range args {
		if a == "--tls-key" || strings.HasPrefix(a, "--tls-key=") {
			explicitTLSKey = true
		}
	}
	var keys []string
	sawTLS := false
	for i := 0; i < len(args); i++ {
		name, value, hasValue := strings.Cut(args[i], "=")
		if !strings.HasPrefix(name, "--") {
			return nil, fmt.Errorf("unexpected argument %q", args[i])
		}
		switch name {
		case "--help", "-h":
			return nil, errors.New("help")
		case "--tls":
			if hasValue {
				return nil, errors.New("--tls takes no value")
			}
			o.tls, sawTLS = true, true
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				return nil, fmt.Errorf("%s needs a value", name)
			}
			i++
			value = args[i]
		}
		switch name {
		case "--key":
			if sawTLS && !explicitTLSKey && o.tlsKey == "" {
				o.tlsKey = value
			} else {
				keys = append(keys, value)
			}
		case "--tls-key":
			o.tlsKey = value
		case "--cert", "--tls-cert":
			o.cert = value
		case "--ca", "--tls-ca":
			o.ca = value
		case "--socket":
			s, err := parseSocket(value)
			if err != nil {
				return nil, err
			}
			o.sockets = append(o.sockets, s)
		case "--listen-host":
			o.listenHost = strings.Trim(value, "[]")
		case "--advertise":
			o.advertise = strings.Trim(value, "[]")
		case "--target":
			o.target = value
		case "--dir":
			o.dir = value
		case "--client-cn":
			o.clientCNs = splitList(value)
		case "--server-cn":
			o.serverCN = value
		case "--min-tls":
			v, err := parseTLSVersion(value)
			if err != nil {
				return nil, err
			}
			o.minTLS = v
		case "--socket-owner":
			uid, gid, err := parseOwner(value)
			if err != nil {
				return nil, err
			}
			o.uid, o.gid = uid, gid
		case "--copy":
			if value != copyGo126 && value != copyGo119 {
				return nil, fmt.Errorf("--copy %q: go1.26 or go1.19", value)
			}
			o.copyMode = value
		default:
			return nil, fmt.Errorf("unknown option %s", name)
		}
	}
	if len(keys) != 1 {
		return nil, fmt.Errorf("exactly one migration --key is needed, got %d %q", len(keys), keys)
	}
	o.key = keys[0]
	return o, o.check()
}

func (o *options) check() error {
	if o.key == "" {
		return errors.New("--key: empty migration key")
	}
	if o.tls {
		if o.cert == "" || o.tlsKey == "" || o.ca == "" {
			return errors.New("--tls needs --cert, --key (after --tls) and --ca")
		}
	} else if o.cert != "" || o.tlsKey != "" || o.ca != "" {
		return errors.New("--cert, --key FILE and --ca only go with --tls")
	}
	switch o.role {
	case "target":
		if len(o.sockets) == 0 {
			return errors.New("target: at least one --socket LOGICAL=PATH")
		}
		if o.target != "" || o.dir != "" {
			return errors.New("target: --target and --dir are source options")
		}
		for i := range o.sockets {
			if o.sockets[i].logical < 0 {
				o.sockets[i].logical = logicalPortOf(o.key, o.sockets[i].path)
			}
		}
		if len(o.clientCNs) == 0 {
			return errors.New("--client-cn: no name")
		}
	case "source":
		if o.target == "" || o.dir == "" {
			return errors.New("source: --target JSON and --dir D are needed")
		}
		if len(o.sockets) != 0 || o.listenHost != "" || o.advertise != "" {
			return errors.New("source: --socket, --listen-host and --advertise are target options")
		}
	default:
		return fmt.Errorf("unknown role %q", o.role)
	}
	return nil
}

// parseSocket reads LOGICAL=PATH, or PATH alone (logical -1: decided by logicalPortOf once the
// key is known).
func parseSocket(v string) (socketArg, error) {
	if before, after, ok := strings.Cut(v, "="); ok {
		if n, err := strconv.Atoi(before); err == nil {
			if n < 0 || n > 65535 {
				return socketArg{}, fmt.Errorf("--socket %q: logical port out of range", v)
			}
			if after == "" {
				return socketArg{}, fmt.Errorf("--socket %q: no path", v)
			}
			return socketArg{logical: n, path: after}, nil
		}
	}
	if v == "" {
		return socketArg{}, errors.New("--socket: empty path")
	}
	return socketArg{logical: -1, path: v}, nil
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// parseTLSVersion takes 1.2/1.3 and KubeVirt's VersionTLS12/VersionTLS13 (1.0/1.1 refused: no
// test needs them, and Go's defaults say why not).
func parseTLSVersion(v string) (uint16, error) {
	switch v {
	case "1.2", "VersionTLS12":
		return tls.VersionTLS12, nil
	case "1.3", "VersionTLS13":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("--min-tls %q: 1.2 or 1.3", v)
}

func parseOwner(v string) (int, int, error) {
	u, g, hasGID := strings.Cut(v, ":")
	uid, err := strconv.Atoi(u)
	if err != nil || uid < 0 {
		return 0, 0, fmt.Errorf("--socket-owner %q: UID[:GID] in numbers", v)
	}
	gid := uid
	if hasGID {
		if gid, err = strconv.Atoi(g); err != nil || gid < 0 {
			return 0, 0, fmt.Errorf("--socket-owner %q: UID[:GID] in numbers", v)
		}
	}
	return uid, gid, nil
}
