package transferbench

import (
	"bytes"
	"context"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/rdmakit/rdmakit/transfer"
	"github.com/rdmakit/rdmakit/transfer/kv"
)

func TestKVBenchOutOfTheBox(t *testing.T) {
	for _, args := range [][]string{
		{"--device", "shm0", "--size", "65536", "--clients", "2", "--ops", "200"},
		{"--device", "tcp0", "--size", "1000", "--clients", "1", "--ops", "100", "--copy"},
		{"--device", "shm0", "--size", "4096", "--ops", "50", "--tests", "get"},
	} {
		var out, errb bytes.Buffer
		code := kvRun(append([]string{"bench"}, args...), nil, &out, &errb, false)
		if code != 0 || !strings.Contains(out.String(), "GET: ") || !strings.Contains(out.String(), "ops/s") {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out.String(), errb.String())
		}
		if errb.Len() != 0 {
			t.Fatalf("%v: progress without a terminal: %q", args, errb.String())
		}
	}
}

func TestKVClientCommands(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	t.Setenv(EnvKVSecret, hex.EncodeToString(secret))
	ctx := context.Background()
	s, err := kv.Open(ctx, kv.Config{Capacity: 4 << 20, Transfer: transfer.Config{Secret: secret, Devices: []string{"tcp0"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	run := func(stdin string, args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := kvRun(args, strings.NewReader(stdin), &out, &errb, false)
		return code, out.String(), errb.String()
	}
	a := []string{"--addr", s.Addr(), "--device", "tcp0"}
	if code, _, e := run("", append([]string{"put"}, append(a, "k1", "hello")...)...); code != 0 {
		t.Fatal(e)
	}
	if code, _, e := run("from stdin", append([]string{"put"}, append(a, "k2")...)...); code != 0 {
		t.Fatal(e)
	}
	if code, o, e := run("", append([]string{"get"}, append(a, "k2")...)...); code != 0 || o != "from stdin" {
		t.Fatal(code, o, e)
	}
	if code, o, _ := run("", append([]string{"ls"}, a...)...); code != 0 || !strings.Contains(o, "\"k1\"\t5") {
		t.Fatal(code, o)
	}
	if code, _, e := run("", append([]string{"rm"}, append(a, "k1")...)...); code != 0 {
		t.Fatal(e)
	}
	if code, _, e := run("", append([]string{"get"}, append(a, "k1")...)...); code != 1 || !strings.Contains(e, "not found") {
		t.Fatal(code, e)
	}
}

func TestKVUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"nope"}, {"get"}, {"get", "--addr", "x"}, {"put", "--addr", "x"}, {"bench", "--clients", "0"}, {"bench", "--tests", "del"}, {"ls", "--bogus"}, {"serve", "--metadata", "10.0.0.1:2379"}, {"get", "--addr", "x", "--metadata", "etcd://x", "k"}} {
		var out, errb bytes.Buffer
		if code := kvRun(args, nil, &out, &errb, false); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	var out, errb bytes.Buffer
	if code := kvRun([]string{"-h"}, nil, &out, &errb, false); code != 0 || !strings.Contains(out.String(), "-clients") {
		t.Errorf("help: %d %q", code, out.String())
	}
}
