// SPDX-License-Identifier: Apache-2.0
// KubeVirt up to v1.9: NewMigrationProxyManager(server, old client, migration client, config); a
// source falls back to the old client config when the migration one's handshake fails.

//go:build kvpeer_oldclient

package main

import (
	"crypto/tls"

	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"
	migrationproxy "kubevirt.io/kubevirt/pkg/virt-handler/migration-proxy"
)

const oldClientFallback = true

func newManager(server, oldClient, migration *tls.Config,
	config *virtconfig.ClusterConfig) migrationproxy.ProxyManager {
	return migrationproxy.NewMigrationProxyManager(server, oldClient, migration, config)
}
