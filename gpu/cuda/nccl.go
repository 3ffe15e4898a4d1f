package cuda

import (
	"errors"
	"fmt"
	"sync"

	"github.com/strata-ai/strata/gpu"
)

// The NCCL binding: libnccl.so.2 loaded at run time through purego, found
// as the other libraries are (lib.go: $STRATA_CUDA_LIB_DIR, the system
// folders, the loader's search, then the nvidia/*/lib folders of Python
// installations, where the nvidia-nccl wheels put it). Only what the
// collectives of one process need is bound. The declarations follow
// NCCL's public nccl.h; nccl_test.go checks every enum value, the size of
// ncclUniqueId and each function's parameters against copies of it in
// testdata/ (no GPU needed).

var libNCCL = library{what: "nccl", names: []string{"libnccl.so.2", "libnccl.so"}}

// errNoNCCL is wrapped by the error of a process where libnccl cannot be
// loaded (none installed or found): the rank-order path runs there.
var errNoNCCL = errors.New("no NCCL library")

// ncclResult is ncclResult_t.
type ncclResult int32

// ncclResult_t values (nccl.h).
const (
	ncclSuccess            ncclResult = 0
	ncclUnhandledCudaError ncclResult = 1
	ncclSystemError        ncclResult = 2
	ncclInternalError      ncclResult = 3
	ncclInvalidArgument    ncclResult = 4
	ncclInvalidUsage       ncclResult = 5
	ncclRemoteError        ncclResult = 6
	ncclInProgress         ncclResult = 7
	ncclTimeout            ncclResult = 8
)

// ncclResultNames names each ncclResult_t value, for errors.
var ncclResultNames = map[ncclResult]string{
	ncclSuccess: "ncclSuccess", ncclUnhandledCudaError: "ncclUnhandledCudaError", ncclSystemError: "ncclSystemError",
	ncclInternalError: "ncclInternalError", ncclInvalidArgument: "ncclInvalidArgument", ncclInvalidUsage: "ncclInvalidUsage",
	ncclRemoteError: "ncclRemoteError", ncclInProgress: "ncclInProgress", ncclTimeout: "ncclTimeout",
}

// ncclDataType is ncclDataType_t.
type ncclDataType int32

// ncclDataType_t values (nccl.h) of the dtypes a gpu.Buffer holds.
const (
	ncclInt32    ncclDataType = 2
	ncclFloat16  ncclDataType = 6
	ncclFloat32  ncclDataType = 7
	ncclFloat64  ncclDataType = 8
	ncclBfloat16 ncclDataType = 9
)

// ncclRedOp is ncclRedOp_t.
type ncclRedOp int32

// ncclRedOp_t values (nccl.h) of gpu.Sum and gpu.Avg.
const (
	ncclSum ncclRedOp = 0
	ncclAvg ncclRedOp = 4
)

// ncclUniqueIDBytes is NCCL_UNIQUE_ID_BYTES.
const ncclUniqueIDBytes = 128

// ncclUniqueID is ncclUniqueId, passed by value to ncclCommInitRank (purego
// places a struct of more than 16 bytes on the stack, as the System V ABI
// does).
type ncclUniqueID struct {
	Internal [ncclUniqueIDBytes]byte
}

// ncclMinVersion is the oldest NCCL the backend uses: 2.10 added ncclAvg
// and bf16 reductions.
const ncclMinVersion = 21000

// ncclAPI is the part of libnccl the backend calls. Field names are the C
// functions' names (nccl_test.go matches them with the header). Device
// pointers are passed as uint64, streams and communicators as uintptr.
type ncclAPI struct {
	path    string
	version int // NCCL_VERSION_CODE of the loaded library

	ncclGetVersion     func(version *int32) ncclResult
	ncclGetErrorString func(result ncclResult) *byte
	ncclGetUniqueId    func(uniqueID *ncclUniqueID) ncclResult
	ncclCommInitRank   func(comm *uintptr, nranks int32, commID ncclUniqueID, rank int32) ncclResult
	ncclCommDestroy    func(comm uintptr) ncclResult
	ncclGroupStart     func() ncclResult
	ncclGroupEnd       func() ncclResult
	ncclAllGather      func(sendbuff, recvbuff uint64, sendcount uint64, datatype ncclDataType, comm, stream uintptr) ncclResult
	ncclReduceScatter  func(sendbuff, recvbuff uint64, recvcount uint64, datatype ncclDataType, op ncclRedOp, comm, stream uintptr) ncclResult
	ncclAllReduce      func(sendbuff, recvbuff uint64, count uint64, datatype ncclDataType, op ncclRedOp, comm, stream uintptr) ncclResult
	ncclBroadcast      func(sendbuff, recvbuff uint64, count uint64, datatype ncclDataType, root int32, comm, stream uintptr) ncclResult
}

