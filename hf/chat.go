package hf

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/internal/durable"
)

// Files of a Hugging Face directory that carry how the model is prompted.
const (
	TokenizerConfigName  = "tokenizer_config.json"
	ChatTemplateName     = "chat_template.jinja"
	GenerationConfigName = "generation_config.json"
)

// GenerationIDs are the token ids of generation_config.json that the
// model's config.json does not give, from its tokenizer, and the end of
// turn of the run's chat template when it is one token (a stop token
// besides EOS, as transformers' eos_token_id list holds it).
type GenerationIDs struct {
	BOS, EOS, Pad *int32
	EndOfTurn     *int32
}

// writeChatTemplate writes tmpl into dir as transformers reads it:
// chat_template.jinja, and tokenizer_config.json's chat_template (the
// copied file's other keys kept; a new file gets the template's special
// tokens). A copied tokenizer_config.json whose template is already tmpl
// is left as it is.
func writeChatTemplate(dir string, tmpl *data.ChatTemplate) error {
	path := filepath.Join(dir, TokenizerConfigName)
	cfg := map[string]json.RawMessage{}
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &cfg); err != nil {
			return fmt.Errorf("%s: %w", TokenizerConfigName, err)
		}
	case os.IsNotExist(err):
		for k, v := range tmpl.SpecialTokens() {
			cfg[k], _ = json.Marshal(v)
		}
	default:
		return err
	}
	var had string
	if json.Unmarshal(cfg["chat_template"], &had) != nil || had != tmpl.Text() {
		cfg["chat_template"], _ = json.Marshal(tmpl.Text())
		out, err := json.MarshalIndent(cfg, "", "  ")
		if err != nil {
			return err
		}
		os.Remove(path) // the copy of the source's: replaced
		if err := durable.Create(path, append(out, '\n')); err != nil {
			return err
		}
	}
	jinja := filepath.Join(dir, ChatTemplateName)
	os.Remove(jinja)
	return durable.Create(jinja, []byte(tmpl.Text()))
}

// generationConfig is generation_config.json for a model without one:
// the bos, eos and pad token ids of its config.json (cfg), else of ids, as
// transformers' GenerationConfig.from_model_config takes them, with the
// chat template's end of turn after the EOS.
func generationConfig(cfg []byte, ids GenerationIDs) ([]byte, error) {
	var model map[string]json.RawMessage
	if err := json.Unmarshal(cfg, &model); err != nil {
		return nil, err
	}
	out := map[string]any{"_from_model_config": true}
	for key, id := range map[string]*int32{"bos_token_id": ids.BOS, "pad_token_id": ids.Pad} {
		if raw, ok := model[key]; ok && string(raw) != "null" {
			out[key] = raw
		} else if id != nil {
			out[key] = *id
		}
	}
	var eos []int32
	if raw, ok := model["eos_token_id"]; ok && string(raw) != "null" {
		var one int32
		if json.Unmarshal(raw, &one) == nil {
			eos = []int32{one}
		} else if err := json.Unmarshal(raw, &eos); err != nil {
			return nil, fmt.Errorf("%s: eos_token_id %s is neither an id nor a list of ids", ConfigName, raw)
		}
	} else if ids.EOS != nil {
		eos = []int32{*ids.EOS}
	}
	if ids.EndOfTurn != nil && !slices.Contains(eos, *ids.EndOfTurn) {
		eos = append(eos, *ids.EndOfTurn)
	}
	switch len(eos) {
	case 0:
	case 1:
		out["eos_token_id"] = eos[0]
	default:
		out["eos_token_id"] = eos
	}
	if raw, ok := model["transformers_version"]; ok {
		out["transformers_version"] = raw
	}
	b, err := json.MarshalIndent(out, "", "  ")
	return append(b, '\n'), err
}
