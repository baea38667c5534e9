// SPDX-License-Identifier: Apache-2.0
// What this package needs from KubeVirt's migrationproxy package, copied so that it compiles on its
// own with the standard library. Not vendored into KubeVirt: there these names already exist.

package vmigdproxy

import (
	"fmt"
	"path/filepath"
)

// ProxyManager mirrors pkg/virt-handler/migration-proxy/migration-proxy.go:48-60 at kubevirt
// d923fdb8 (unchanged since v1.4.0): the method set virt-handler calls. *VmigdProxyManager
// implements it.
type ProxyManager interface {
	StartTargetListener(key string, targetUnixFiles []string) error
	GetTargetListenerPorts(key string) map[string]int
	StopTargetListener(key string)

	StartSourceListener(key string, targetAddress string, destSrcPortMap map[string]int, baseDir string) error
	GetSourceListenerFiles(key string) []string
	StopSourceListener(key string)

	OpenListenerCount() int

	InitiateGracefulShutdown()
}

// The logical ports, as migration-proxy.go:41-46 names them: QEMU's stream and NBD. Nothing listens
// on these numbers; they name sockets and label the port map. Port 0 is libvirt's connection.
const (
	LibvirtDirectMigrationPort = 49152
	LibvirtBlockMigrationPort  = 49153
)

// ConstructProxyKey is migration-proxy.go's: the key, or KEY-PORT for a port other than 0.
func ConstructProxyKey(id string, port int) string {
	key := id
	if port != 0 {
		key += fmt.Sprintf("-%d", port)
	}
	return key
}

// SourceUnixFile is migration-proxy.go's: BASEDIR/migrationproxy/KEY-source.sock.
func SourceUnixFile(baseDir string, key string) string {
	return filepath.Join(baseDir, "migrationproxy", key+"-source.sock")
}
