// SPDX-License-Identifier: Apache-2.0
// Stand-in for kubevirt.io/kubevirt/pkg/util/net/ip: GetIPZeroAddress as KubeVirt's ("::", or
// "0.0.0.0" where /proc/sys/net/ipv6/conf/default/disable_ipv6 says 1 or cannot be read).

package ip

import (
	"net"
	"os"
)

const disableIPv6Path = "/proc/sys/net/ipv6/conf/default/disable_ipv6"

func GetIPZeroAddress() string {
	if isIPv6Disabled(disableIPv6Path) {
		return net.IPv4zero.String()
	}
	return net.IPv6zero.String()
}

func isIPv6Disabled(filename string) bool {
	data, err := os.ReadFile(filename)
	if err != nil {
		return true
	}
	return len(data) > 0 && data[0] == '1'
}
