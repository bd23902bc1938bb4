package header

import "strconv"

func quote(b []byte) string { return strconv.Quote(string(b)) }
func itoa(i int) string     { return strconv.Itoa(i) }
