package driver

import (
	"errors"
	"testing"
	"time"
)

func TestCheckModify(t *testing.T) {
	states := []QPState{QPReset, QPInit, QPRTR, QPRTS, QPError}
	// allowed[from][to]
	allowed := map[QPState][]QPState{
		QPReset: {QPReset, QPInit, QPError},
		QPInit:  {QPReset, QPInit, QPRTR, QPError},
		QPRTR:   {QPReset, QPRTS, QPError},
		QPRTS:   {QPReset, QPRTS, QPError},
		QPError: {QPReset, QPError},
	}
	for _, from := range states {
		for _, to := range states {
			want := false
			for _, a := range allowed[from] {
				want = want || a == to
			}
			err := CheckModify(from, &QPAttr{State: to})
			if want && err != nil {
				t.Errorf("%s → %s refused: %v", from, to, err)
			}
			if !want && !errors.Is(err, ErrInvalidState) {
				t.Errorf("%s → %s: got %v, want ErrInvalidState", from, to, err)
			}
		}
	}
	bad := []struct {
		name string
		from QPState
		attr QPAttr
	}{
		{"unknown access flag", QPReset, QPAttr{State: QPInit, AccessFlags: 1 << 7}},
		{"path MTU 6", QPInit, QPAttr{State: QPRTR, PathMTU: 6}},
		{"min_rnr_timer 32", QPInit, QPAttr{State: QPRTR, MinRNRTimer: 32}},
		{"retry_cnt 8", QPRTR, QPAttr{State: QPRTS, RetryCount: 8}},
		{"rnr_retry 8", QPRTR, QPAttr{State: QPRTS, RNRRetry: 8}},
		{"timeout 32", QPRTR, QPAttr{State: QPRTS, Timeout: 32}},
	}
	for _, b := range bad {
		if err := CheckModify(b.from, &b.attr); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", b.name, err)
		}
	}
	if err := CheckModify(QPInit, &QPAttr{State: QPRTR, PathMTU: MTU1024, MinRNRTimer: 31}); err != nil {
		t.Errorf("valid RTR refused: %v", err)
	}
	if err := CheckModify(QPRTS, &QPAttr{State: QPRTS, RetryCount: 7, RNRRetry: 7, Timeout: 31}); err != nil {
		t.Errorf("valid RTS refused: %v", err)
	}
}

