package cmd

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// What a command tells on stderr before it works: the config's notes,
// grouped, and whether a progress bar may redraw itself.

// notUsedSuffix is how package config words a DeepSpeed key Strata
// accepts without using ("KEY is accepted but not used: WHY").
const notUsedSuffix = " is accepted but not used: "

// configNotes groups the config's notes (config.Config.Ignored) for
// stderr: a key accepted but not used alone keeps its line and reason;
// two or more become one line naming every key (a stock DeepSpeed config
// sets several, each harmless: config/README.md says why each is not
// needed). The other notes follow, one a line, as they came.
func configNotes(ignored []string) []string {
	var keys, why, rest []string
	for _, n := range ignored {
		if k, _, ok := strings.Cut(n, notUsedSuffix); ok {
			keys, why = append(keys, k), append(why, n)
			continue
		}
		rest = append(rest, n)
	}
	var out []string
	switch len(keys) {
	case 0:
	case 1:
		out = append(out, why[0])
	default:
		out = append(out, fmt.Sprintf("accepted but not used (Strata does without them: config/README.md): %s", strings.Join(keys, ", ")))
	}
	return append(out, rest...)
}

// printConfigNotes prints configNotes, each as a "note:" line.
func printConfigNotes(w io.Writer, ignored []string) {
	for _, n := range configNotes(ignored) {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

// printNote prints note as a "note:" line ("" prints nothing).
func printNote(w io.Writer, note string) {
	if note != "" {
		fmt.Fprintf(w, "note: %s\n", note)
	}
}

// isTerminal says whether w is a terminal (a character device), where a
// progress bar may redraw its line with '\r' and ESC[K; a file, a pipe or a
// buffer gets plain lines instead. /dev/null is a character device too:
// what a progress bar writes there is lost anyway.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
