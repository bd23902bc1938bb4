package cli

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

var errUsageTest = errors.New("usage")

func testTable(got map[string]string) Getopt {
	set := func(k string) func(string, bool) error {
		return func(v string, given bool) error {
			if !given {
				v = "<none>"
			}
			got[k] += v + ";"
			return nil
		}
	}
	return Getopt{
		Flags: []Flag{
			{Short: 'a', Long: []string{"all"}, Set: set("a")},
			{Short: 'b', Long: []string{"bidirectional"}, Set: set("b")},
			{Short: 's', Long: []string{"size"}, Arg: RequiredArg, Set: set("s")},
			{Short: 'o', Long: []string{"opt"}, Arg: OptionalArg, Set: set("o")},
			{Long: []string{"ranks"}, Arg: RequiredArg, SingleDash: true, Set: set("ranks")},
			{Long: []string{"loopback"}, SingleDash: true, Set: set("loopback")},
			{Short: 'h', Long: []string{"help"}, Set: func(string, bool) error { return errors.New("help") }},
		},
		Usagef: func(format string, a ...any) error {
			return fmt.Errorf("%w: %s", errUsageTest, fmt.Sprintf(format, a...))
		},
		Unknown: func(name string, long bool) error {
			if name == "use_cuda" {
				return errors.New("no GPU support")
			}
			return nil
		},
		Hint: "cmd -h lists the flags",
	}
}

// The forms getopt_long takes, and rdmakit's single-dash long names.
func TestGetoptForms(t *testing.T) {
	for _, c := range []struct {
		args []string
		want map[string]string
		pos  []string
	}{
		{[]string{"-a", "-b", "-s", "64"}, map[string]string{"a": "<none>;", "b": "<none>;", "s": "64;"}, nil},
		{[]string{"-abs64", "x"}, map[string]string{"a": "<none>;", "b": "<none>;", "s": "64;"}, []string{"x"}},
		{[]string{"-ab", "-s", "-1"}, map[string]string{"a": "<none>;", "b": "<none>;", "s": "-1;"}, nil},
		{[]string{"--size=64", "--all", "srv", "--size", "128"}, map[string]string{"a": "<none>;", "s": "64;128;"}, []string{"srv"}},
		{[]string{"-ranks", "2", "-ranks=3", "--ranks=4", "-loopback"}, map[string]string{"ranks": "2;3;4;", "loopback": "<none>;"}, nil},
		{[]string{"-o", "x"}, map[string]string{"o": "<none>;"}, []string{"x"}},
		{[]string{"-ox", "--opt=y", "--opt", "z"}, map[string]string{"o": "x;y;<none>;"}, []string{"z"}},
		{[]string{"-a", "--", "-b", "--size=1"}, map[string]string{"a": "<none>;"}, []string{"-b", "--size=1"}},
		{[]string{"-", "a"}, map[string]string{}, []string{"-", "a"}},
	} {
		got := map[string]string{}
		pos, err := testTable(got).Parse(c.args)
		if err != nil || !reflect.DeepEqual(got, c.want) || !reflect.DeepEqual(pos, c.pos) {
			t.Errorf("%q: %v %q, %v; want %v %q", c.args, got, pos, err, c.want, c.pos)
		}
	}
}

func TestGetoptErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-s"}, "usage: flag -s needs a value"},
		{[]string{"--size"}, "usage: flag --size needs a value"},
		{[]string{"-ranks"}, "usage: flag -ranks needs a value"},
		{[]string{"--all=1"}, "usage: flag --all takes no value"},
		{[]string{"-aq"}, "usage: unknown flag -q (cmd -h lists the flags)"},
		{[]string{"--bogus"}, "usage: unknown flag --bogus (cmd -h lists the flags)"},
		{[]string{"-all"}, "usage: unknown flag -l (cmd -h lists the flags)"}, // -a, then -l
		{[]string{"--use_cuda=0"}, "no GPU support"},
		{[]string{"-a", "-h", "-q"}, "help"},
	} {
		_, err := testTable(map[string]string{}).Parse(c.args)
		if err == nil || err.Error() != c.want {
			t.Errorf("%q: %v, want %q", c.args, err, c.want)
		}
		if strings.HasPrefix(c.want, "usage:") && !errors.Is(err, errUsageTest) {
			t.Errorf("%q: %v is not the caller's usage error", c.args, err)
		}
	}
}

// FuzzGetopt: no command line makes the parser panic.
func FuzzGetopt(f *testing.F) {
	f.Add("-abs64 --size=1 -ranks 2 -- x")
	f.Add("-o -ox --opt= -")
	f.Fuzz(func(t *testing.T, line string) {
		testTable(map[string]string{}).Parse(strings.Split(line, " "))
	})
}
