package cni

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// linuxOps are the plugin's kernel operations over RDMA and route netlink.
type linuxOps struct{}

func (linuxOps) NetnsMode() (string, error) { return netlink.RdmaSystemGetNetnsMode() }

// handle opens a netlink handle of one family (unix.NETLINK_RDMA,
// unix.NETLINK_ROUTE) in the namespace at path ("" = ours). The family
// must be named: a handle's default families do not include RDMA, and
// its requests for another family fail.
func handle(path string, family int) (*netlink.Handle, error) {
	if path == "" {
		return netlink.NewHandle(family)
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	defer ns.Close()
	return netlink.NewHandleAt(ns, family)
}

func (linuxOps) InNetns(dev, path string) (bool, error) {
	h, err := handle(path, unix.NETLINK_RDMA)
	if err != nil {
		return false, err
	}
	defer h.Close()
	links, err := h.RdmaLinkList()
	if err != nil {
		return false, err
	}
	for _, l := range links {
		if l.Attrs.Name == dev {
			return true, nil
		}
	}
	return false, nil
}

func (linuxOps) PCIOfLink(ifname, path string) (string, error) {
	h, err := handle(path, unix.NETLINK_ROUTE)
	if err != nil {
		return "", err
	}
	defer h.Close()
	l, err := h.LinkByName(ifname)
	if err != nil {
		return "", err
	}
	if a := l.Attrs(); a.ParentDevBus == "pci" {
		return a.ParentDev, nil
	}
	return "", nil
}

func (linuxOps) Move(dev, from, to string) error {
	h, err := handle(from, unix.NETLINK_RDMA)
	if err != nil {
		return err
	}
	defer h.Close()
	link, err := h.RdmaLinkByName(dev)
	if err != nil {
		return fmt.Errorf("RDMA device %s: %w", dev, err)
	}
	var target netns.NsHandle
	if to == "" {
		target, err = netns.Get()
	} else {
		target, err = netns.GetFromPath(to)
	}
	if err != nil {
		return err
	}
	defer target.Close()
	if int(target) < 0 {
		return errors.New("no namespace handle")
	}
	return h.RdmaLinkSetNsFd(link, uint32(target))
}
