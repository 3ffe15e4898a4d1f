package config

import (
	"fmt"
	"math"
	"path"
	"strconv"
	"strings"

	"github.com/strata-ai/strata/internal/units"
)

// decoder walks the positioned tree section by section. Every read
// registers its key as known, so that keys nobody read are the unknown ones;
// problems are collected, not returned at the first, so that one run of
// Parse shows the user everything that is wrong.
type decoder struct {
	file     string
	data     []byte
	errs     []*Error
	ignored  []string
	sections []*section
	pos      map[string]int // JSON path -> offset of its key, for cross-key messages
	autos    []string       // JSON paths written as "auto" that Strata fills in (see fillAuto)
}

// section is one JSON object of the config (the root, "optimizer",
// "zero_optimization.offload_param", ...).
type section struct {
	d     *decoder
	n     *node // nil when absent or null
	path  string
	known []string
}

func (d *decoder) errAt(off int, path, format string, args ...any) {
	e := &Error{File: d.file, Path: path, Msg: fmt.Sprintf(format, args...)}
	if off >= 0 {
		e.Line, e.Col = position(d.data, off)
	}
	d.errs = append(d.errs, e)
}

// errPath reports a problem about the key at path, at that key's position
// when the file has it.
func (d *decoder) errPath(path, format string, args ...any) {
	off, ok := d.pos[path]
	if !ok {
		off = -1
	}
	d.errAt(off, path, format, args...)
}

// name is the file for messages.
func (d *decoder) name() string {
	if d.file == "" {
		return "the config"
	}
	return d.file
}

// given says whether the file writes the key at path (null included).
func (d *decoder) given(path string) bool {
	_, ok := d.pos[path]
	return ok
}

