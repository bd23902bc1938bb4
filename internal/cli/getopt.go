package cli

// A getopt_long-style command-line parser, shared by the commands that
// take other tools' command lines unchanged (perf: perftest's; coll-perf:
// nccl-tests'). Pure functions; the caller's setters run in its goroutine.
//
//	-a -b                 short flags, also bundled: -ab
//	-s 64, -s64           a short flag's value: the next argument or the rest
//	--size 64, --size=64  a long flag's value
//	-ranks 2, -ranks=2    long names with one dash, where the flag allows it
//	-x[VAL], --x[=VAL]    an optional value: only glued, never the next argument
//	--                    everything after it is positional
//
// A lone "-" and anything not starting with "-" is positional; positionals
// and flags may come in any order (as GNU getopt_long permutes them).

import (
	"fmt"
	"strings"
)

// ArgKind says whether a flag takes a value.
type ArgKind int

const (
	NoArg       ArgKind = iota // a switch: "--flag=v" is an error
	RequiredArg                // the value may be the next argument
	OptionalArg                // the value only glued: -xV, --x=V
)

// Flag is one entry of the table.
type Flag struct {
	Short byte     // 0: none
	Long  []string // long names, without dashes
	Arg   ArgKind
	// SingleDash lets the long names be written with one dash too.
	SingleDash bool
	// Set receives the value ("" for NoArg, or an OptionalArg given none;
	// given says which).
	Set func(v string, given bool) error
}

// Getopt parses with a table.
type Getopt struct {
	Flags []Flag
	// Usagef makes the caller's usage error from a message (required).
	Usagef func(format string, a ...any) error
	// Unknown, if set, returns the error for a flag not in the table
	// (name without dashes; long reports whether it was given as --name),
	// e.g. to say why a known foreign flag is refused. Nil, or a nil
	// return: "unknown flag -x".
	Unknown func(name string, long bool) error
	// Hint ends the unknown-flag message, e.g. "rdmakit perf -h lists the flags".
	Hint string
}

// Parse applies args to the table and returns the positional arguments.
func (g Getopt) Parse(args []string) ([]string, error) {
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return append(pos, args[i+1:]...), nil
		case len(a) < 2 || a[0] != '-':
			pos = append(pos, a)
			continue
		}
		if strings.HasPrefix(a, "--") {
			name, val, hasVal := strings.Cut(a[2:], "=")
			f := g.long(name, false)
			if f == nil {
				return pos, g.unknown(name, true)
			}
			n, err := g.apply(f, "--"+name, val, hasVal, args, i)
			if err != nil {
				return pos, err
			}
			i = n
			continue
		}
		if name, val, hasVal := strings.Cut(a[1:], "="); len(name) > 1 {
			if f := g.long(name, true); f != nil {
				n, err := g.apply(f, "-"+name, val, hasVal, args, i)
				if err != nil {
					return pos, err
				}
				i = n
				continue
			}
		}
		// Short flags, possibly bundled; a flag with a value ends the bundle.
		for j := 1; j < len(a); j++ {
			f := g.short(a[j])
			if f == nil {
				return pos, g.unknown(string(a[j]), false)
			}
			disp := "-" + string(a[j])
			if f.Arg == NoArg {
				if err := f.Set("", false); err != nil {
					return pos, err
				}
				continue
			}
			rest := a[j+1:]
			n, err := g.apply(f, disp, rest, rest != "", args, i)
			if err != nil {
				return pos, err
			}
			i = n
			break
		}
	}
	return pos, nil
}

// apply sets f from a glued value or (RequiredArg) the next argument, and
// returns the index of the last argument used.
func (g Getopt) apply(f *Flag, disp, val string, hasVal bool, args []string, i int) (int, error) {
	switch {
	case f.Arg == NoArg && hasVal:
		return i, g.Usagef("flag %s takes no value", disp)
	case f.Arg == RequiredArg && !hasVal:
		if i+1 >= len(args) {
			return i, g.Usagef("flag %s needs a value", disp)
		}
		i++
		val, hasVal = args[i], true
	}
	return i, f.Set(val, hasVal)
}

func (g Getopt) long(name string, single bool) *Flag {
	for k := range g.Flags {
		f := &g.Flags[k]
		if single && !f.SingleDash {
			continue
		}
		for _, l := range f.Long {
			if l == name {
				return f
			}
		}
	}
	return nil
}

func (g Getopt) short(c byte) *Flag {
	for k := range g.Flags {
		if g.Flags[k].Short != 0 && g.Flags[k].Short == c {
			return &g.Flags[k]
		}
	}
	return nil
}

func (g Getopt) unknown(name string, long bool) error {
	if g.Unknown != nil {
		if err := g.Unknown(name, long); err != nil {
			return err
		}
	}
	dash := "-"
	if long {
		dash = "--"
	}
	msg := fmt.Sprintf("unknown flag %s%s", dash, name)
	if g.Hint != "" {
		msg += " (" + g.Hint + ")"
	}
	return g.Usagef("%s", msg)
}
