// Command lora fine-tunes a Hugging Face model with LoRA on NVMe.
//
// Its frozen base and the adapters' optimizer state live on NVMe; it then
// evaluates the model, generates from it and exports the adapter (PEFT)
// and the merged model:
//
//	go run ./examples/lora -base ~/models/Llama-3.2-1B -text corpus.txt -nvme /mnt/nvme -out lora-run
//
// Without -base it makes a tiny GPT-2 of its own (tinymodel.go: trained
// from scratch on two sentences), and without -text it fine-tunes on a
// third, so it runs anywhere. -nvme
// must be a directory on a filesystem that does O_DIRECT (ext4, xfs; not
// tmpfs).
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
)

func main() {
	base := flag.String("base", "", "a Hugging Face model directory (default: a tiny model made in -out)")
	text := flag.String("text", "", "the training text (default: a sentence, repeated)")
	nvme := flag.String("nvme", "/var/tmp", "the NVMe directory for the offloaded state")
	out := flag.String("out", "lora-run", "the run directory (new)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt) // Ctrl-C saves and stops
	defer stop()
	if err := os.MkdirAll(*out, 0o755); err != nil {
		log.Fatal(err)
	}
	if *base == "" {
		dir, err := writeTinyModel(ctx, *out)
		if err != nil {
			log.Fatal(err)
		}
		*base = dir
	}
	if *text == "" {
		*text = filepath.Join(*out, "train.txt")
		if err := os.WriteFile(*text, []byte(strings.Repeat("pack my box with five dozen liquor jugs. ", 300)), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	if err := job(ctx, *base, *text, *nvme, filepath.Join(*out, "run"), os.Stdout); err != nil {
		log.Fatal(err)
	}
}
