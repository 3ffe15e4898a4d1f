// Package bench holds the workloads behind `strata bench` and the
// benchmark pages in this directory. Each is an options struct with
// WithDefaults and Validate, one function that runs it, and a result that
// prints as a table (String) and as one JSON object:
//
//   - RunNVMe: one fio-shaped workload (block size, queue depth, read /
//     write / random / mixed) over a file per path through nvme.Engine,
//     with device latency from the block-layer tracepoints when BPF is
//     allowed (nvme_trace_linux.go, the only user of cilium/ebpf).
//   - RunAdam: one cpuadam step, alternating with the r4w3 memory
//     roofline on the same arrays and threads.
//   - RunGemm: the CPU backend's GEMM at the linear layers of a GPT-2
//     block, against the machine's fp32 peak (CPUPeak).
//   - Step: the ZeRO engine at stage 3 with everything resident, offloaded
//     to host RAM and offloaded to NVMe, stepped in interleaved rounds so
//     that a shared machine's noise falls on every mode alike; it reports
//     whether the offloaded modes end bit-identical to the resident one.
//   - TrainStep: the plain one-device loop (model.Trainer) against the
//     backend's GEMM at the model's c_fc shape.
//
// The workloads open a backend's devices (cpu or cuda) with gpu/backend,
// as `strata train`, `eval` and `generate` do. The package prints nothing: progress goes to an
// optional callback where a workload is long, and cmd decides what to
// show. The workloads report ratios against an anchor measured in the
// same run (the GEMM, the memory roofline, the CPU peak; fio in
// nvme-vs-fio.sh); the tests check what they report, never how fast.
// cuda-verify.sh is the GPU run of issue 17 (conformance, the gpt2 step
// against PyTorch's, MFU of a gpt-7b-shape stack, the offload modes'
// equivalence); cuda_verify_test.go checks its arguments and summary
// without a GPU.
//
// Memory: buffers handed to O_DIRECT I/O come from a pinned pool in 2 MiB
// huge pages (newIOBuffers; MAP_HUGETLB or 4 KiB pages when THP gives
// none, and the result says which) and are unmapped when the workload
// ends. Files and swap directories a workload creates are removed on every
// way out, a stop through the context included; RunNVMe never writes into
// or extends a file it did not create unless NVMeOptions.Force.
package bench
