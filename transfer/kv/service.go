package kv

// The master's service (over transfer/internal/rpc: secret handshake,
// every message tagged) and its wire format. The handler runs on the rpc
// connection goroutines, one request at a time per connection, each under
// the master's lock.
//
// Request: {op u8, released u16, lease ids u64..., touched u16, keys
// bytes16..., fields}: a client hands back the read leases it is done with
// on its next request (or a release request), and reports the keys it
// read without the master (cache.go), which count as used for the LRU. Answer: {code u8, message str16, fields}. List:
// {prefix bytes16, limit u32, after bytes16} → {n u32, (key bytes16,
// size u64)..., more u8}, the keys after after in byte order, more set
// when keys were left out (the client asks again after the last one).
// Join {name str8, segment str8, size u64, session str8}, beat and leave
// {name str8, session str8}: a store node's name belongs to the session
// (a random token of the Store) that joined it. Batch
// operations answer per key {code u8, message str16 if code != 0, fields}:
// Put {key bytes16, size u64} → {version u64, token u64, locations, per
// location {n u16, (offset u64, length u64)...}: the ranges of its segment
// the writer sets to 0 before it writes the value, current u8, retired if
// 1: the key's version now, whose headers the writer sets to 0 with the
// value}; PutEnd {commit u8, token u64} → {replaced u8, retired if 1: a
// version other than the one the put started with, to clear}; Get {key}
// → {size u64, lease u64, version u64, locations}; Remove {key} →
// {retired}. Retired: {version u64, lease u64, locations}, leased to the
// client, which sets its headers to 0 and then releases the lease.
// Locations: {n u8, (segment str8, offset u64)...}, the offset of the
// value (its version header is valHdr bytes before). A put's token is
// random: only the client that started the put can commit or abort it.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rdmakit/rdmakit/internal/frame"
	"github.com/rdmakit/rdmakit/transfer/internal/rpc"
)

const (
	// MaxBatch is the most keys one batch call carries.
	MaxBatch = 1024
	// MaxKeyLen is the hard limit on a key's length (Config.MaxKeyLen
	// may lower it).
	MaxKeyLen = 4096
	// maxReleases is the most lease ids one request hands back.
	maxReleases = 4096
	// maxListKeys is the most keys one List answer carries; listBudget
	// the most bytes of keys (under the message limit). A List asking for
	// more takes several requests.
	maxListKeys = 100000
	listBudget  = MaxBatch * (MaxKeyLen + 64)
)

var kvProto = rpc.Proto{Magic: 0x524b4b56 /* "RKKV" */, Version: 3, Label: "rdmakit kv v3",
	Limit: MaxBatch*(MaxKeyLen+64) + maxReleases*8 + maxTouches*(MaxKeyLen+2) + 1024}

const (
	opInfo    = 1
	opJoin    = 2
	opBeat    = 3
	opLeave   = 4
	opPut     = 5
	opPutEnd  = 6
	opGet     = 7
	opExists  = 8
	opRemove  = 9
	opList    = 10
	opStats   = 11
	opRelease = 12

	codeOK       = 0
	codeNotFound = 1
	codeFull     = 2
	codeTooLarge = 3
	codeNoNodes  = 4
	codeOther    = 5
	codeRetry    = 6
)

func errCode(err error) byte {
	switch {
	case err == nil:
		return codeOK
	case errors.Is(err, ErrNotFound):
		return codeNotFound
	case errors.Is(err, ErrFull):
		return codeFull
	case errors.Is(err, ErrTooLarge):
		return codeTooLarge
	case errors.Is(err, ErrNoNodes):
		return codeNoNodes
	case errors.Is(err, errRetry):
		return codeRetry
	}
	return codeOther
}

// appendErr appends {code, message if not ok}.
func appendErr(b []byte, err error) []byte {
	b = append(b, errCode(err))
	if err != nil {
		msg := err.Error()
		if len(msg) > 1000 {
			msg = msg[:1000]
		}
		b = frame.AppendString16(b, msg)
	}
	return b
}

// decodeErr reads {code, message if not ok} as an error matching its
// sentinel.
func decodeErr(d *frame.Decoder) error {
	code := d.Uint8()
	if code == codeOK {
		return nil
	}
	msg := d.String16()
	var kind error
	switch code {
	case codeNotFound:
		kind = ErrNotFound
	case codeFull:
		kind = ErrFull
	case codeTooLarge:
		kind = ErrTooLarge
	case codeNoNodes:
		kind = ErrNoNodes
	case codeRetry:
		kind = errRetry
	default:
		return remoteErr{errors.New("kv master"), msg}
	}
	return remoteErr{kind, msg}
}

