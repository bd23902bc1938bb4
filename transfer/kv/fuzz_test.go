package kv

import (
	"context"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/frame"
)

// FuzzServiceHandle: the master's request decoder and handler take any
// bytes without panicking, and answer every request.
func FuzzServiceHandle(f *testing.F) {
	key := frame.AppendBytes16(nil, []byte("k"))
	f.Add([]byte{opInfo, 0, 0, 0, 0})
	f.Add(append([]byte{opPut, 0, 0, 0, 0, 1, 0, 1}, frame.AppendUint64(key, 100)...))
	f.Add(append([]byte{opGet, 0, 0, 0, 0, 0, 1}, key...))
	f.Add(append([]byte{opRemove, 0, 1, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 1}, key...))
	f.Add(frame.AppendUint64([]byte{opPutEnd, 0, 0, 0, 0, 0, 1, 1}, 1))
	f.Add(frame.AppendBytes16(frame.AppendUint32(frame.AppendBytes16([]byte{opList, 0, 0, 0, 0}, nil), 10), nil))
	f.Add([]byte{opJoin, 0, 0, 0, 0, 1, 'h', 1, 's', 0, 0, 0, 0, 0, 16, 0, 0, 1, 't'})
	f.Add([]byte{opStats, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, p []byte) {
		s := &service{m: newMaster(time.Minute, time.Minute), maxKey: 64, maxValue: 1 << 20, maxRepl: MaxReplicas,
			leaseTTL: time.Minute, putTTL: time.Minute, holderTTL: time.Minute}
		s.m.join(time.Now(), "h", "s1", "seg", 1<<20, time.Minute)
		ans := s.handle(context.Background(), p)
		d := frame.NewDecoder(ans)
		decodeErr(&d)
		if d.Err() != nil {
			t.Fatalf("malformed answer %x to %x", ans, p)
		}
	})
}
