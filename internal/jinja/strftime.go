package jinja

import (
	"fmt"
	"strings"
	"time"
)

// strftimeNow is transformers' strftime_now global (Python's
// datetime.now().strftime(format)) answering with the time at: what
// Llama-3.2-style templates call for today's date. It is given to a
// rendering only when the caller asks for it (ChatTemplate.WithDate): a
// template's training data would otherwise depend on the day it was
// tokenized. The time is naive, as datetime.now() is: %z and %Z are empty.
func strftimeNow(at time.Time) *fn {
	return &fn{name: "strftime_now", call: func(b *budget, args []any, kw *dict) (any, error) {
		f, ok := arg(args, kw, 0, "format", nil).(string)
		if !ok {
			return nil, fmt.Errorf("strftime_now: the format must be a string")
		}
		if err := b.scan(len(f)); err != nil {
			return nil, err
		}
		if err := b.alloc(int64(len(f)) * 8); err != nil { // a directive writes at most 9 bytes for its 2 (%B: September)
			return nil, err
		}
		return strftime(at, f)
	}}
}

// strftimeDirectives are the directives strftime knows, as Python's
// (glibc's) strftime writes them in the C locale; "-" before a numeric one
// drops its padding (glibc's %-d).
const strftimeDirectives = "a A b B d H I j m M p S f w y Y z Z %, and %-d %-m %-H %-I %-M %-S %-j %-y"

// strftime formats t as Python's t.strftime(format) in the C locale, for
// the directives in strftimeDirectives; another is an error naming it.
func strftime(t time.Time, format string) (string, error) {
	var sb strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			sb.WriteByte(c)
			continue
		}
		i++
		if i == len(format) {
			return "", fmt.Errorf("strftime_now: the format %q ends in a lone %%", format)
		}
		pad := true
		if format[i] == '-' && i+1 < len(format) {
			pad = false
			i++
		}
		num := func(v, width int) {
			if pad {
				fmt.Fprintf(&sb, "%0*d", width, v)
			} else {
				fmt.Fprintf(&sb, "%d", v)
			}
		}
		hour12 := t.Hour() % 12
		if hour12 == 0 {
			hour12 = 12
		}
		d := format[i]
		switch {
		case d == 'd':
			num(t.Day(), 2)
		case d == 'm':
			num(int(t.Month()), 2)
		case d == 'H':
			num(t.Hour(), 2)
		case d == 'I':
			num(hour12, 2)
		case d == 'M':
			num(t.Minute(), 2)
		case d == 'S':
			num(t.Second(), 2)
		case d == 'j':
			num(t.YearDay(), 3)
		case d == 'y':
			num(t.Year()%100, 2)
		case !pad:
			return "", fmt.Errorf("strftime_now: directive %%-%c is not supported (Strata's: %s)", d, strftimeDirectives)
		case d == 'Y':
			fmt.Fprintf(&sb, "%d", t.Year())
		case d == 'a':
			sb.WriteString(t.Weekday().String()[:3])
		case d == 'A':
			sb.WriteString(t.Weekday().String())
		case d == 'b':
			sb.WriteString(t.Month().String()[:3])
		case d == 'B':
			sb.WriteString(t.Month().String())
		case d == 'p':
			sb.WriteString(map[bool]string{false: "AM", true: "PM"}[t.Hour() >= 12])
		case d == 'f':
			fmt.Fprintf(&sb, "%06d", t.Nanosecond()/1000)
		case d == 'w':
			fmt.Fprintf(&sb, "%d", int(t.Weekday()))
		case d == 'z', d == 'Z': // a naive time has no zone
		case d == '%':
			sb.WriteByte('%')
		default:
			return "", fmt.Errorf("strftime_now: directive %%%c is not supported (Strata's: %s)", d, strftimeDirectives)
		}
	}
	return sb.String(), nil
}
