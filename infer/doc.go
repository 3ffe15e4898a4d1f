// Package infer evaluates a model and generates text with it.
//
// # Opening and loading
//
// Open opens a model named as source.Probe names one (a Hugging Face
// directory, a Strata run or checkpoint): its weights (nothing read yet),
// the dtype its parameters are held in (bf16 for weights stored in BF16,
// else fp32, unless Options.DType says), its tokenizer and one device of
// a backend. Load then uploads the weights a chunk at a time (host memory
// holds one chunk) and makes a model.Decoder of the capacity asked for;
// CheckFits says beforehand whether both fit the device, naming what each
// needs. Close frees the device memory and closes the files.
//
// # Evaluating
//
// Evaluate gives the mean next-token loss (natural log), the perplexity
// and, asked for, each predicted token's loss and logits. Tokens and text
// are cut into windows of Seq tokens, each scored from an empty context;
// packed examples (data.NewEvalSet) are scored one example at a time with
// the loss only on their targets, as training's held-out evaluation
// counts them. Resident, the loaded decoder scores them; with
// EvalOptions.Offload the weights stay in host RAM or on NVMe and stream
// through the device by an inference engine (engine.Options.Inference),
// which gives the resident bf16 evaluation's loss bit for bit on the CPU
// backend: a model many times the device's memory evaluates.
//
// # Generating
//
// Generate runs the prompt through the decoder in one pass, which fills
// its key/value cache, then each new token alone. The next token is the
// most likely one at temperature 0 and a seeded draw from
// softmax(logits / T) above it (SampleToken). It stops at an EOS id (the
// tokenizer's and config.json's eos_token_id: Model.EOS), at a chat
// template's end of turn (RenderChat gives the prompt and the end of
// turn), after MaxNewTokens or at the decoder's capacity. Each token's
// text comes whole: the bytes of a character the next tokens complete and
// what may begin the end of turn are held back.
//
// # Mixtures of experts
//
// With Options.Experts cpu or nvme, a mixture of experts' experts stay in
// host RAM or in an O_DIRECT file under Options.NVMePath while every other
// chunk is on the device; the decoder reads only the experts a token
// reached, a sparse layer's misses all at once as soon as its router has
// run, through a cache of Options.ExpertCache experts on the device
// (Options.ExpertPolicy: ristretto's TinyLFU by default, LRU the option).
// Model.ExpertStats counts the experts used, the hits and the bytes read.
// Generation gives the same tokens wherever the experts live.
//
// # Memory
//
// The device holds the parameters (WeightsBytes) and the decoder's
// activations and key/value cache (model.DecoderBytes); host memory one
// chunk of fp32 while loading, a text file's block (about 1 MiB) while
// evaluating. A Model is not safe for concurrent use.
package infer
