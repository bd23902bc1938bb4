package collperf

// -J/--output_file FILE.json: nccl-tests' JSON report (util.cu, file
// version 3), written by rank 0: the command line and environment, the
// configuration, the ranks, one record per size with its out-of-place and
// in-place figures, and the two summary lines. Built in the rank's
// benchmark goroutine, written at the end. Environment variables whose
// names suggest a credential are written without their value.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// jsonTimeFormat is nccl-tests' TIME_STRING_FORMAT.
const jsonTimeFormat = "2006-01-02 15:04:05"

// jsonFloat is a double as nccl-tests writes it: "%lf", and "nan" (a
// string) for what is not a number.
type jsonFloat float64

func (f jsonFloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte(`"nan"`), nil
	}
	return strconv.AppendFloat(nil, v, 'f', 6, 64), nil
}

type jsonConfig struct {
	NThreads      int  `json:"nthreads"`
	NGpus         int  `json:"ngpus"`
	MinimumBytes  int  `json:"minimum_bytes"`
	MaximumBytes  int  `json:"maximum_bytes"`
	StepFactor    *int `json:"step_factor,omitempty"`
	StepBytes     *int `json:"step_bytes,omitempty"`
	WarmupIters   int  `json:"warmup_iters"`
	Iterations    int  `json:"iterations"`
	AggIterations int  `json:"aggregated_iterations"`
	Validation    int  `json:"validation"`
	Graph         int  `json:"graph"`
	Blocking      bool `json:"blocking_collectives"`
	PerIterTiming bool `json:"per_iter_timing"`
	PerIterSkip   int  `json:"per_iter_skip"`
	ParallelInit  bool `json:"parallel_init"`
}

type jsonDevice struct {
	Rank       int    `json:"rank"`
	Group      int    `json:"group"`
	Pid        int    `json:"pid"`
	Hostname   string `json:"hostname"`
	Device     int    `json:"device"`
	DeviceHex  string `json:"device_hex"`
	DeviceInfo string `json:"device_info"`
}

// jsonFigures is one column group: time (or cpu_time), algbw, busbw, and
// the wrong elements (null without -c).
type jsonFigures struct {
	Time    *jsonFloat `json:"time,omitempty"`
	CPUTime *jsonFloat `json:"cpu_time,omitempty"`
	AlgBW   jsonFloat  `json:"alg_bw"`
	BusBW   jsonFloat  `json:"bus_bw"`
	NWrong  *jsonFloat `json:"nwrong"`
}

type jsonResult struct {
	Size           int          `json:"size"`
	Count          int          `json:"count"`
	Type           string       `json:"type"`
	RedOp          string       `json:"redop"`
	Root           string       `json:"root"` // "%6i", as nccl-tests
	OutOfPlace     *jsonFigures `json:"out_of_place"`
	InPlace        *jsonFigures `json:"in_place"`
	ActualIters    int          `json:"actual_iterations"`
	ExperimentName string       `json:"experiment_name"`
}

type jsonCheck struct {
	Count int  `json:"count"`
	Okay  bool `json:"okay"`
}

type jsonAvgBW struct {
	Bandwidth jsonFloat `json:"bandwidth"`
	Okay      any       `json:"okay"` // true/false, or "unchecked"
}

type jsonReport struct {
	Version     int          `json:"version"`
	StartTime   string       `json:"start_time"`
	Args        []string     `json:"args"`
	Env         []string     `json:"env"`
	NCCLVersion int          `json:"nccl_version"`
	Config      jsonConfig   `json:"config"`
	Devices     []jsonDevice `json:"devices"`
	Results     []jsonResult `json:"results"`
	OutOfBounds jsonCheck    `json:"out_of_bounds"`
	AvgBusBW    jsonAvgBW    `json:"average_bus_bandwidth"`
	EndTime     string       `json:"end_time"`
}

func newJSONReport(p *collPerfFlags, args, env []string, now time.Time) *jsonReport {
	r := &jsonReport{Version: 3, StartTime: now.Format(jsonTimeFormat), Args: args, Env: redactEnv(env),
		Config: jsonConfig{NThreads: p.nThreads, NGpus: p.nGpus, MinimumBytes: p.minBytes, MaximumBytes: p.maxBytes,
			WarmupIters: p.warmup, Iterations: p.iters, AggIterations: p.aggIters, Validation: p.check,
			Graph: p.cudaGraph, Blocking: p.blocking != 0, ParallelInit: p.parallelInit != 0},
		Devices: []jsonDevice{}, Results: []jsonResult{}}
	if p.stepFactor > 1 {
		r.Config.StepFactor = &p.stepFactor
	} else {
		r.Config.StepBytes = &p.stepBytes
	}
	return r
}

// figures makes one column group.
func figures(cpuTime bool, usec, algbw, busbw float64, check bool, wrong int64) *jsonFigures {
	f := &jsonFigures{AlgBW: jsonFloat(algbw), BusBW: jsonFloat(busbw)}
	t := jsonFloat(usec)
	if cpuTime {
		f.CPUTime = &t
	} else {
		f.Time = &t
	}
	if check {
		w := jsonFloat(wrong)
		f.NWrong = &w
	}
	return f
}

// redactEnv keeps each variable, without the value of those whose name
// says it holds a credential.
func redactEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		u := strings.ToUpper(k)
		for _, w := range []string{"SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "KEY"} {
			if strings.Contains(u, w) {
				kv = k + "=(not written)"
				break
			}
		}
		out = append(out, kv)
	}
	return out
}

// createExclusive creates path, or path.0, path.1 ... where it exists (as
// nccl-tests), and returns the name it created.
func createExclusive(path string) (*os.File, string, error) {
	name := path
	for i := 0; ; i++ {
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			return f, name, nil
		}
		if !errors.Is(err, fs.ErrExist) || i >= 1000 {
			return nil, name, err
		}
		name = fmt.Sprintf("%s.%d", path, i)
	}
}

// write writes the report, closing the top-level object.
func (r *jsonReport) write(f *os.File, end time.Time) error {
	r.EndTime = end.Format(jsonTimeFormat)
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		return err
	}
	return f.Close()
}
