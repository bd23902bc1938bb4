package soft

// Progresser is a ContextTransport that does its receive-side work on the
// goroutine that polls, when asked: CQ.Poll calls Progress when it finds
// its CQ empty and looks again when Progress did something. An
// application that spins on its CQ then drives the transport itself,
// without waking the transport's goroutines (they keep doing the work
// when nobody polls).
type Progresser interface {
	// Progress does, without blocking, what work the transport has
	// pending (receive what arrived, answer it, send what that lets go)
	// and reports whether it received anything. Any goroutine may call
	// it, concurrently with the others and with the transport's own
	// goroutines; it returns at once when another is at the same work.
	Progress() bool
}