// remoteErr is an error the master answered.
type remoteErr struct {
	kind error
	msg  string
}

func (e remoteErr) Error() string { return e.msg }
func (e remoteErr) Unwrap() error { return e.kind }

func appendLocs(b []byte, l []Location) []byte {
	b = append(b, byte(len(l)))
	for _, x := range l {
		b = frame.AppendString8(b, x.Segment)
		b = frame.AppendUint64(b, x.Offset)
	}
	return b
}

// decodeClears reads a put's ranges to clear, per location.
func decodeClears(d *frame.Decoder, nlocs int) [][]extent {
	out := make([][]extent, nlocs)
	for i := range out {
		n := int(d.Uint16())
		for j := 0; j < n && d.Err() == nil; j++ {
			out[i] = append(out[i], extent{d.Uint64(), d.Uint64()})
		}
	}
	return out
}

func decodeLocs(d *frame.Decoder) []Location {
	n := int(d.Uint8())
	var l []Location
	for i := 0; i < n && d.Err() == nil; i++ {
		l = append(l, Location{Segment: d.String8(), Offset: d.Uint64()})
	}
	return l
}

// appendReplaced appends {1, retired} for a version a commit replaced,
// {0} for none.
func appendReplaced(b []byte, old *retired) []byte {
	if old == nil {
		return append(b, 0)
	}
	return appendRetired(append(b, 1), old)
}

// appendRetired appends {version u64, lease u64, locations}.
func appendRetired(b []byte, old *retired) []byte {
	b = frame.AppendUint64(b, old.ver)
	b = frame.AppendUint64(b, old.lease)
	return appendLocs(b, old.locs)
}

// service answers the master's requests.
type service struct {
	m         *master
	metadata  string // the transfer metadata address nodes use
	local     string // the master's Unix socket ("" if none)
	maxKey    int
	maxValue  uint64
	maxRepl   int
	leaseTTL  time.Duration
	putTTL    time.Duration
	holderTTL time.Duration
	// self and selfSession name this process's own store node (the
	// master's Store; self "" if it holds nothing) to a master that
	// takes over the table from etcd.
	self, selfSession string
}

var errMalformed = fmt.Errorf("%w: malformed request", rpc.ErrProtocol)

func (s *service) handle(_ context.Context, p []byte) []byte {
	d := frame.NewDecoder(p)
	op := d.Uint8()
	nrel := int(d.Uint16())
	if nrel > maxReleases {
		return appendErr(nil, errMalformed)
	}
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if m.ha != nil && !m.ha.serving(now) {
		return appendErr(nil, errRetry)
	}
	for i := 0; i < nrel && d.Err() == nil; i++ {
		m.releaseLocked(d.Uint64())
	}
	ntouch := int(d.Uint16())
	if ntouch > maxTouches {
		return appendErr(nil, errMalformed)
	}
	for i := 0; i < ntouch && d.Err() == nil; i++ {
		if e := m.entries[string(d.Bytes16())]; e != nil && e.lru != nil {
			m.lru.MoveToBack(e.lru)
		}
	}
	m.sweep(now)
	b := s.serve(m, now, op, &d)
	// The table's changes reach etcd before the answer leaves.
	if err := m.flush(); err != nil {
		return appendErr(nil, err)
	}
	return b
}

