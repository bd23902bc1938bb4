//go:build !linux

package doctor

import (
	"fmt"
	"runtime"
)

func netlinkNetnsMode() (string, error) {
	return "", fmt.Errorf("RDMA netlink does not exist on %s", runtime.GOOS)
}
