// SPDX-License-Identifier: Apache-2.0
// KubeVirt's names and forms as migration-proxy.go has them: socket names, the logical-port
// rule, the published port map, the wildcard address. Pure functions, unit-tested.

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// The logical ports that name sockets (LibvirtDirectMigrationPort, LibvirtBlockMigrationPort);
// 0 is libvirt's own connection. Nothing listens on them.
var migrationPortsRange = []int{49152, 49153}

// constructProxyKey is ConstructProxyKey: id, or id-PORT for a port other than 0.
func constructProxyKey(id string, port int) string {
	if port == 0 {
		return id
	}
	return id + "-" + strconv.Itoa(port)
}

// sourceSocketPath is SourceUnixFile(baseDir, ConstructProxyKey(key, logical)).
func sourceSocketPath(baseDir, key string, logical int) string {
	return filepath.Join(baseDir, "migrationproxy", constructProxyKey(key, logical)+"-source.sock")
}

// logicalPortOf is GetTargetListenerPorts' rule: a path containing KEY-49152 or KEY-49153 is
// that port, anything else (virtqemud's socket) is 0.
func logicalPortOf(key, path string) int {
	for _, port := range migrationPortsRange {
		if strings.Contains(path, constructProxyKey(key, port)) {
			return port
		}
	}
	return 0
}

// targetInfo is what a stock target publishes in the VMI's migration state.
type targetInfo struct {
	Address string         `json:"targetNodeAddress"`
	Ports   map[string]int `json:"targetDirectMigrationNodePorts"`
}

// marshal gives the one line the target prints (encoding/json sorts the map's keys).
func (t targetInfo) marshal() string {
	b, err := json.Marshal(t)
	if err != nil {
		panic(err) // a string and a map of ints always marshal
	}
	return string(b)
}

// sourceEntry is one listener a source makes from the target's map.
type sourceEntry struct {
	tcpPort string
	logical int
}

// parseTargetJSON reads the KubeVirt form; fields it does not know (vmigd adds key, tls...) are
// ignored, as a stock handler only reads these two. The entries come sorted by logical port,
// then TCP port.
func parseTargetJSON(text string) (string, []sourceEntry, error) {
	var t targetInfo
	dec := json.NewDecoder(strings.NewReader(text))
	if err := dec.Decode(&t); err != nil {
		return "", nil, fmt.Errorf("--target: %v", err)
	}
	if t.Address == "" {
		return "", nil, errors.New("--target: no targetNodeAddress")
	}
	if len(t.Ports) == 0 {
		return "", nil, errors.New("--target: no targetDirectMigrationNodePorts")
	}
	var out []sourceEntry
	for port, logical := range t.Ports {
		n, err := strconv.Atoi(port)
		if err != nil || n <= 0 || n > 65535 {
			return "", nil, fmt.Errorf("--target: %q is no TCP port", port)
		}
		if logical < 0 {
			return "", nil, fmt.Errorf("--target: logical port %d", logical)
		}
		out = append(out, sourceEntry{tcpPort: port, logical: logical})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].logical != out[j].logical {
			return out[i].logical < out[j].logical
		}
		a, _ := strconv.Atoi(out[i].tcpPort)
		b, _ := strconv.Atoi(out[j].tcpPort)
		return a < b
	})
	return strings.Trim(t.Address, "[]"), out, nil
}

// zeroAddress is ip.GetIPZeroAddress: "::" unless IPv6 is disabled in this network namespace.
func zeroAddress() string {
	b, err := os.ReadFile("/proc/sys/net/ipv6/conf/default/disable_ipv6")
	if err == nil && strings.TrimSpace(string(b)) == "1" {
		return "0.0.0.0"
	}
	return "::"
}

// advertiseAddress: the given one, else the listen host if it is a specific address, else the
// first global unicast address of an interface that is up (FindMigrationIP's test).
func advertiseAddress(advertise, listenHost string) (string, error) {
	if advertise != "" {
		return advertise, nil
	}
	if ip := net.ParseIP(listenHost); ip != nil && !ip.IsUnspecified() {
		return ip.String(), nil
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := i.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.IsGlobalUnicast() {
				return n.IP.String(), nil
			}
		}
	}
	return "", errors.New("no global unicast address on any interface that is up (give --advertise)")
}
