package frame

// Fuzz targets run on the fuzzing engine's goroutines, one input at a time
// per goroutine.

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// FuzzReader reads frames off arbitrary bytes under an arbitrary limit: no
// panic, no frame over the limit, and the frames read re-encode to exactly
// the bytes consumed.
func FuzzReader(f *testing.F) {
	f.Add(encodeAll(smallFrames()), uint32(1<<20))
	f.Add(encodeAll(smallFrames()), uint32(99))
	f.Add([]byte{0x10, 0, 0, 0, 1}, uint32(64<<10))
	f.Add([]byte{0, 0, 0}, uint32(0))
	f.Fuzz(func(t *testing.T, data []byte, limit uint32) {
		r := NewReader(bytes.NewReader(data), int(limit%(1<<20)))
		var again []byte
		for {
			typ, p, err := r.Next()
			if err != nil {
				switch {
				case err == io.EOF:
					if !bytes.Equal(again, data) {
						t.Fatalf("clean end after %d of %d bytes", len(again), len(data))
					}
				case errors.Is(err, ErrTooLarge), errors.Is(err, ErrTruncated):
					if !bytes.HasPrefix(data, again) {
						t.Fatal("frames read are not a prefix of the input")
					}
				default:
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if len(p) > r.Limit() {
				t.Fatalf("%d-byte payload under a %d-byte limit", len(p), r.Limit())
			}
			again = AppendFrame(again, typ, p)
		}
	})
}

// FuzzDecoder runs a program of field reads (one op byte each) over an
// arbitrary payload: no panic, zero values and a sticky error after the
// first failure, and the fields read re-encode to exactly the bytes
// consumed.
func FuzzDecoder(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, fieldPayload())
	f.Add([]byte{6}, AppendUint32(nil, 0xffffffff))
	f.Add([]byte{4, 4, 4}, []byte{2, 'h', 'i', 0, 9})
	f.Add([]byte{10}, []byte{0, 3, 1, 2})
	f.Fuzz(func(t *testing.T, ops, payload []byte) {
		d := NewDecoder(payload)
		var again []byte
		for _, op := range ops {
			before := d.Len()
			switch op % 11 {
			case 0:
				again = append(again, d.Uint8())
			case 1:
				again = AppendUint16(again, d.Uint16())
			case 2:
				again = AppendUint32(again, d.Uint32())
			case 3:
				again = AppendUint64(again, d.Uint64())
			case 4:
				again = AppendBytes8(again, d.Bytes8())
			case 5:
				again = AppendBytes16(again, d.Bytes16())
			case 6:
				again = AppendBytes32(again, d.Bytes32())
			case 7:
				again = AppendString8(again, d.String8())
			case 8:
				again = AppendString16(again, d.String16())
			case 9:
				again = AppendString32(again, d.String32())
			case 10:
				again = append(again, d.Bytes(int(op/11))...)
			}
			if d.Err() != nil {
				if !errors.Is(d.Err(), ErrTruncated) || d.Len() != 0 || d.Rest() != nil {
					t.Fatalf("after a failure: %v, %d bytes left", d.Err(), d.Len())
				}
				return
			}
			if d.Len() > before {
				t.Fatal("a read gave bytes back")
			}
		}
		if !bytes.Equal(again, payload[:len(payload)-d.Len()]) {
			t.Fatalf("re-encoded fields %x differ from the bytes read %x", again, payload[:len(payload)-d.Len()])
		}
		if err := d.Finish(); (err == nil) != (d.Len() == 0) || err != nil && !errors.Is(err, ErrTrailing) {
			t.Fatalf("Finish with %d bytes left: %v", d.Len(), err)
		}
	})
}
