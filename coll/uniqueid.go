package coll

// GetUniqueID starts the root's goroutines (bootstrap.go) in the calling
// process; NewComm runs in the caller's goroutine and starts the
// communicator's watcher.

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strings"
)

// UniqueID names one communicator's rendezvous, like ncclUniqueId: the
// root's TCP address and a random nonce. Make it once (GetUniqueID), hand
// it to every rank (as bytes or as its String), and have each rank call
// NewComm with it.
type UniqueID [128]byte

const idMagic = "RKC1"

// GetUniqueID starts the rendezvous root in this process and returns its
// id. The root listens on RDMAKIT_COLL_ADDR (host:port) if set, else on an
// ephemeral port of every interface, advertising this host's outbound IP
// address. It serves one communicator and goes away when all its ranks
// have left, or after the bootstrap timeout if they never all join.
func GetUniqueID() (UniqueID, error) {
	o, err := Options{}.resolve()
	if err != nil {
		return UniqueID{}, err
	}
	listen := os.Getenv(EnvAddr)
	if listen == "" {
		listen = ":0"
	}
	nonce := randNonce()
	r, err := startRoot(listen, nonce, o.BootstrapTimeout)
	if err != nil {
		return UniqueID{}, err
	}
	host, port, _ := net.SplitHostPort(listen)
	_, aport, _ := net.SplitHostPort(r.ln.Addr().String())
	if port == "0" || port == "" {
		port = aport
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = outboundIP()
	}
	return makeID(net.JoinHostPort(host, port), nonce), nil
}

func makeID(addr string, nonce uint64) UniqueID {
	var id UniqueID
	copy(id[:4], idMagic)
	binary.BigEndian.PutUint64(id[8:], nonce)
	id[16] = byte(copy(id[17:], addr))
	return id
}

// Addr returns the root's address.
func (id UniqueID) Addr() string {
	n := int(id[16])
	if n > len(id)-17 {
		return ""
	}
	return string(id[17 : 17+n])
}

func (id UniqueID) nonce() uint64 { return binary.BigEndian.Uint64(id[8:]) }

func (id UniqueID) valid() bool { return string(id[:4]) == idMagic && id.Addr() != "" }

// String returns a printable form that ParseUniqueID reads back:
// "rkc1:NONCE@HOST:PORT".
func (id UniqueID) String() string {
	return fmt.Sprintf("rkc1:%016x@%s", id.nonce(), id.Addr())
}

// ParseUniqueID parses what String returned.
func ParseUniqueID(s string) (UniqueID, error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(s), "rkc1:")
	nonceHex, addr, ok2 := strings.Cut(rest, "@")
	b, err := hex.DecodeString(nonceHex)
	if !ok || !ok2 || err != nil || len(b) != 8 || addr == "" || len(addr) > 100 {
		return UniqueID{}, fmt.Errorf("%w: unique id %q", ErrInvalidArgument, s)
	}
	return makeID(addr, binary.BigEndian.Uint64(b)), nil
}

// outboundIP guesses the address other hosts reach this one at: the
// source address of the default route, else the first non-loopback
// address, else the loopback address.
func outboundIP() string {
	if c, err := net.Dial("udp", "192.0.2.1:9"); err == nil { // no packet is sent
		defer c.Close()
		if a, ok := c.LocalAddr().(*net.UDPAddr); ok && !a.IP.IsUnspecified() {
			return a.IP.String()
		}
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
				return n.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

// NewComm creates this rank's handle of the communicator named by id,
// like ncclCommInitRank: every rank of 0..nranks-1 calls it (in its own
// process, or goroutine) with the same id and nranks. It returns once all
// ranks have joined and connected, or fails with ErrBootstrap naming the
// ranks that did not show up within the bootstrap timeout.
func NewComm(ctx context.Context, id UniqueID, nranks, rank int, opts *Options) (*Comm, error) {
	if !id.valid() {
		return nil, fmt.Errorf("%w: not a unique id", ErrInvalidArgument)
	}
	if nranks < 1 || nranks > MaxRanks || rank < 0 || rank >= nranks {
		return nil, fmt.Errorf("%w: rank %d of %d", ErrInvalidArgument, rank, nranks)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	o, err := o.resolve()
	if err != nil {
		return nil, err
	}
	return newComm(ctx, id.Addr(), id.nonce(), nranks, rank, o, nil)
}
