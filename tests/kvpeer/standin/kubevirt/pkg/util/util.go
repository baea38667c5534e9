// SPDX-License-Identifier: Apache-2.0
// Stand-in for kubevirt.io/kubevirt/pkg/util: MkdirAllWithNosec as KubeVirt's (os_helper.go).

package util

import "os"

// NonRootUID is KubeVirt's non-root QEMU user, the owner of the source sockets.
const NonRootUID = 107

func MkdirAllWithNosec(pathName string) error {
	return os.MkdirAll(pathName, 0755)
}