func (d *decoder) newSection(n *node, path string) *section {
	s := &section{d: d, path: path}
	if n != nil && n.kind != kindNull {
		if n.kind != kindObject {
			d.errAt(n.offset, path, "want an object, got %s", describe(n))
		} else {
			s.n = n
		}
	}
	d.sections = append(d.sections, s)
	return s
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// get registers key and returns its value, or nil when absent or null.
func (s *section) get(key string) *node {
	s.known = append(s.known, key)
	if s.n == nil {
		return nil
	}
	v, i := s.n.field(key)
	if v == nil {
		return nil
	}
	s.d.pos[join(s.path, key)] = s.n.keyOff[i]
	if v.kind == kindNull {
		return nil
	}
	return v
}

// has says whether the file sets key in this section (null counts as unset).
func (s *section) has(key string) bool {
	if s.n == nil {
		return false
	}
	v, _ := s.n.field(key)
	return v != nil && v.kind != kindNull
}

// sub returns the nested section under key.
func (s *section) sub(key string) *section {
	return s.d.newSection(s.get(key), join(s.path, key))
}

// ignore registers a DeepSpeed knob that Strata accepts without using; when
// the file sets it, a notice is kept. Its value is not checked.
func (s *section) ignore(key, why string) {
	if v := s.get(key); v != nil {
		s.notice(key, why)
	}
}

func (s *section) notice(key, why string) {
	s.d.ignored = append(s.d.ignored, fmt.Sprintf("%s is accepted but not used: %s", join(s.path, key), why))
}

func describe(n *node) string {
	switch n.kind {
	case kindString:
		return fmt.Sprintf("string %q", n.text)
	case kindNumber:
		return "number " + n.text
	case kindBool:
		return fmt.Sprintf("boolean %v", n.b)
	}
	return n.kind.String()
}

const autoMsg = `"auto" is not accepted here: write a value (Strata fills in "auto" for the batch, optimizer, scheduler, gradient_clipping, bf16/fp16 and bucket keys)`

func isAuto(n *node) bool { return n != nil && n.kind == kindString && n.text == "auto" }

// wholeNumber reads an integral JSON number (DeepSpeed configs often write
// 5e8 for counts).
func wholeNumber(n *node) (int64, string) {
	if n.kind != kindNumber {
		if isAuto(n) {
			return 0, autoMsg
		}
		return 0, "want a whole number, got " + describe(n)
	}
	if v, err := strconv.ParseInt(n.text, 10, 64); err == nil {
		return v, ""
	}
	f, err := strconv.ParseFloat(n.text, 64)
	if err != nil || math.IsInf(f, 0) || math.Abs(f) > 1<<62 {
		return 0, n.text + " is out of range"
	}
	if f != math.Trunc(f) {
		return 0, n.text + " is not a whole number"
	}
	return int64(f), ""
}

// int64Key reads a whole number; check returns "" or why the value is wrong.
func (s *section) int64Key(key string, dst *int64, check func(int64) string) {
	n := s.get(key)
	if n == nil {
		return
	}
	v, msg := wholeNumber(n)
	if msg == "" && check != nil {
		msg = check(v)
	}
	if msg != "" {
		s.d.errAt(n.offset, join(s.path, key), "%s", msg)
		return
	}
	*dst = v
}

func (s *section) intKey(key string, dst *int, check func(int64) string) {
	v := int64(*dst)
	s.int64Key(key, &v, func(x int64) string {
		if x > math.MaxInt32 || x < math.MinInt32 {
			return fmt.Sprintf("%d is out of range", x)
		}
		if check != nil {
			return check(x)
		}
		return ""
	})
	*dst = int(v)
}

func (s *section) floatKey(key string, dst *float64, check func(float64) string) {
	n := s.get(key)
	if n == nil {
		return
	}
	var msg string
	var v float64
	switch {
	case isAuto(n):
		msg = autoMsg
	case n.kind != kindNumber:
		msg = "want a number, got " + describe(n)
	default:
		var err error
		v, err = strconv.ParseFloat(n.text, 64)
		if err != nil || math.IsInf(v, 0) {
			msg = n.text + " is out of range"
		} else if check != nil {
			msg = check(v)
		}
	}
	if msg != "" {
		s.d.errAt(n.offset, join(s.path, key), "%s", msg)
		return
	}
	*dst = v
}

func (s *section) boolKey(key string, dst *bool) {
	n := s.get(key)
	if n == nil {
		return
	}
	if n.kind != kindBool {
		msg := "want true or false, got " + describe(n)
		if isAuto(n) {
			msg = autoMsg
		}
		s.d.errAt(n.offset, join(s.path, key), "%s", msg)
		return
	}
	*dst = n.b
}

// stringKey reads a string; when choices are given the value must be one
// of them, and a close miss is named.
func (s *section) stringKey(key string, dst *string, choices ...string) {
	n := s.get(key)
	if n == nil {
		return
	}
	if n.kind != kindString {
		s.d.errAt(n.offset, join(s.path, key), "want a string, got %s", describe(n))
		return
	}
	if len(choices) > 0 && !contains(choices, n.text) {
		msg := fmt.Sprintf("%q is not %s", n.text, orList(choices))
		if isAuto(n) {
			msg = autoMsg
		} else if near := Nearest(n.text, choices); near != "" {
			msg += fmt.Sprintf("; did you mean %q?", near)
		}
		s.d.errAt(n.offset, join(s.path, key), "%s", msg)
		return
	}
	*dst = n.text
}

// bytesKey reads a byte size: a whole number or a string such as "512MiB".
func (s *section) bytesKey(key string, dst *int64, check func(int64) string) {
	n := s.get(key)
	if n == nil {
		return
	}
	var v int64
	var msg string
	switch {
	case isAuto(n):
		msg = autoMsg
	case n.kind == kindString:
		var err error
		if v, err = units.ParseBytes(n.text); err != nil {
			msg = strings.TrimPrefix(err.Error(), "units: ")
		}
	case n.kind == kindNumber:
		v, msg = wholeNumber(n)
	default:
		msg = `want a byte size (a number or a string such as "512MiB"), got ` + describe(n)
	}
	if msg == "" && v < 0 {
		msg = fmt.Sprintf("%d is negative", v)
	}
	if msg == "" && check != nil {
		msg = check(v)
	}
	if msg != "" {
		s.d.errAt(n.offset, join(s.path, key), "%s", msg)
		return
	}
	*dst = v
}

// pathsKey reads one path or a list of paths (DeepSpeed's nvme_path).
func (s *section) pathsKey(key string, dst *[]string) {
	n := s.get(key)
	if n == nil {
		return
	}
	path := join(s.path, key)
	var out []string
	switch n.kind {
	case kindString:
		out = []string{n.text}
	case kindArray:
		if len(n.elems) == 0 {
			s.d.errAt(n.offset, path, "the list of paths is empty")
			return
		}
		for i, e := range n.elems {
			if e.kind != kindString {
				s.d.errAt(e.offset, fmt.Sprintf("%s[%d]", path, i), "want a path string, got %s", describe(e))
				return
			}
			out = append(out, e.text)
		}
	default:
		s.d.errAt(n.offset, path, "want a path or a list of paths, got %s", describe(n))
		return
	}
	for i, p := range out {
		if strings.TrimSpace(p) == "" {
			s.d.errAt(n.offset, path, "path %d is empty", i)
			return
		}
	}
	*dst = out
}

// patternsKey reads a list of tensor-name patterns (strata.freeze): each a
// non-empty string, a valid path.Match glob when it has * ? or [.
func (s *section) patternsKey(key string, dst *[]string) {
	n := s.get(key)
	if n == nil {
		return
	}
	p := join(s.path, key)
	if n.kind != kindArray {
		s.d.errAt(n.offset, p, `want a list of tensor-name patterns such as ["embed_tokens", "layers.0."], got %s`, describe(n))
		return
	}
	var out []string
	for i, e := range n.elems {
		msg := ""
		if e.kind != kindString {
			msg = "want a pattern string, got " + describe(e)
		} else {
			msg = patternProblem(e.text)
		}
		if msg != "" {
			s.d.errAt(e.offset, fmt.Sprintf("%s[%d]", p, i), "%s", msg)
			return
		}
		out = append(out, e.text)
	}
	*dst = out
}

// patternProblem says what is wrong with a strata.freeze pattern ("" when
// nothing is).
func patternProblem(p string) string {
	if strings.TrimSpace(p) == "" {
		return "the pattern is empty"
	}
	if _, err := path.Match(p, ""); err != nil {
		return fmt.Sprintf("%q is not a valid glob (path.Match: %v)", p, err)
	}
	return ""
}

// finish reports every key that no section read, naming the nearest valid
// key: first in the same object, then anywhere in the config (a key written
// at the wrong level).
func (d *decoder) finish() {
	var all []string
	for _, s := range d.sections {
		for _, k := range s.known {
			all = append(all, join(s.path, k))
		}
	}
	for _, s := range d.sections {
		if s.n == nil {
			continue
		}
		for i, k := range s.n.keys {
			if contains(s.known, k) {
				continue
			}
			full := join(s.path, k)
			msg := fmt.Sprintf("unknown key %q", full)
			if near := Nearest(k, s.known); near != "" {
				msg += fmt.Sprintf("; did you mean %q?", join(s.path, near))
			} else if elsewhere := nearestLeaf(k, all); elsewhere != "" {
				msg += fmt.Sprintf("; did you mean %q?", elsewhere)
			} else if s.path != "" && len(s.known) <= 12 {
				msg += fmt.Sprintf(" (%s takes %s)", s.path, strings.Join(s.known, ", "))
			} else {
				msg += " (not a DeepSpeed key that Strata reads; Strata's own keys go under \"strata\")"
			}
			line, col := position(d.data, s.n.keyOff[i])
			d.errs = append(d.errs, &Error{File: d.file, Line: line, Col: col, Msg: msg})
		}
	}
}

// nearestLeaf finds a full path whose last element is key or close to it.
func nearestLeaf(key string, paths []string) string {
	leaves := make([]string, len(paths))
	for i, p := range paths {
		leaves[i] = p[strings.LastIndexByte(p, '.')+1:]
	}
	near := Nearest(key, leaves)
	if near == "" {
		return ""
	}
	for i, l := range leaves {
		if l == near {
			return paths[i]
		}
	}
	return ""
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// orList writes "a, b or c".
func orList(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = strconv.Quote(x)
	}
	if len(q) == 1 {
		return q[0]
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}
