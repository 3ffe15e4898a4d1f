package cmd

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
)

func init() { cli.FlagStringer = flagString }

// Each flag's line in --help (cli.FlagStringer): its names
// with a placeholder when it takes a value, its usage, and its default
// once, as "(default: X)": the usage's own when it says one (a default
// that is not a value, "(default: the config's)"), else the flag's value
// when that is one: no "(default: 0)", "(default: false)" or "" for a flag
// left unset, and no sentinel ("(default: -1)"). urfave/cli's own stringer
// appends the value to every usage, so a usage that names its default
// showed two.
func flagString(f cli.Flag) string {
	df, ok := f.(cli.DocGenerationFlag)
	if !ok {
		return strings.Join(f.Names(), ", ")
	}
	usage := defaultWord.ReplaceAllString(df.GetUsage(), "(default: ")
	placeholder := ""
	if df.TakesValue() {
		placeholder = " value"
	}
	var names []string
	for _, n := range df.Names() {
		names = append(names, flagName(n)+placeholder)
	}
	line := strings.Join(names, ", ")
	if s, ok := f.(cli.DocGenerationSliceFlag); ok && s.IsSliceFlag() {
		line += " [ " + line + " ]"
	}
	if !strings.Contains(usage, "default") {
		if d := shownDefault(df); d != "" {
			usage += " (default: " + d + ")"
		}
	}
	if r, ok := f.(cli.RequiredFlag); ok && r.IsRequired() {
		usage += " (required)"
	}
	return fmt.Sprintf("%s\t%s", line, usage)
}

// defaultWord is "(default " without the colon, as some usages wrote it.
var defaultWord = regexp.MustCompile(`\(default (?:is )?`)

// shownDefault is a flag's default as --help shows it: "" for none (the
// zero value of its type: the flag unset) and for a negative number (a
// sentinel).
func shownDefault(df cli.DocGenerationFlag) string {
	d := strings.Trim(df.GetDefaultText(), `"`)
	switch d {
	case "", "0", "0s", "false", "[]":
		return ""
	}
	if n, err := strconv.ParseFloat(d, 64); err == nil && n < 0 {
		return ""
	}
	return d
}
