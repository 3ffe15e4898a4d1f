// Package hf moves a model's weights in and out of Strata.
//
// It reads and writes Hugging Face model directories and single
// safetensors files of a model.Layout.
//
// # Model weights as one safetensors file
//
// Export writes every tensor of a model.Layout from host chunks (fp32 or
// bf16: the chunk type is its type parameter) as F32 or BF16, with
// metadata (format "pt", strata.shape, n_layer, n_embd, n_head,
// vocab_size, max_seq_len, step, strata.names), under the layout's names or
// Hugging Face's less their prefix (NamesHF: GPT-2's Conv1D weights
// transposed to in×out). ExportStream is the same file with the chunks
// handed over one at a time through an ExportWriter. Import reads such a
// file, or one saved by transformers, into one fp32 slice per chunk,
// checking every name, dtype (F32, BF16, F16, each widened exactly) and
// shape and listing every problem in one error.
//
// # Hugging Face model directories
//
// ReadConfig/ParseConfig read config.json into a model.Shape
// (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM, Phi3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM
// (gemma3_text), GPT2LMHeadModel) with each family's configuration-class
// defaults: head_dim, rope_scaling or rope_parameters of every type
// model.RopeFor computes (default, linear, dynamic, yarn, llama3,
// longrope with Phi-3's top-level original_max_position_embeddings),
// partial_rotary_factor, the sliding window of each family (Mistral's and
// Phi-3's on every layer, Qwen2's and Qwen3's use_sliding_window from
// max_window_layers on, Gemma 2's alternating layers, Gemma 3's
// sliding_window_pattern, or layer_types), Gemma's query_pre_attn_scalar,
// soft caps and rope_local_base_freq. What Strata does not compute is
// refused in one error naming the file and each key: an unknown rope_type
// or a rope key its type does not read, another activation, biases a
// family lacks (attention_bias, mlp_bias), a layer type other than sliding
// and full attention, and a key of the
// wrong JSON type with what it wants (a number written as a string; null,
// except where transformers reads None as a meaning: n_inner, head_dim,
// num_key_value_heads, sliding_window, rope_scaling, the soft caps,
// torch_dtype); a
// config.json that is not JSON says file:line:col (ProbeDir tells a
// directory with such a file from one without a model). Open opens a
// directory: config.json, then model.safetensors or the shards that
// model.safetensors.index.json names, every header checked against the
// layout (names with or without "model."/"transformer.", mask and rotary
// buffers and a tied lm_head skipped), every problem in one error naming
// file and tensor. Model.ReadChunk reads one chunk with pread, a block of
// at most 4 MiB at a time, into the caller's fp32 buffer: a Model is the
// engine.Options.Init of `strata train --init`, and Model.Source the
// Source a run records. ConfigJSON writes config.json back (keeping the
// other keys of the source's, and all of them as written when the source
// describes the same shape: an imported model exports with its config.json
// key for key), and ExportDir writes a directory as
// transformers' save_pretrained does: weight files of at most
// DirOptions.MaxShardBytes (model.safetensors, or model-0000N-of-0000M with
// model.safetensors.index.json), transformers' names, the source's
// tokenizer files. Package checkpoint feeds ExportStream and ExportDir from
// a training checkpoint (checkpoint.ExportCheckpoint, checkpoint.ExportHF).
//
// # Lifecycle and memory
//
// Nothing here holds resources between calls except a Model (open files;
// Close it). ExportStream writes a weights file chunk by chunk (the header
// first, from the layout), holding the largest tensor, a 1 MiB write buffer
// and about 2 KiB per tensor; Export is a thin wrapper. Import returns the
// whole model (small models, tests) but reads it through one buffer of at
// most 4 MiB (and a widened copy of it for a transposed non-F32 tensor);
// Open holds those and its open files, nothing of the model. ExportDir
// holds ExportStream's buffers.
package hf
