package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

//go:generate go tool stringer -type=kind -linecomment -output=kind_string.go

// kind is the JSON type of a node.
type kind uint8

const (
	kindNull   kind = iota // null
	kindBool               // boolean
	kindNumber             // number
	kindString             // string
	kindArray              // array
	kindObject             // object
)

// node is a JSON value with the byte offset where it starts, so that every
// message about a value can name its line and column.
type node struct {
	kind   kind
	offset int
	text   string // string value, or the literal text of a number
	b      bool
	keys   []string // object keys in document order
	keyOff []int    // offset of each key
	vals   []*node  // object values, parallel to keys
	elems  []*node  // array elements
}

// field returns the value under key and its index, or nil.
func (n *node) field(key string) (*node, int) {
	for i, k := range n.keys {
		if k == key {
			return n.vals[i], i
		}
	}
	return nil, -1
}

// position turns a byte offset into a 1-based line and column (columns count
// characters, not bytes).
func position(data []byte, offset int) (line, col int) {
	if offset > len(data) {
		offset = len(data)
	}
	if offset < 0 {
		offset = 0
	}
	line = 1 + bytes.Count(data[:offset], []byte{'\n'})
	start := bytes.LastIndexByte(data[:offset], '\n') + 1
	col = 1 + utf8.RuneCount(data[start:offset])
	return line, col
}

// parseTree checks the syntax with encoding/json (for its messages) and then
// walks the tokens to build a tree with offsets. Duplicate keys are errors,
// as they are for DeepSpeed.
func parseTree(data []byte, file string) (*node, error) {
	// A RawMessage: the syntax is checked whole (the same errors and
	// offsets), and no number is converted, so that one too large for a
	// float64 (1e400) is refused by its key, at its position.
	var probe json.RawMessage
	if err := json.Unmarshal(data, &probe); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			off := int(se.Offset) - 1 // the byte that was rejected
			msg := se.Error()
			if msg == "unexpected end of JSON input" {
				off = len(bytes.TrimRight(data, " \t\r\n"))
				msg = "unexpected end of input (a missing } or ]?)"
			}
			line, col := position(data, off)
			return nil, &Error{File: file, Line: line, Col: col, Msg: "malformed JSON: " + msg}
		}
		return nil, &Error{File: file, Msg: "malformed JSON: " + err.Error()}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	p := treeParser{data: data, dec: dec, file: file}
	root, err := p.value()
	if err != nil {
		return nil, err
	}
	if root.kind != kindObject {
		line, col := position(data, root.offset)
		return nil, &Error{File: file, Line: line, Col: col, Msg: fmt.Sprintf("the config must be a JSON object, got %s", root.kind)}
	}
	return root, nil
}

type treeParser struct {
	data []byte
	dec  *json.Decoder
	file string
}

// start returns the offset of the next token: the decoder's offset skipped
// past whitespace and separators.
func (p *treeParser) start() int {
	off := int(p.dec.InputOffset())
	for off < len(p.data) {
		switch p.data[off] {
		case ' ', '\t', '\r', '\n', ',', ':':
			off++
			continue
		}
		break
	}
	return off
}

func (p *treeParser) value() (*node, error) {
	off := p.start()
	tok, err := p.dec.Token()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("config: %s: malformed JSON: %w", p.file, err)
	}
	n := &node{offset: off}
	switch t := tok.(type) {
	case nil:
		n.kind = kindNull
	case bool:
		n.kind, n.b = kindBool, t
	case json.Number:
		n.kind, n.text = kindNumber, string(t)
	case string:
		n.kind, n.text = kindString, t
	case json.Delim:
		switch t {
		case '{':
			n.kind = kindObject
			for p.dec.More() {
				koff := p.start()
				ktok, err := p.dec.Token()
				if err != nil {
					return nil, fmt.Errorf("config: %s: malformed JSON: %w", p.file, err)
				}
				key, _ := ktok.(string)
				if _, i := n.field(key); i >= 0 {
					line, col := position(p.data, koff)
					return nil, &Error{File: p.file, Line: line, Col: col, Msg: fmt.Sprintf("duplicate key %q (first at line %d)", key, lineOf(p.data, n.keyOff[i]))}
				}
				v, err := p.value()
				if err != nil {
					return nil, err
				}
				n.keys, n.keyOff, n.vals = append(n.keys, key), append(n.keyOff, koff), append(n.vals, v)
			}
			if _, err := p.dec.Token(); err != nil { // '}'
				return nil, fmt.Errorf("config: %s: malformed JSON: %w", p.file, err)
			}
		case '[':
			n.kind = kindArray
			for p.dec.More() {
				v, err := p.value()
				if err != nil {
					return nil, err
				}
				n.elems = append(n.elems, v)
			}
			if _, err := p.dec.Token(); err != nil { // ']'
				return nil, fmt.Errorf("config: %s: malformed JSON: %w", p.file, err)
			}
		}
	}
	return n, nil
}

func lineOf(data []byte, off int) int {
	l, _ := position(data, off)
	return l
}
