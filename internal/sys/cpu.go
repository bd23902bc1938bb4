package sys

// MovsbMin is the smallest copy that Copy hands to REP MOVSB where it
// does (below it the runtime's memmove is as fast or faster).
const MovsbMin = 32 << 10
