// SPDX-License-Identifier: Apache-2.0
// Stand-in for kubevirt.io/kubevirt/pkg/virt-config: a ClusterConfig whose migration
// configuration has only DisableTLS (KubeVirt's migrations.disableTLS), set by the harness.

package virtconfig

type MigrationConfiguration struct {
	DisableTLS *bool `json:"disableTLS,omitempty"`
}

type ClusterConfig struct {
	migration MigrationConfiguration
}

// NewClusterConfig is a config whose migrations.disableTLS is disableTLS.
func NewClusterConfig(disableTLS bool) *ClusterConfig {
	return &ClusterConfig{migration: MigrationConfiguration{DisableTLS: &disableTLS}}
}

func (c *ClusterConfig) GetMigrationConfiguration() *MigrationConfiguration {
	return &c.migration
}