var (
	ncclOnce sync.Once
	theNCCL  *ncclAPI
	ncclErr  error
)

// loadNCCL loads libnccl once per process. The error says what was tried
// and how to point the backend at the library.
func loadNCCL(sp searchPath) (*ncclAPI, error) {
	ncclOnce.Do(func() { theNCCL, ncclErr = openNCCL(sp) })
	return theNCCL, ncclErr
}

func openNCCL(sp searchPath) (*ncclAPI, error) {
	h, path, err := dlopenFirst(libNCCL, sp, fileExists)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w: %v", errNoNCCL, err)
	}
	n := &ncclAPI{path: path}
	t := &symbolTable{handle: h, lib: "libnccl"}
	t.bind(&n.ncclGetVersion, "ncclGetVersion", false)
	t.bind(&n.ncclGetErrorString, "ncclGetErrorString", false)
	t.bind(&n.ncclGetUniqueId, "ncclGetUniqueId", false)
	t.bind(&n.ncclCommInitRank, "ncclCommInitRank", false)
	t.bind(&n.ncclCommDestroy, "ncclCommDestroy", false)
	t.bind(&n.ncclGroupStart, "ncclGroupStart", false)
	t.bind(&n.ncclGroupEnd, "ncclGroupEnd", false)
	t.bind(&n.ncclAllGather, "ncclAllGather", false)
	t.bind(&n.ncclReduceScatter, "ncclReduceScatter", false)
	t.bind(&n.ncclAllReduce, "ncclAllReduce", false)
	t.bind(&n.ncclBroadcast, "ncclBroadcast", false)
	if t.err != nil {
		return nil, fmt.Errorf("%w (%s)", t.err, path)
	}
	var v int32
	if err := n.check(n.ncclGetVersion(&v), "ncclGetVersion"); err != nil {
		return nil, err
	}
	n.version = int(v)
	if n.version < ncclMinVersion {
		return nil, fmt.Errorf("cuda: %s is NCCL %s; the backend needs %s or later (ncclAvg, bf16 reductions)",
			path, ncclVersionString(n.version), ncclVersionString(ncclMinVersion))
	}
	return n, nil
}

// ncclVersionString formats an NCCL_VERSION_CODE: X*1000+Y*100+Z up to
// 2.8, X*10000+Y*100+Z from 2.9 on (nccl.h's NCCL_VERSION).
func ncclVersionString(code int) string {
	if code >= 10000 {
		return fmt.Sprintf("%d.%d.%d", code/10000, code/100%100, code%100)
	}
	return fmt.Sprintf("%d.%d.%d", code/1000, code/100%10, code%100)
}

// check turns an ncclResult_t into an *Error naming op, with the
// library's own description.
func (n *ncclAPI) check(r ncclResult, op string, args ...any) error {
	if r == ncclSuccess {
		return nil
	}
	if len(args) > 0 {
		op = fmt.Sprintf(op, args...)
	}
	name := ncclResultNames[r]
	if name == "" {
		name = fmt.Sprintf("ncclResult_t(%d)", int32(r))
	}
	if s := goString(n.ncclGetErrorString(r)); s != "" {
		name += ": " + s
	}
	return &Error{Op: op, Lib: "nccl", Code: int(r), Name: name}
}

// ncclType maps a buffer's dtype to NCCL's.
func ncclType(dt gpu.DType) ncclDataType {
	switch dt {
	case gpu.F32:
		return ncclFloat32
	case gpu.BF16:
		return ncclBfloat16
	case gpu.F16:
		return ncclFloat16
	case gpu.F64:
		return ncclFloat64
	case gpu.I32:
		return ncclInt32
	}
	panic(fmt.Sprintf("gpu/cuda: no NCCL type for %s", dt))
}

// ncclOp maps a reduction to NCCL's.
func ncclOp(op gpu.ReduceOp) ncclRedOp {
	switch op {
	case gpu.Sum:
		return ncclSum
	case gpu.Avg:
		return ncclAvg
	}
	panic(fmt.Sprintf("gpu/cuda: no NCCL op for reduce op %d", op))
}
