package main

// The transports linked into rdmakit besides shm (imported by main.go).
import (
	_ "github.com/rdmakit/rdmakit/transport/roce"
	_ "github.com/rdmakit/rdmakit/transport/tcp"
)
