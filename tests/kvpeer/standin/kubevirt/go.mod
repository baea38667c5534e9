module kubevirt.io/kubevirt

go 1.19

require kubevirt.io/client-go v0.0.0
