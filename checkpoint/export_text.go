package checkpoint

import (
	"fmt"
	"io"
	"strings"

	"github.com/strata-ai/strata/internal/units"
)

// WriteText writes the line `strata export` prints of an export of the
// checkpoint the user named src: the step, the files written with their
// dtype and size, and for FormatHF the tokenizer files and chat template
// (or why there are none).
func (res *ExportResult) WriteText(w io.Writer, src string) error {
	dst := res.Path
	var err error
	switch res.Format {
	case FormatHF:
		tok := "no tokenizer files (the run did not start from a Hugging Face directory with them)"
		if len(res.Tokenizer) > 0 {
			tok = "tokenizer files " + strings.Join(res.Tokenizer, ", ")
		}
		chat := "no chat template (the run trained on no {\"messages\"} lines)"
		if res.ChatTemplate != "" {
			chat = "the run's chat template, " + res.ChatTemplate
		}
		_, err = fmt.Fprintf(w, "exported step %d of %s (%d params) to %s: config.json, %d weight file(s) of %s %s (%s); %s; written: %s (%s)\n",
			res.Step, src, res.Params, dst, len(res.Files), units.FormatBytes(res.SizeBytes), res.DType, strings.Join(res.Files, ", "), tok,
			strings.Join(res.Written, ", "), chat)
	case FormatPEFT:
		_, err = fmt.Fprintf(w, "exported the LoRA adapters of step %d of %s (r %d, alpha %g, %s) to %s: %s (%s)\n",
			res.Step, src, res.LoRA.R, res.LoRA.Alpha, strings.Join(res.LoRA.Targets, ", "), dst, strings.Join(res.Files, ", "), res.DType)
	default:
		_, err = fmt.Fprintf(w, "exported step %d of %s (%d params) to %s (%s, %s names, %s)\n",
			res.Step, src, res.Params, dst, res.DType, res.Names, units.FormatBytes(res.SizeBytes))
	}
	return err
}
