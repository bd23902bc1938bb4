//go:build ibverbs

package main

// Built with -tags ibverbs, rdmakit also drives libibverbs devices (RNICs,
// rxe, siw).
import _ "github.com/rdmakit/rdmakit/transport/ibverbs"
