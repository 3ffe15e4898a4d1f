// Package engine runs ZeRO stages 0-3 across the local devices: one rank per
// device, the training step, the overlap modes. (The training engine itself
// is being built; this file describes what exists and the rules it follows.)
//
// What it owns today: the model-state memory arithmetic (estimate.go), so
// that `strata estimate`, the engine's summary and its tests use one set of
// numbers. For mixed-precision Adam a model of Ψ parameters has 16Ψ bytes of
// model state: bf16 params 2Ψ, bf16 grads 2Ψ, fp32 master, m and v 12Ψ.
// Per device on N devices, with the optimizer on the device:
//
//	stage 0  16Ψ           everything replicated
//	stage 1  4Ψ + 12Ψ/N    optimizer state sharded
//	stage 2  2Ψ + 14Ψ/N    gradients sharded too
//	stage 3  16Ψ/N         parameters sharded too
//
// With the optimizer on the host (ZeRO-Offload) the device keeps the bf16
// params (2Ψ, or 2Ψ/N at stage 3) and grads (2Ψ at stages 0-1, 2Ψ/N at 2-3),
// and the host holds 12Ψ/N per rank plus the reduced gradient shard; with
// offload_param the param shards leave the device too (stage 3).
//
// Layout rule the engine must follow so that measured bytes equal the
// estimate: parameters are packed in chunks (ChunkParams: embeddings, one
// per block, final layernorm); every chunk is sharded over the N ranks with
// each rank's slice ShardElems long (ceil(chunk/N) rounded up to
// DefaultShardAlignElems, zero padded); a gathered or replicated chunk
// occupies N·ShardElems elements; at stage 3, chunks with fewer parameters
// than stage3_param_persistence_threshold stay gathered on every device.
//
// Memory: the estimate is plain arithmetic and allocates only its result.
package engine
