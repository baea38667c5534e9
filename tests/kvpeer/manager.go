// SPDX-License-Identifier: Apache-2.0
// KubeVirt main (after v1.9): NewMigrationProxyManager(server, migration client, config); no
// old client config.

//go:build !kvpeer_oldclient

package main

import (
	"crypto/tls"

	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"
	migrationproxy "kubevirt.io/kubevirt/pkg/virt-handler/migration-proxy"
)

const oldClientFallback = false

func newManager(server, _, migration *tls.Config,
	config *virtconfig.ClusterConfig) migrationproxy.ProxyManager {
	return migrationproxy.NewMigrationProxyManager(server, migration, config)
}
