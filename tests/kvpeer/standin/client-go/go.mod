module kubevirt.io/client-go

go 1.19