// serve answers one request; the caller holds the master's lock.
func (s *service) serve(m *master, now time.Time, op byte, d *frame.Decoder) []byte {
	ok := []byte{codeOK}
	switch op {
	case opRelease:
		if d.Finish() != nil {
			break
		}
		return ok
	case opInfo:
		if d.Finish() != nil {
			break
		}
		b := frame.AppendString16(ok, s.metadata)
		b = frame.AppendString8(b, s.local)
		b = frame.AppendUint32(b, uint32(s.leaseTTL/time.Millisecond))
		b = frame.AppendUint32(b, uint32(s.putTTL/time.Millisecond))
		b = frame.AppendUint32(b, uint32(s.holderTTL/time.Millisecond))
		b = frame.AppendUint32(b, uint32(s.maxKey))
		return frame.AppendUint64(b, s.maxValue)
	case opJoin:
		name, seg, size, session := d.String8(), d.String8(), d.Uint64(), d.String8()
		if d.Finish() != nil || name == "" || seg == "" || session == "" {
			break
		}
		err := m.join(now, name, session, seg, size, s.holderTTL)
		return appendErr(nil, err)
	case opBeat, opLeave:
		name, session := d.String8(), d.String8()
		if d.Finish() != nil || session == "" {
			break
		}
		if op == opLeave {
			m.leave(name, session)
			return ok
		}
		return appendErr(nil, m.beat(now, name, session))
	case opPut:
		if m.ha != nil && now.Before(m.ha.grace) {
			return appendErr(nil, fmt.Errorf("%w: reads of the last master may still run", errRetry))
		}
		repl, n := int(d.Uint8()), int(d.Uint16())
		if repl < 1 || repl > s.maxRepl || n > MaxBatch {
			break
		}
		b := ok
		for i := 0; i < n && d.Err() == nil; i++ {
			key, size := d.Bytes16(), d.Uint64()
			if d.Err() != nil {
				break
			}
			var err error
			var e *entry
			switch {
			case len(key) == 0 || len(key) > s.maxKey:
				err = fmt.Errorf("%w: key of %d bytes (1 to %d)", ErrTooLarge, len(key), s.maxKey)
			case size > s.maxValue:
				err = fmt.Errorf("%w: value of %d bytes (at most %d)", ErrTooLarge, size, s.maxValue)
			default:
				e, err = m.putStart(now, string(key), size, repl)
			}
			b = appendErr(b, err)
			if err == nil {
				b = frame.AppendUint64(b, e.ver)
				b = frame.AppendUint64(b, e.tok)
				b = appendLocs(b, e.locations())
				for _, r := range e.reps {
					b = frame.AppendUint16(b, uint16(len(r.clear)))
					for _, c := range r.clear {
						b = frame.AppendUint64(frame.AppendUint64(b, c.off), c.len)
					}
				}
				b = appendReplaced(b, e.prev)
			}
		}
		if d.Finish() != nil {
			// Undo nothing: the puts started expire after putTTL.
			break
		}
		return b
	case opPutEnd:
		n := int(d.Uint16())
		if n > MaxBatch {
			break
		}
		b := ok
		for i := 0; i < n && d.Err() == nil; i++ {
			commit, tok := d.Uint8() == 1, d.Uint64()
			if d.Err() != nil {
				break
			}
			old, err := m.putEnd(now, tok, commit)
			b = appendErr(b, err)
			if err == nil {
				b = appendReplaced(b, old)
			}
		}
		if d.Finish() != nil {
			break
		}
		return b
	case opGet, opExists, opRemove:
		n := int(d.Uint16())
		if n > MaxBatch {
			break
		}
		b := ok
		for i := 0; i < n && d.Err() == nil; i++ {
			key := d.Bytes16()
			if d.Err() != nil {
				break
			}
			switch op {
			case opGet:
				e, id, err := m.get(now, string(key))
				b = appendErr(b, err)
				if err == nil {
					b = frame.AppendUint64(b, e.size)
					b = frame.AppendUint64(b, id)
					b = frame.AppendUint64(b, e.ver)
					b = appendLocs(b, e.locations())
				}
			case opExists:
				_, found := m.entries[string(key)]
				if found {
					b = appendErr(b, nil)
				} else {
					b = appendErr(b, ErrNotFound)
				}
			default:
				gone, err := m.remove(now, string(key))
				b = appendErr(b, err)
				if err == nil {
					b = appendRetired(b, gone)
				}
			}
		}
		if d.Finish() != nil {
			// Leases taken for a malformed batch expire.
			break
		}
		return b
	case opList:
		prefix, limit, after := d.Bytes16(), int(d.Uint32()), d.Bytes16()
		if d.Finish() != nil {
			break
		}
		limit = min(limit, maxListKeys)
		keys, more := m.list(string(prefix), string(after), limit, listBudget)
		b := frame.AppendUint32(ok, uint32(len(keys)))
		for _, k := range keys {
			b = frame.AppendBytes16(b, k.Key)
			b = frame.AppendUint64(b, k.Size)
		}
		if more {
			return append(b, 1)
		}
		return append(b, 0)
	case opStats:
		if d.Finish() != nil {
			break
		}
		st := m.stats()
		b := frame.AppendUint32(ok, uint32(st.Keys))
		b = frame.AppendUint32(b, uint32(st.Leases))
		b = frame.AppendUint64(b, st.Evictions)
		b = frame.AppendUint32(b, uint32(len(st.Nodes)))
		for _, n := range st.Nodes {
			b = frame.AppendString8(b, n.Name)
			b = frame.AppendUint64(b, n.Capacity)
			b = frame.AppendUint64(b, n.Used)
			b = frame.AppendUint32(b, uint32(n.Values))
		}
		return b
	}
	return appendErr(nil, errMalformed)
}
