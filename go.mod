module github.com/rdmakit/rdmakit

go 1.26.8

require (
	github.com/vishvananda/netlink v1.3.1
	go.uber.org/goleak v1.3.0
	golang.org/x/sys v0.50.0
)

require github.com/vishvananda/netns v0.0.5 // indirect
