package doctor

import "github.com/vishvananda/netlink"

// netlinkNetnsMode asks the RDMA subsystem over netlink (RDMA_NLDEV_CMD_SYS_GET,
// what `rdma system show` prints).
func netlinkNetnsMode() (string, error) { return netlink.RdmaSystemGetNetnsMode() }
