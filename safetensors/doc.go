// Package safetensors reads and writes the safetensors file format.
//
// # Reading
//
// ReadHeader, Open and ReadFile read the format of
// github.com/huggingface/safetensors and validate everything before using
// it: the header length against the file and a 100 MB limit, a JSON object
// with unique keys (only space padding after it), known dtypes, shapes
// whose byte size (with overflow checks) equals the data_offsets range, and
// ranges that cover the byte buffer exactly, no gap, no overlap, no
// trailing bytes. Errors match ErrFormat and name the tensor and its
// offsets; hostile input gives an error, never a panic or an allocation
// larger than the file (FuzzReadHeader). A File reads one tensor
// (ReadTensor) or a part of one (ReadAt) with pread.
//
// # Writing
//
// Write and WriteFile (atomically: temporary file, fsync, rename, fsync of
// the directory) write the header compactly (__metadata__ first, tensors in
// the order given), padded with spaces so the data starts on an 8-byte
// boundary, then the tensors back to back. EncodeEntries encodes the same
// header for tensors described by size alone (Entry), for writers that
// stream the data after it: a model's weights (package hf) or a training
// checkpoint's rank files (package checkpoint).
//
// # Lifecycle and memory
//
// Nothing here holds resources between calls except a File (an open file;
// Close it). ReadFile and Parse hold the whole file; Open holds the header
// alone.
package safetensors