func TestMergeAttr(t *testing.T) {
	ah := AddressHandle{Dest: []byte{1}}
	cases := []struct {
		name string
		cur  QPAttr
		from QPState
		attr QPAttr
		want QPAttr
	}{
		{"init takes access and port only", QPAttr{}, QPReset,
			QPAttr{State: QPInit, AccessFlags: AccessRemoteRead, Port: 1, DestQPN: 9, Timeout: 3},
			QPAttr{State: QPInit, AccessFlags: AccessRemoteRead, Port: 1}},
		{"rtr takes path, keeps access, defaults MTU", QPAttr{State: QPInit, AccessFlags: AccessAll, Port: 1}, QPInit,
			QPAttr{State: QPRTR, DestQPN: 7, RQPSN: 100, AH: ah, MinRNRTimer: 12, MaxDestRdAtomic: 4, SQPSN: 55},
			QPAttr{State: QPRTR, AccessFlags: AccessAll, Port: 1, PathMTU: MTU4096, DestQPN: 7, RQPSN: 100, AH: ah, MinRNRTimer: 12, MaxDestRdAtomic: 4}},
		{"rts from rtr takes the send PSN", QPAttr{State: QPRTR, PathMTU: MTU1024, DestQPN: 7}, QPRTR,
			QPAttr{State: QPRTS, SQPSN: 55, Timeout: 14, RetryCount: 7, RNRRetry: 6, MaxRdAtomic: 2},
			QPAttr{State: QPRTS, PathMTU: MTU1024, DestQPN: 7, SQPSN: 55, Timeout: 14, RetryCount: 7, RNRRetry: 6, MaxRdAtomic: 2}},
		{"rts to rts keeps the send PSN", QPAttr{State: QPRTS, SQPSN: 55}, QPRTS,
			QPAttr{State: QPRTS, SQPSN: 99, Timeout: 1},
			QPAttr{State: QPRTS, SQPSN: 55, Timeout: 1}},
		{"reset clears everything", QPAttr{State: QPRTS, SQPSN: 55, DestQPN: 3, AccessFlags: AccessAll}, QPRTS,
			QPAttr{State: QPReset}, QPAttr{State: QPReset}},
		{"error keeps the attributes", QPAttr{State: QPRTS, DestQPN: 3}, QPRTS,
			QPAttr{State: QPError, DestQPN: 4}, QPAttr{State: QPError, DestQPN: 3}},
	}
	for _, c := range cases {
		got := MergeAttr(c.cur, c.from, &c.attr)
		if got.State != c.want.State || got.AccessFlags != c.want.AccessFlags || got.Port != c.want.Port ||
			got.PathMTU != c.want.PathMTU || got.DestQPN != c.want.DestQPN || got.RQPSN != c.want.RQPSN ||
			len(got.AH.Dest) != len(c.want.AH.Dest) || got.MinRNRTimer != c.want.MinRNRTimer ||
			got.MaxDestRdAtomic != c.want.MaxDestRdAtomic || got.SQPSN != c.want.SQPSN || got.Timeout != c.want.Timeout ||
			got.RetryCount != c.want.RetryCount || got.RNRRetry != c.want.RNRRetry || got.MaxRdAtomic != c.want.MaxRdAtomic {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
}

func TestParseSize(t *testing.T) {
	good := map[string]int64{
		"4096": 4096, "1K": 1 << 10, "1k": 1 << 10, "512M": 512 << 20, "1G": 1 << 30, "64GiB": 64 << 30,
		"2T": 2 << 40, "0x1000": 4096, " 8M ": 8 << 20, "16KB": 16 << 10, "0": 0,
	}
	for s, want := range good {
		got, err := ParseSize(s)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "G", "1X", "-1", "1.5G", "abc", "99999999999T", "1GG"} {
		if v, err := ParseSize(s); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ParseSize(%q) = %d, %v; want ErrInvalidArgument", s, v, err)
		}
	}
}

func TestOptionsResolve(t *testing.T) {
	t.Setenv(EnvArenaSize, "")
	t.Setenv(EnvTCPAddr, "")
	t.Setenv(EnvGIDIndex, "")
	o, err := Options{}.Resolve()
	if err != nil || o.ArenaSize != DefaultArenaSize || o.ListenAddr != ":0" || o.SetGIDIndex {
		t.Fatalf("defaults: %+v, %v", o, err)
	}
	t.Setenv(EnvArenaSize, "1G")
	t.Setenv(EnvTCPAddr, "127.0.0.1:7000")
	t.Setenv(EnvGIDIndex, "3")
	o, err = Options{}.Resolve()
	if err != nil || o.ArenaSize != 1<<30 || o.ListenAddr != "127.0.0.1:7000" || !o.SetGIDIndex || o.GIDIndex != 3 {
		t.Fatalf("from the environment: %+v, %v", o, err)
	}
	// Explicit fields win over the environment.
	o, err = Options{ArenaSize: 1 << 20, ListenAddr: ":9", GIDIndex: 0, SetGIDIndex: true}.Resolve()
	if err != nil || o.ArenaSize != 1<<20 || o.ListenAddr != ":9" || o.GIDIndex != 0 {
		t.Fatalf("explicit: %+v, %v", o, err)
	}
	// A malformed value is an error, never ignored.
	for env, val := range map[string]string{EnvArenaSize: "lots", EnvGIDIndex: "x"} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, val)
			if _, err := (Options{}).Resolve(); !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("%s=%s: %v", env, val, err)
			}
		})
	}
	if _, err := (Options{ArenaSize: -1}).Resolve(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal("negative arena size accepted")
	}
	if _, err := (Options{GIDIndex: 300, SetGIDIndex: true}).Resolve(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal("GID index 300 accepted")
	}
}

func TestOptionsTCPBusyPoll(t *testing.T) {
	t.Setenv(EnvBusyPoll, "")
	if o, err := (Options{}).Resolve(); err != nil || o.TCPBusyPoll != DefaultTCPBusyPoll {
		t.Fatalf("default: %v, %v", o.TCPBusyPoll, err)
	}
	for val, want := range map[string]time.Duration{"0": -1, "0s": -1, "20us": 20 * time.Microsecond, "1ms": time.Millisecond} {
		t.Setenv(EnvBusyPoll, val)
		if o, err := (Options{}).Resolve(); err != nil || o.TCPBusyPoll != want {
			t.Errorf("%s=%s: %v, %v; want %v", EnvBusyPoll, val, o.TCPBusyPoll, err, want)
		}
	}
	// The field wins over the environment.
	if o, err := (Options{TCPBusyPoll: -1}).Resolve(); err != nil || o.TCPBusyPoll != -1 {
		t.Fatalf("explicit off: %v, %v", o.TCPBusyPoll, err)
	}
	for _, val := range []string{"x", "-5us", "2s", "50"} {
		t.Setenv(EnvBusyPoll, val)
		if _, err := (Options{}).Resolve(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s=%s accepted: %v", EnvBusyPoll, val, err)
		}
	}
	t.Setenv(EnvBusyPoll, "")
	if _, err := (Options{TCPBusyPoll: 2 * time.Second}).Resolve(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal("a 2s busy poll accepted")
	}
}
