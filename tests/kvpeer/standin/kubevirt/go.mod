// Stand-in for kubevirt.io/kubevirt: the packages migration-proxy.go imports; build-kvpeer
// adds the pinned pkg/virt-handler/migration-proxy.
module kubevirt.io/kubevirt

go 1.19

require kubevirt.io/client-go v0.0.0
