// SPDX-License-Identifier: Apache-2.0
// Stand-in for kubevirt.io/kubevirt/pkg/ephemeral-disk-utils: UnsafeSetFileOwnership chowns to
// the QEMU user as KubeVirt's does (107:107, the "qemu" user of its images, unless the harness
// names another owner), and leaves a file that already has that owner alone.

package ephemeraldiskutils

import (
	"fmt"
	"os"
	"syscall"

	"kubevirt.io/kubevirt/pkg/util"
)

type OwnershipManagerInterface interface {
	UnsafeSetFileOwnership(file string) error
}

type OwnershipManager struct {
	UID, GID int
}

var DefaultOwnershipManager OwnershipManagerInterface = &OwnershipManager{
	UID: util.NonRootUID, GID: util.NonRootUID}

func (om *OwnershipManager) UnsafeSetFileOwnership(file string) error {
	fileInfo, err := os.Stat(file)
	if err != nil {
		return err
	}
	stat, ok := fileInfo.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("failed to convert stat info")
	}
	if om.UID == int(stat.Uid) && om.GID == int(stat.Gid) {
		return nil
	}
	return os.Chown(file, om.UID, om.GID)
}
