// Package checkpoint owns Strata's files: safetensors import and export of a
// model's weights, and sharded, crash-safe training checkpoints of ZeRO
// state.
//
// # Safetensors
//
// ReadHeader / OpenSafetensors / ReadSafetensorsFile read the format of
// github.com/huggingface/safetensors and validate everything before using
// it: the header length against the file and a 100 MB limit, a JSON object
// with unique keys (only space padding after it), known dtypes, shapes
// whose byte size (with overflow checks) equals the data_offsets range, and
// ranges that cover the byte buffer exactly, no gap, no overlap, no
// trailing bytes. Errors match ErrFormat and name the tensor and its
// offsets; hostile input gives an error, never a panic or an allocation
// larger than the file (FuzzReadHeader). WriteSafetensors writes the
// header compactly (__metadata__ first, tensors in the order given), padded
// with spaces so the data starts on an 8-byte boundary.
//
// Export writes every tensor of a model.Layout from host chunks (fp32 or
// bf16) as F32 or BF16, with metadata (format "pt", strata.shape, n_layer,
// n_embd, n_head, vocab_size, max_seq_len, step, strata.names), under the
// layout's names or Hugging Face's less their prefix (NamesHF: GPT-2's
// Conv1D weights transposed to in×out). Import reads such a file, or one
// saved by transformers, into one fp32 slice per chunk, checking every
// name, dtype (F32, BF16, F16, each widened exactly) and shape and listing
// every problem in one error. ExportState writes the weights held by a
// training checkpoint (fp32 master weights when present).
//
// # Hugging Face model directories
//
// ReadHFConfig/ParseHFConfig read config.json into a model.Shape
// (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel)
// and refuse, in one error naming the file and each key, what Strata does
// not compute (rope_scaling, a head_dim other than hidden/heads, another
// activation, biases Llama lacks, sliding windows: Mistral's only when
// shorter than the run's sequence, HFConfig.CheckSeq). OpenHF opens a
// directory: config.json, then model.safetensors or the shards that
// model.safetensors.index.json names, every header checked against the
// layout (names with or without "model."/"transformer.", mask and rotary
// buffers and a tied lm_head skipped), every problem in one error naming
// file and tensor. HFModel.ReadChunk reads one chunk with pread, a block of
// at most 4 MiB at a time, into the caller's fp32 buffer: an HFModel (or a
// Reader, whose ReadChunk reads a checkpoint's weights) is the
// engine.Options.Init of `strata train --init`. HFConfigJSON writes
// config.json back (keeping the other keys of the source's), and ExportHF
// writes a directory as transformers' save_pretrained does: weight files of
// at most MaxShardBytes (model.safetensors, or model-0000N-of-0000M with
// model.safetensors.index.json), transformers' names, the source's
// tokenizer files; ExportCheckpointHF feeds it from a training checkpoint
// whose manifest names the run's Source (where its weights came from).
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
// previous complete checkpoint or the new one. Older checkpoints beyond
// Options.Keep (default 2) and leftovers of crashed saves are removed after
// a successful save, each renamed to .tmp-prune-NAME before it is removed
// (a removal cut short leaves nothing that looks like a checkpoint).
// Pruning counts and removes only the checkpoints of the saving run
// (Options.RunID, recorded in each manifest): several runs' checkpoints can
// share a directory without one pruning the other's. A directory named
// like a checkpoint without a readable manifest or with a rank file of the
// wrong size is incomplete: List reports it (Listing.Incomplete) and
// nothing loads, counts or prunes it. Rewind makes an older checkpoint
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
// refuses Hugging Face names and directories (custom.go).
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
// # Lifecycle and memory
//
// Nothing here holds resources between calls except a SafetensorsFile or
// a Reader (open files; Close them). A streaming save or load holds two
// buffers of State.MaxWholeBytes (the largest chunk's largest state across
// all ranks: 2·N of the largest shard tensor), plus 256 KiB per rank file
// during the CRC pass of a load, whatever the number of chunks. A loaded
// State costs the checkpoint's size in host memory, and SaveWith needs the
// whole State in memory; both are for small models and tests.
// ExportStream writes a weights file chunk by chunk (the header first,
// from the layout), holding the largest tensor, a 1 MiB write buffer and
// about 2 KiB per tensor; ExportCheckpoint feeds it from a checkpoint on
// disk, one chunk at a time, adding two padded chunks and the CRC pass's
// buffers; Export and ExportBF16 are thin wrappers, and ExportState the
// whole-State path for small models. Import returns the whole model (small
// models, tests) but reads it through one buffer of at most 4 MiB (and a
// widened copy of it for a transposed non-F32 tensor); OpenHF holds those
// and its open files, nothing of the model. ExportHF holds ExportStream's
// buffers. Saves into one directory must not run concurrently.
package checkpoint
