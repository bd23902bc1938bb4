package coll

import (
	"fmt"
	"strings"

	"github.com/rdmakit/rdmakit/coll/internal/reduce"
)

// DataType is the element type of a collective's buffers.
type DataType uint8

// Element types. Float16 is IEEE 754 binary16 and BFloat16 the upper half
// of a binary32, both stored as 16-bit little-endian words.
const (
	Int8     DataType = DataType(reduce.Int8)
	Uint8    DataType = DataType(reduce.Uint8)
	Int32    DataType = DataType(reduce.Int32)
	Uint32   DataType = DataType(reduce.Uint32)
	Int64    DataType = DataType(reduce.Int64)
	Uint64   DataType = DataType(reduce.Uint64)
	Float16  DataType = DataType(reduce.Float16)
	BFloat16 DataType = DataType(reduce.BFloat16)
	Float32  DataType = DataType(reduce.Float32)
	Float64  DataType = DataType(reduce.Float64)
)

// DataTypes lists every element type.
var DataTypes = []DataType{Int8, Uint8, Int32, Uint32, Int64, Uint64, Float16, BFloat16, Float32, Float64}

var typeNames = [...]string{"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64"}

// NCCLName returns the name nccl-tests prints for t (half, float, double
// for the IEEE floating-point types).
func (t DataType) NCCLName() string {
	switch t {
	case Float16:
		return "half"
	case Float32:
		return "float"
	case Float64:
		return "double"
	}
	return t.String()
}

func (t DataType) String() string {
	if int(t) < len(typeNames) {
		return typeNames[t]
	}
	return fmt.Sprintf("DataType(%d)", uint8(t))
}

// Size returns the size of one element in bytes.
func (t DataType) Size() int {
	if !t.valid() {
		return 0
	}
	return reduce.Size(reduce.Type(t))
}

func (t DataType) valid() bool { return int(t) < len(typeNames) }

// ParseDataType parses a type name: ours (float32), NCCL's (ncclFloat32,
// ncclHalf) or nccl-tests' (float, half, double, char, int).
func ParseDataType(s string) (DataType, error) {
	n := strings.ToLower(strings.TrimPrefix(strings.TrimPrefix(s, "nccl"), "NCCL"))
	switch n {
	case "int8", "char", "i8":
		return Int8, nil
	case "uint8", "u8", "byte":
		return Uint8, nil
	case "int32", "int", "i32":
		return Int32, nil
	case "uint32", "u32":
		return Uint32, nil
	case "int64", "i64":
		return Int64, nil
	case "uint64", "u64":
		return Uint64, nil
	case "float16", "half", "fp16", "f16":
		return Float16, nil
	case "bfloat16", "bf16":
		return BFloat16, nil
	case "float32", "float", "fp32", "f32":
		return Float32, nil
	case "float64", "double", "fp64", "f64":
		return Float64, nil
	}
	return 0, fmt.Errorf("%w: unknown data type %q", ErrInvalidArgument, s)
}

// RedOp is a reduction operator.
type RedOp uint8

// Reduction operators. Avg is Sum divided by the number of ranks, the
// division applied once to the final sum (integers truncate toward zero).
// Min and Max of floating-point values propagate NaN (float32, float64);
// for float16 and bfloat16 they compare sign and magnitude bits, which
// orders -0 below +0 and NaN beyond infinity.
const (
	Sum RedOp = iota
	Prod
	Min
	Max
	Avg
)

// RedOps lists every operator.
var RedOps = []RedOp{Sum, Prod, Min, Max, Avg}

var opNames = [...]string{"sum", "prod", "min", "max", "avg"}

func (o RedOp) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("RedOp(%d)", uint8(o))
}

func (o RedOp) valid() bool { return int(o) < len(opNames) }

// kernel is the operator the reduction kernels apply (Avg sums).
func (o RedOp) kernel() reduce.Op {
	if o == Avg {
		return reduce.Sum
	}
	return reduce.Op(o)
}

// ParseRedOp parses sum, prod, min, max or avg (with or without NCCL's
// "nccl" prefix).
func ParseRedOp(s string) (RedOp, error) {
	n := strings.ToLower(strings.TrimPrefix(strings.TrimPrefix(s, "nccl"), "NCCL"))
	for i, name := range opNames {
		if n == name {
			return RedOp(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown reduction %q", ErrInvalidArgument, s)
}

// Algorithm selects how AllReduce, AllGather, ReduceScatter, Broadcast
// and Reduce move data.
type Algorithm uint8

// Algorithms. AlgoRing pipelines chunks around a ring (bandwidth-optimal);
// AlgoTree uses recursive doubling for AllReduce and binomial trees for
// Broadcast and Reduce (fewer steps, for small messages); AlgoDirect sends
// every rank's part straight to every rank that needs it, in one step (for
// small messages among more than two ranks): AllReduce exchanges whole
// vectors and every rank reduces them in rank order, AllGather and
// ReduceScatter send each block to its destination at once. AllGather and
// ReduceScatter have no tree (AlgoTree means ring for them); Broadcast and
// Reduce have no direct form (AlgoDirect means tree for them). AllToAll
// always exchanges directly. AlgoHalving is recursive halving and
// doubling: AllReduce by Rabenseifner's algorithm (a reduce-scatter by
// recursive halving, then an all-gather by recursive doubling: the ring's
// bytes in 2 log₂ n steps), AllGather by recursive doubling when the rank
// count is a power of two (else the ring); ReduceScatter uses the ring and
// Broadcast and Reduce the tree.
const (
	AlgoAuto Algorithm = iota
	AlgoRing
	AlgoTree
	AlgoDirect
	AlgoHalving
)

func (a Algorithm) String() string {
	switch a {
	case AlgoAuto:
		return "auto"
	case AlgoRing:
		return "ring"
	case AlgoTree:
		return "tree"
	case AlgoDirect:
		return "direct"
	case AlgoHalving:
		return "halving"
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// ParseAlgorithm parses ring, tree, direct, halving or auto
// (case-insensitive, as NCCL_ALGO).
func ParseAlgorithm(s string) (Algorithm, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return AlgoAuto, nil
	case "ring":
		return AlgoRing, nil
	case "tree", "rd", "recursive_doubling":
		return AlgoTree, nil
	case "direct", "one_shot", "oneshot":
		return AlgoDirect, nil
	case "halving", "rabenseifner", "rhd":
		return AlgoHalving, nil
	}
	return 0, fmt.Errorf("%w: unknown algorithm %q (ring, tree, direct, halving or auto)", ErrInvalidArgument, s)
}

// Protocol selects how small messages travel between ranks of one host.
type Protocol uint8

// Protocols. ProtoLL packs messages of up to 128 bytes on shm into 8-byte
// words that carry their own flag (one write and one poll per message);
// ProtoSimple writes the data and then a separate flag word. Auto is LL
// where it applies. Every rank must use the same protocol.
const (
	ProtoAuto Protocol = iota
	ProtoLL
	ProtoSimple
)

func (p Protocol) String() string {
	switch p {
	case ProtoAuto:
		return "auto"
	case ProtoLL:
		return "LL"
	case ProtoSimple:
		return "Simple"
	}
	return fmt.Sprintf("Protocol(%d)", uint8(p))
}

// ParseProtocol parses LL, Simple or auto (case-insensitive, as
// NCCL_PROTO; LL128 is taken as LL).
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return ProtoAuto, nil
	case "ll", "ll128":
		return ProtoLL, nil
	case "simple":
		return ProtoSimple, nil
	}
	return 0, fmt.Errorf("%w: unknown protocol %q (LL, Simple or auto)", ErrInvalidArgument, s)
}
