package conformance

// The parent test process drives a child peer over the child's stdin and
// stdout, one JSON request and one JSON response per line. Calls are
// serialised by remotePeer.mu; the child executes them one at a time on its
// main goroutine (FetchAddLoop fans out inside the child).

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/rdmakit/rdmakit/internal/reexec"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// peerRole is the role (internal/reexec) of a peer process.
const peerRole = "conformance-peer"

func init() { reexec.Register(peerRole, servePeer) }

type request struct {
	M string
	A json.RawMessage
}

type response struct {
	R json.RawMessage
	E string
	// Code names the verbs sentinel or completion status E wraps, so that
	// errors.Is works on the parent's side as on the child's.
	Code string `json:",omitempty"`
}

// sentinels are the errors whose identity crosses the process boundary.
var sentinels = map[string]error{
	"ErrNoDevice": verbs.ErrNoDevice, "ErrNotSupported": verbs.ErrNotSupported,
	"ErrInvalidArgument": verbs.ErrInvalidArgument, "ErrInvalidState": verbs.ErrInvalidState,
	"ErrQueueFull": verbs.ErrQueueFull, "ErrCQOverflow": verbs.ErrCQOverflow, "ErrClosed": verbs.ErrClosed,
	"ErrBusy": verbs.ErrBusy, "ErrNoMemory": verbs.ErrNoMemory,
}

// errCode returns the name of the sentinel (or "status N") err wraps.
func errCode(err error) string {
	for name, s := range sentinels {
		if errors.Is(err, s) {
			return name
		}
	}
	var st verbs.Status
	if errors.As(err, &st) {
		return fmt.Sprintf("status %d", uint32(st))
	}
	return ""
}

// remoteError rebuilds an error of the child: its message, wrapping the
// sentinel or status the child's error wrapped.
type remoteError struct {
	msg  string
	code error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.code }

func decodeErr(msg, code string) error {
	if s, ok := sentinels[code]; ok {
		return &remoteError{msg, s}
	}
	var n uint32
	if _, err := fmt.Sscanf(code, "status %d", &n); err == nil {
		return &remoteError{msg, verbs.Status(n)}
	}
	return errors.New(msg)
}

type args struct {
	Idx     int
	Idxs    []int
	O       QPOpts
	Info    QPInfo
	ID      uint64
	Region  string
	Off, N  int
	Lens    []int
	WRs     []WR
	Recv    bool
	Timeout time.Duration
	Seed    byte
	Addr    uint64
	RKey    uint32
}

// ServePeerIfChild turns the process into a conformance peer (or whatever
// other role internal/reexec started it in) when the test binary was
// started as one by Run. Call it first thing in TestMain.
func ServePeerIfChild() { reexec.Init() }

// servePeer serves a LocalPeer on the device argv[0] over stdin/stdout.
func servePeer(argv []string) int {
	out := json.NewEncoder(os.Stdout)
	if len(argv) != 1 {
		out.Encode(response{E: "peer: want one argument, the device"})
		return 2
	}
	p, err := NewLocalPeer(argv[0])
	if err != nil {
		out.Encode(response{E: "open: " + err.Error(), Code: errCode(err)})
		return 1
	}
	out.Encode(response{})
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			out.Encode(response{E: "bad request: " + err.Error()})
			continue
		}
		var a args
		json.Unmarshal(req.A, &a)
		r, err := dispatch(p, req.M, &a)
		resp := response{}
		if err != nil {
			resp.E, resp.Code = err.Error(), errCode(err)
		}
		if r != nil {
			resp.R, _ = json.Marshal(r)
		}
		out.Encode(resp)
	}
	p.Close()
	return 0
}

func dispatch(p Peer, m string, a *args) (any, error) {
	switch m {
	case "Regions":
		return p.Regions()
	case "NewQP":
		return p.NewQP(a.O)
	case "Connect":
		return nil, p.Connect(a.Idx, a.Info, a.O)
	case "CloseQP":
		return nil, p.CloseQP(a.Idx)
	case "PostRecv":
		return nil, p.PostRecv(a.Idx, a.ID, a.Region, a.Off, a.Lens)
	case "PostSend":
		return nil, p.PostSend(a.Idx, a.WRs)
	case "Poll":
		return p.Poll(a.Idx, a.Recv, a.N, a.Timeout)
	case "State":
		return p.State(a.Idx)
	case "Hash":
		return p.Hash(a.Region, a.Off, a.N)
	case "Fill":
		return nil, p.Fill(a.Region, a.Off, a.N, a.Seed)
	case "Read":
		return p.Read(a.Region, a.Off, a.N)
	case "FetchAddLoop":
		return nil, p.FetchAddLoop(a.Idxs, a.N, a.Addr, a.RKey)
	}
	return nil, fmt.Errorf("unknown method %q", m)
}

