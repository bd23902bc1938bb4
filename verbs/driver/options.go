package driver

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// Environment variables that supply defaults for Options. They are read
// only for fields left at their zero value; a malformed value is an error
// from Open, never silently ignored.
const (
	EnvArenaSize = "RDMAKIT_ARENA_SIZE"
	EnvTCPAddr   = "RDMAKIT_TCP_ADDR"
	EnvGIDIndex  = "RDMAKIT_IBV_GID_INDEX"
	EnvBusyPoll  = "RDMAKIT_TCP_BUSY_POLL"
)

// DefaultTCPBusyPoll is how long the tcp transport's reader spins on
// non-blocking reads before it sleeps in the network poller, when neither
// Options.TCPBusyPoll nor RDMAKIT_TCP_BUSY_POLL says otherwise.
const DefaultTCPBusyPoll = 50 * time.Microsecond

// DefaultArenaSize is the address space a software context reserves for
// AllocMR memory and its queues (sparse: only what is used costs memory).
const DefaultArenaSize = 64 << 30

// Options configure a device when it is opened (verbs.Open). The zero
// value is the documented default of every field.
type Options struct {
	// ArenaSize is the address space reserved for the context's
	// off-heap memory (AllocMR, and the queues of software devices).
	// 0: RDMAKIT_ARENA_SIZE if set, else DefaultArenaSize (64 GiB).
	// Resolve rounds nothing; the arena rounds up to pages.
	ArenaSize int64
	// ListenAddr is where the tcp transport accepts its data connections
	// (host:port). "": RDMAKIT_TCP_ADDR if set, else ":0" (every address,
	// a port of the kernel's choice).
	ListenAddr string
	// GIDIndex is the source GID index an RDMA device uses on RoCE ports,
	// when SetGIDIndex is true. Otherwise RDMAKIT_IBV_GID_INDEX if set,
	// else the device picks the GID that matches the destination (RoCEv2,
	// same address family).
	GIDIndex    int
	SetGIDIndex bool
	// TCPBusyPoll is how long the tcp transport's reader (one per
	// connected QP) keeps polling its socket without sleeping once it has
	// nothing to read, before it parks in Go's network poller: a message
	// that arrives within it is handled without a thread wake-up, at the
	// price of up to that much CPU time per idle period. Busy polling on
	// (any positive value) also lets the application's polls of an empty
	// CQ read and handle the QPs' input themselves, while the reader
	// sleeps (transport/tcp's doc). 0:
	// RDMAKIT_TCP_BUSY_POLL if set (a duration such as 50us, 1ms, or 0 for
	// off), else DefaultTCPBusyPoll; negative: off.
	TCPBusyPoll time.Duration
}

// Resolve applies the environment's defaults to the fields left at zero
// and checks every field.
func (o Options) Resolve() (Options, error) {
	if o.ArenaSize < 0 {
		return o, fmt.Errorf("%w: arena size %d", ErrInvalidArgument, o.ArenaSize)
	}
	if o.ArenaSize == 0 {
		o.ArenaSize = DefaultArenaSize
		if s := os.Getenv(EnvArenaSize); s != "" {
			v, err := ParseSize(s)
			if err != nil || v == 0 {
				return o, fmt.Errorf("%w: %s=%q: want a positive size such as 1G or 512M", ErrInvalidArgument, EnvArenaSize, s)
			}
			o.ArenaSize = v
		}
	}
	if o.ListenAddr == "" {
		o.ListenAddr = ":0"
		if s := os.Getenv(EnvTCPAddr); s != "" {
			o.ListenAddr = s
		}
	}
	if !o.SetGIDIndex {
		if s := os.Getenv(EnvGIDIndex); s != "" {
			v, err := strconv.Atoi(s)
			if err != nil || v < 0 || v > 255 {
				return o, fmt.Errorf("%w: %s=%q: want a GID index 0..255", ErrInvalidArgument, EnvGIDIndex, s)
			}
			o.GIDIndex, o.SetGIDIndex = v, true
		}
	}
	if o.TCPBusyPoll == 0 {
		o.TCPBusyPoll = DefaultTCPBusyPoll
		if s := os.Getenv(EnvBusyPoll); s != "" {
			v, err := time.ParseDuration(s)
			if s == "0" {
				v, err = 0, nil
			}
			if err != nil || v < 0 || v > time.Second {
				return o, fmt.Errorf("%w: %s=%q: want a duration from 0 (off) to 1s, such as 50us", ErrInvalidArgument, EnvBusyPoll, s)
			}
			o.TCPBusyPoll = v
			if v == 0 {
				o.TCPBusyPoll = -1
			}
		}
	}
	if o.TCPBusyPoll > time.Second {
		return o, fmt.Errorf("%w: TCP busy poll %v (at most 1s)", ErrInvalidArgument, o.TCPBusyPoll)
	}
	if o.SetGIDIndex && (o.GIDIndex < 0 || o.GIDIndex > 255) {
		return o, fmt.Errorf("%w: GID index %d (0..255)", ErrInvalidArgument, o.GIDIndex)
	}
	return o, nil
}

// ParseSize parses a byte count: a decimal or 0x number with an optional
// binary suffix K, M, G or T (KiB... also accepted, and a trailing B), so
// "1G", "512M", "64KiB", "4096". Anything else is an error.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	u := strings.ToUpper(t)
	u = strings.TrimSuffix(u, "B")
	u = strings.TrimSuffix(u, "I")
	shift := 0
	if n := len(u); n > 0 {
		switch u[n-1] {
		case 'K':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		}
		if shift != 0 {
			u = u[:n-1]
		}
	}
	if u == "" {
		return 0, fmt.Errorf("%w: size %q", ErrInvalidArgument, s)
	}
	v, err := strconv.ParseInt(strings.ToLower(u), 0, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%w: size %q", ErrInvalidArgument, s)
	}
	if v > math.MaxInt64>>shift {
		return 0, fmt.Errorf("%w: size %q overflows", ErrInvalidArgument, s)
	}
	return v << shift, nil
}
