module vmigd/contrib/kubevirt

go 1.19
