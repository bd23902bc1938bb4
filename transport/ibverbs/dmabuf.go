//go:build ibverbs

package ibverbs

import (
	"fmt"

	"github.com/rdmakit/rdmakit/verbs"
)

// DmabufMR is a memory region over a dma-buf: device memory exported by
// another driver, such as a CUDA allocation, registered for GPUDirect RDMA.
// The NIC reads and writes it directly; the CPU never maps it.
//
// UNTESTED: this compiles against rdma-core's ibv_reg_dmabuf_mr and is
// documented, but has never run here: it needs an RDMA NIC whose driver
// supports dma-buf (mlx5, efa, ...; rxe and siw do not) and a GPU whose
// driver exports dma-bufs. Treat it as a starting point.
type DmabufMR struct {
	c          *cMR
	iova       uint64
	length     int
	lkey, rkey uint32
}

// RegDmabufMR registers length bytes at offset of the dma-buf fd in pd
// (ibv_reg_dmabuf_mr). iova is the address the region has in work
// requests: local SGEs use Addr = iova + off with LKey, and peers use
// RemoteAddr = iova + off with RKey. pd must belong to an ibverbs device.
//
// With CUDA, export an allocation as a dma-buf with
// cuMemGetHandleForAddressRange(&fd, ptr, size,
// CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0), then call
// RegDmabufMR(pd, 0, size, uint64(ptr), fd, access). The allocation must
// be aligned to the GPU page size (64 KiB) and stay allocated until Dereg.
func RegDmabufMR(pd *verbs.PD, offset uint64, length int, iova uint64, fd int, access verbs.Access) (*DmabufMR, error) {
	p, ok := pd.Driver().(*pdT)
	if !ok {
		return nil, fmt.Errorf("%w: dma-buf registration needs a PD of an ibverbs device", verbs.ErrNotSupported)
	}
	if length <= 0 || fd < 0 {
		return nil, fmt.Errorf("%w: dma-buf fd %d, length %d", verbs.ErrInvalidArgument, fd, length)
	}
	c, err := p.c.regDmabufMR(offset, length, iova, fd, access)
	if err != nil {
		return nil, wrap(fmt.Sprintf("ibv_reg_dmabuf_mr(fd %d, offset %d, length %d) on %s (the NIC driver must support dma-buf; rxe and siw do not)",
			fd, offset, length, p.d.info.Name), err)
	}
	l, r := c.keys()
	return &DmabufMR{c: c, iova: iova, length: length, lkey: l, rkey: r}, nil
}

// LKey returns the local key.
func (m *DmabufMR) LKey() uint32 { return m.lkey }

// RKey returns the remote key.
func (m *DmabufMR) RKey() uint32 { return m.rkey }

// Addr returns the region's address in work requests (the iova).
func (m *DmabufMR) Addr() uint64 { return m.iova }

// Len returns the region's length.
func (m *DmabufMR) Len() int { return m.length }

// SGE returns an SGE for n bytes at offset off of the region.
func (m *DmabufMR) SGE(off, n int) verbs.SGE {
	return verbs.SGE{Addr: m.iova + uint64(off), Length: uint32(n), LKey: m.lkey}
}

// Dereg deregisters the region.
func (m *DmabufMR) Dereg() error {
	if m.c == nil {
		return fmt.Errorf("%w: region already deregistered", verbs.ErrInvalidArgument)
	}
	if err := m.c.dereg(); err != nil {
		return wrap("ibv_dereg_mr", err)
	}
	m.c = nil
	return nil
}
