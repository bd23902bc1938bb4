package coll

// Launcher environments. Everything here runs in the caller's goroutine;
// under a launcher, rank 0's InitFromEnv starts the rendezvous root's
// goroutines in its process.

import (
	"context"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"strconv"
	"strings"
)

// Launcher environment variables understood by InitFromEnv.
const (
	// EnvRank and EnvNRanks set rank and size directly (they win over
	// every launcher's); coll-perf --ranks uses them.
	EnvRank   = "RDMAKIT_COLL_RANK"
	EnvNRanks = "RDMAKIT_COLL_NRANKS"
	// EnvAddr is the rendezvous address host:port. Rank 0 listens on its
	// port; the others connect to it. Under torchrun-style launchers it
	// defaults to MASTER_ADDR:MASTER_PORT; under Slurm to the first node
	// of the step on DefaultPort.
	EnvAddr = "RDMAKIT_COLL_ADDR"
	// EnvPort overrides the port when EnvAddr is not set.
	EnvPort = "RDMAKIT_COLL_PORT"
	// EnvID is a unique id (UniqueID.String) whose root already runs,
	// e.g. in a launcher process; with it no rank serves the rendezvous.
	EnvID = "RDMAKIT_COLL_ID"
)

// DefaultPort is the rendezvous port when only a host is known.
const DefaultPort = 29517

// Launch is where a rank stands according to its launcher.
type Launch struct {
	Launcher  string // "rdmakit", "torchrun", "openmpi", "pmi", "slurm", "kubernetes"
	Rank      int
	NRanks    int
	LocalRank int    // -1 when the launcher does not say
	Addr      string // rendezvous host:port
	ID        string // a unique id from RDMAKIT_COLL_ID, if set (then Addr is its root's)
}

// DetectLaunch reads the launcher environment: RDMAKIT_COLL_RANK/NRANKS;
// Open MPI (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK); torchrun and other
// PyTorch launchers (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT); MPICH/Hydra (PMI_RANK/PMI_SIZE); Slurm (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST); Kubernetes indexed
// Jobs (JOB_COMPLETION_INDEX, with WORLD_SIZE or RDMAKIT_COLL_NRANKS for
// the size). The rendezvous address is RDMAKIT_COLL_ADDR, else
// MASTER_ADDR:MASTER_PORT, else (Slurm) the step's first node, else (Open
// MPI with every rank on one host) loopback on a port derived from the
// job id.
func DetectLaunch() (Launch, error) { return detectLaunch(os.Getenv) }