// remotePeer is a Peer in a child process.
type remotePeer struct {
	cmd *exec.Cmd

	// mu serialises calls; it guards in and out.
	mu  sync.Mutex
	in  io.WriteCloser
	out *bufio.Scanner
}

// StartRemotePeer starts the current test binary as a peer on device.
func StartRemotePeer(device string) (*remotePeer, error) {
	cmd := reexec.Command(peerRole, []string{device})
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(outp)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	p := &remotePeer{cmd: cmd, in: in, out: sc}
	var hello response
	if !sc.Scan() {
		p.Kill()
		return nil, errors.New("peer process exited before saying hello")
	}
	if err := json.Unmarshal(sc.Bytes(), &hello); err != nil || hello.E != "" {
		p.Kill()
		return nil, fmt.Errorf("peer process: %v %s", err, hello.E)
	}
	return p, nil
}

func (p *remotePeer) call(m string, a args, r any) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	raw, _ := json.Marshal(a)
	b, _ := json.Marshal(request{M: m, A: raw})
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("peer %s: %w", m, err)
	}
	if !p.out.Scan() {
		return fmt.Errorf("peer %s: peer process gone", m)
	}
	var resp response
	if err := json.Unmarshal(p.out.Bytes(), &resp); err != nil {
		return fmt.Errorf("peer %s: %w", m, err)
	}
	if resp.E != "" {
		return decodeErr(resp.E, resp.Code)
	}
	if r != nil && resp.R != nil {
		return json.Unmarshal(resp.R, r)
	}
	return nil
}

func (p *remotePeer) Regions() (map[string]Region, error) {
	var r map[string]Region
	return r, p.call("Regions", args{}, &r)
}

func (p *remotePeer) NewQP(o QPOpts) (QPInfo, error) {
	var r QPInfo
	return r, p.call("NewQP", args{O: o}, &r)
}

func (p *remotePeer) Connect(idx int, info QPInfo, o QPOpts) error {
	return p.call("Connect", args{Idx: idx, Info: info, O: o}, nil)
}

func (p *remotePeer) CloseQP(idx int) error { return p.call("CloseQP", args{Idx: idx}, nil) }

func (p *remotePeer) PostRecv(idx int, id uint64, region string, off int, lens []int) error {
	return p.call("PostRecv", args{Idx: idx, ID: id, Region: region, Off: off, Lens: lens}, nil)
}

func (p *remotePeer) PostSend(idx int, wrs []WR) error {
	return p.call("PostSend", args{Idx: idx, WRs: wrs}, nil)
}

func (p *remotePeer) Poll(idx int, recv bool, n int, timeout time.Duration) ([]WC, error) {
	var r []WC
	return r, p.call("Poll", args{Idx: idx, Recv: recv, N: n, Timeout: timeout}, &r)
}

func (p *remotePeer) State(idx int) (s0 verbs.QPState, err error) {
	return s0, p.call("State", args{Idx: idx}, &s0)
}

func (p *remotePeer) Hash(region string, off, n int) (string, error) {
	var r string
	return r, p.call("Hash", args{Region: region, Off: off, N: n}, &r)
}

func (p *remotePeer) Fill(region string, off, n int, seed byte) error {
	return p.call("Fill", args{Region: region, Off: off, N: n, Seed: seed}, nil)
}

func (p *remotePeer) Read(region string, off, n int) ([]byte, error) {
	var r []byte
	return r, p.call("Read", args{Region: region, Off: off, N: n}, &r)
}

func (p *remotePeer) FetchAddLoop(idxs []int, n int, addr uint64, rkey uint32) error {
	return p.call("FetchAddLoop", args{Idxs: idxs, N: n, Addr: addr, RKey: rkey}, nil)
}

func (p *remotePeer) Close() error {
	p.in.Close()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		return <-done
	}
}

// Kill ends the peer process abruptly, as a crash would.
func (p *remotePeer) Kill() {
	p.cmd.Process.Kill()
	p.in.Close()
	p.cmd.Wait()
}
