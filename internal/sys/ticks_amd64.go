package sys

// Ticks reads the CPU's time-stamp counter (RDTSC): a timestamp that costs
// no system call where the kernel's clock source is not the TSC (a QEMU
// guest reads the HPET through a system call and an emulated device, a
// microsecond each). Its rate is the caller's to calibrate against the
// clock; it is only comparable on one CPU unless the TSC is invariant.
func Ticks() int64