func detectLaunch(getenv func(string) string) (Launch, error) {
	atoi := func(name string) (int, bool, error) {
		s := getenv(name)
		if s == "" {
			return 0, false, nil
		}
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || v < 0 {
			return 0, true, fmt.Errorf("%w: %s=%q is not a non-negative integer", ErrInvalidArgument, name, s)
		}
		return v, true, nil
	}
	l := Launch{LocalRank: -1}
	type source struct {
		name, rank, size, local string
	}
	sources := []source{
		{"rdmakit", EnvRank, EnvNRanks, ""},
		{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
		{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
		{"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
		{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
		{"kubernetes", "JOB_COMPLETION_INDEX", "", ""},
	}
	found := false
	for _, s := range sources {
		r, ok, err := atoi(s.rank)
		if err != nil {
			return l, err
		}
		if !ok {
			continue
		}
		l.Launcher, l.Rank, found = s.name, r, true
		if s.size != "" {
			n, ok, err := atoi(s.size)
			if err != nil {
				return l, err
			}
			if !ok {
				return l, fmt.Errorf("%w: %s is set but %s is not", ErrInvalidArgument, s.rank, s.size)
			}
			l.NRanks = n
		} else {
			for _, name := range []string{EnvNRanks, "WORLD_SIZE"} {
				n, ok, err := atoi(name)
				if err != nil {
					return l, err
				}
				if ok {
					l.NRanks = n
					break
				}
			}
			if l.NRanks == 0 {
				return l, fmt.Errorf("%w: JOB_COMPLETION_INDEX is set; also set WORLD_SIZE or %s to the Job's completions", ErrInvalidArgument, EnvNRanks)
			}
		}
		if s.local != "" {
			if v, ok, _ := atoi(s.local); ok {
				l.LocalRank = v
			}
		}
		break
	}
	if !found {
		return l, ErrNoLauncher
	}
	if l.NRanks < 1 || l.Rank >= l.NRanks {
		return l, fmt.Errorf("%w: rank %d of %d (%s)", ErrInvalidArgument, l.Rank, l.NRanks, l.Launcher)
	}
	if s := getenv(EnvID); s != "" {
		id, err := ParseUniqueID(s)
		if err != nil {
			return l, fmt.Errorf("%s: %w", EnvID, err)
		}
		l.ID, l.Addr = s, id.Addr()
		return l, nil
	}
	port := getenv(EnvPort)
	if port == "" {
		port = getenv("MASTER_PORT")
	}
	if port == "" {
		port = strconv.Itoa(DefaultPort)
	}
	switch {
	case getenv(EnvAddr) != "":
		l.Addr = getenv(EnvAddr)
		if _, _, err := net.SplitHostPort(l.Addr); err != nil {
			l.Addr = net.JoinHostPort(l.Addr, port)
		}
	case getenv("MASTER_ADDR") != "":
		l.Addr = net.JoinHostPort(getenv("MASTER_ADDR"), port)
	case getenv("SLURM_STEP_NODELIST") != "" || getenv("SLURM_JOB_NODELIST") != "":
		list := getenv("SLURM_STEP_NODELIST")
		if list == "" {
			list = getenv("SLURM_JOB_NODELIST")
		}
		l.Addr = net.JoinHostPort(firstSlurmNode(list), port)
	case l.NRanks == 1:
		l.Addr = "127.0.0.1:0"
	case l.Launcher == "openmpi" && getenv("OMPI_COMM_WORLD_LOCAL_SIZE") == getenv("OMPI_COMM_WORLD_SIZE"):
		// Every rank on this host: rendezvous on loopback, on a port
		// derived from the job id so that concurrent jobs do not meet.
		h := fnv.New32a()
		h.Write([]byte(getenv("OMPI_MCA_ess_base_jobid") + getenv("OMPI_MCA_orte_ess_jobid") + getenv("PMIX_NAMESPACE")))
		if getenv(EnvPort) == "" && getenv("MASTER_PORT") == "" {
			port = strconv.Itoa(DefaultPort + 1 + int(h.Sum32()%2000))
		}
		l.Addr = net.JoinHostPort("127.0.0.1", port)
	default:
		return l, fmt.Errorf("%w: %s found rank %d of %d but no rendezvous address: set %s=host:port of rank 0 (with mpirun: -x %s)",
			ErrInvalidArgument, l.Launcher, l.Rank, l.NRanks, EnvAddr, EnvAddr)
	}
	return l, nil
}

// firstSlurmNode returns the first host of a Slurm node list such as
// "gpu[01-04,07],cpu3".
func firstSlurmNode(list string) string {
	list = strings.TrimSpace(list)
	end := len(list)
	if i := strings.IndexAny(list, ",["); i >= 0 {
		end = i
	}
	host := list[:end]
	if end < len(list) && list[end] == '[' {
		inner := list[end+1:]
		j := strings.IndexAny(inner, ",-]")
		if j > 0 {
			host += inner[:j]
		}
	}
	return host
}

// InitFromEnv creates the communicator described by the launcher
// environment (see DetectLaunch): rank 0 serves the rendezvous on the
// address's port, every rank connects to it.
func InitFromEnv(ctx context.Context, opts *Options) (*Comm, error) {
	l, err := DetectLaunch()
	if err != nil {
		return nil, err
	}
	return InitLaunch(ctx, l, opts)
}

// InitLaunch is InitFromEnv with the launch already known.
func InitLaunch(ctx context.Context, l Launch, opts *Options) (*Comm, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	o, err := o.resolve()
	if err != nil {
		return nil, err
	}
	if l.ID != "" {
		id, err := ParseUniqueID(l.ID)
		if err != nil {
			return nil, err
		}
		return newComm(ctx, id.Addr(), id.nonce(), l.NRanks, l.Rank, o, nil)
	}
	// Every rank derives the same nonce from what they all see.
	h := fnv.New64a()
	fmt.Fprintf(h, "%s|%d|%s|%s|%s|%s", l.Addr, l.NRanks, os.Getenv("SLURM_JOB_ID"), os.Getenv("TORCHELASTIC_RUN_ID"),
		os.Getenv("OMPI_MCA_ess_base_jobid"), os.Getenv("RDMAKIT_COLL_JOB"))
	nonce := h.Sum64()
	var r *root
	addr := l.Addr
	if l.Rank == 0 {
		_, port, err := net.SplitHostPort(l.Addr)
		if err != nil {
			return nil, fmt.Errorf("%w: rendezvous address %q: %v", ErrInvalidArgument, l.Addr, err)
		}
		listen := ":" + port
		if host, _, _ := net.SplitHostPort(l.Addr); host == "127.0.0.1" || host == "localhost" || host == "::1" {
			listen = net.JoinHostPort(host, port)
		}
		if r, err = startRoot(listen, nonce, o.BootstrapTimeout); err != nil {
			return nil, err
		}
		if port == "0" {
			addr = r.ln.Addr().String()
		}
	}
	c, err := newComm(ctx, addr, nonce, l.NRanks, l.Rank, o, r)
	if err != nil && r != nil {
		r.close()
	}
	return c, err
}
