package rcproto

import "testing"

func TestSetWindow(t *testing.T) {
	r := NewRequester(Config{FirstPSN: 1, MaxWR: 8, MTU: 10, Window: 4})
	r.Connected(1)
	r.Post(WR{Op: OpWrite, Len: 100}, 1)
	var p Packet
	n := 0
	for r.Next(&p) {
		n++
	}
	if n != 4 {
		t.Fatalf("%d packets out with a window of 4", n)
	}
	r.SetWindow(6)
	for r.Next(&p) {
		n++
	}
	if n != 6 || r.Window() != 6 {
		t.Fatalf("%d packets out after SetWindow(6)", n)
	}
}
