// KubeVirt's pinned files are not part of module vmigd/contrib/kubevirt: this file keeps them out
// of its `go vet ./...` and `go test ./...` (they import KubeVirt's and Kubernetes' modules, which
// are not here). make-patch compiles them against stand-ins for those.
module kubevirt.io/vmigd-pinned-upstream

go 1.19
