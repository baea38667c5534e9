// Stand-in for kubevirt.io/client-go: the log package migration-proxy.go imports.
module kubevirt.io/client-go

go 1.19
