//go:build !ibverbs

package ibverbs

// Enabled reports whether the package was built with the ibverbs tag. In
// this build it was not: the package registers no transport. Build with
// -tags ibverbs (cgo and libibverbs-dev, librdmacm-dev needed).
const Enabled = false
