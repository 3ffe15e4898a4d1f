// Package checkpoint saves and loads sharded, crash-safe training
// checkpoints of ZeRO state.
//
// # Training checkpoints
//
// A State is plain data (step, config JSON, shape, device count, stage,
// shard alignment, and per rank, per chunk, per state the rank's shard as
// little-endian bytes), so the engine fills it without this package knowing
// the engine. Rank r's shard of chunk c is elements [r·S, (r+1)·S) of the
// chunk zero-padded to N·S, S = ShardElems(chunk, N, align) as in the
// engine, whatever the stage, so Gather and Reshard need nothing else.
//
// Save writes, under DIR, a directory step-NNNNNNNN holding one safetensors
// file per rank ("chunk.{c}.{state}" tensors) and manifest.json (format
// version, step, devices, stage, shape, shard alignment, chunks, states,
// each file's size and CRC-32C, the config). Crash safety: everything is
// written into DIR/.tmp-*, each file fsynced, the directory fsynced, renamed
// to step-NNNNNNNN, DIR fsynced, and only then DIR/latest is replaced by
// rename (after fsync). A crash at any point leaves latest naming the
// previous complete checkpoint or the new one. In a job of several
// processes (SaveJob) each process writes its own ranks' files into the
// temporary directory process 0 made, and process 0 writes the manifest
// and renames once every process's files are fsynced: the same files and
// the same guarantee. Older checkpoints beyond
// Options.Keep (default 2) and leftovers of crashed saves are removed after
// a successful save, each renamed to .tmp-prune-NAME before it is removed
// (a removal cut short leaves nothing that looks like a checkpoint).
// Pruning counts and removes only the checkpoints of the saving run
// (Options.RunID, recorded in each manifest): several runs' checkpoints can
// share a directory without one pruning the other's. A directory named
// like a checkpoint without a readable manifest or with a rank file of the
// wrong size is incomplete: List reports it (Listing.Incomplete), nothing
// loads or counts it, and the next save removes it when it has no
// manifest or the saving run's (never the one latest names). Rewind makes an older checkpoint
// latest again for a run resumed from it, setting the run's later ones
// aside (renamed aside-NAME, kept). Load verifies every file's size and CRC-32C before
// parsing it and names the file that fails; LoadFor also refuses a
// checkpoint of another shape or precision and reshards one saved for
// another device count or alignment.
//
// A custom model's checkpoint (model.CustomLayout: a model a Go program
// defines and trains through engine.Options.Model) has no shape: State.Model
// and the manifest's "model" name it, and every chunk lists its tensors,
// name and shape (ChunkInfo.Tensors), from which State.Layout rebuilds its
// layout. It restores only into a run of that model with the same chunks
// and tensors (Match, naming the first chunk that differs), exports under
// the model's own tensor names with "strata.model" in the metadata, and
// refuses Hugging Face names and directories (custom.go, package hf).
//
// # Streaming
//
// SaveStream and Open/Reader.Read move a checkpoint one chunk of one state
// at a time: the "whole" of chunk c in state k, every rank's shard side by
// side (Devices·ShardElems elements). A save pulls each whole from a
// ChunkFunc (the engine copies the shards from its devices, host memory or
// tier store) into one of two buffers while a writer goroutine writes the
// other's shards to the rank files (one goroutine per file), computing
// CRC-32C as it writes; the header is written first, since every tensor's
// size follows from the shape, N, alignment and dtype. A load first
// verifies every file (size, CRC-32C, header) in a streaming pass, so a
// corrupt checkpoint hands nothing to the caller, then reads whole by whole
// into two buffers and hands each to a ChunkFunc. Resharding N→M needs no
// gather: element i of a chunk sits at the same offset of the whole for
// every N, so each source shard's part of the chunk is read straight into
// its place and the new padding is zero. SaveWith, Load and LoadFor are
// these with the data in a State; the files are the same byte for byte.
//
// # Weights out and in
//
// The rank files are safetensors (package safetensors). A checkpoint's
// weights (the fp32 master weights when present, else the params) go out
// as one model file or a Hugging Face directory through package hf's
// writers: ExportCheckpoint and ExportHF stream them from disk, ExportState
// writes them from a State. Export is `strata export` as one call: one
// safetensors file, a Hugging Face directory (a LoRA run's merged into the
// base directory it started from, each tensor in its base's dtype) or a
// LoRA run's PEFT adapter directory. A Reader's ReadChunk makes a
// checkpoint the initial weights of another run (engine.Options.Init), as
// an hf.Model does; the manifest records the run's hf.Source. CheckAdapter
// checks a PEFT adapter against the model a run applies it to.
//
// # Lifecycle and memory
//
// Nothing here holds resources between calls except a Reader (open files;
// Close it). A streaming save or load holds two buffers of
// State.MaxWholeBytes (the largest chunk's largest state across all ranks:
// 2·N of the largest shard tensor), plus 256 KiB per rank file during the
// CRC pass of a load, whatever the number of chunks. A loaded State costs
// the checkpoint's size in host memory, and SaveWith needs the whole State
// in memory; both are for small models and tests. ExportCheckpoint and
// ExportHF feed hf.ExportStream / hf.ExportDir from a checkpoint on disk,
// one chunk at a time, adding two padded chunks and the CRC pass's buffers
// to the writer's; ExportState is the whole-State path for small models.
// Saves into one directory must not run concurrently.
package checkpoint
