// Package source opens a model to run: a Hugging Face directory or a Strata checkpoint.
//
// # What it opens
//
// Probe names the model at a path as `strata train --init`, `--resume`,
// `strata eval --model` and `strata generate --model` name one: a Hugging
// Face model directory (config.json with "architectures", safetensors
// weights, tokenizer.json), or a Strata checkpoint (a step directory, its
// manifest.json, a directory of checkpoints whose "latest" it takes, or a
// run's --out directory). It reads the shape and nothing else, so a
// caller can size a run before any weight is read.
//
// Open then opens the weights: every file's header checked against the
// shape (a Hugging Face directory) or every rank file's size and CRC-32C
// (a checkpoint). Weights reads one chunk at a time (it is an
// engine.ChunkSource), so a model larger than host memory passes through
// it a chunk at a time.
//
// Besides the weights a Model gives what a run records and an inference
// needs: its Source (the Hugging Face directory and tokenizer files a run
// writes into run.json and every manifest), its tokenizer (Tokenizer:
// tokenizer.json, else the byte tokenizer for a vocabulary of 256), its
// chat template (ChatTemplate: the one a run recorded, else the Hugging
// Face directory's, else ChatML), the EOS ids of its config.json (EOS),
// and the dtype its weights are stored in (ParamDType). A run that starts
// from it takes its shape into its config (LoadConfig, Apply, Demo).
//
// # Lifecycle
//
// Probe, then Open, then Close once the weights have been read (after the
// engine or the decoder has loaded them). A Model is not safe for
// concurrent use.
package source
