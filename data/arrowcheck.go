package data

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// arrow-go reads an IPC file's schema (flatbuffers) without verifying it:
// a damaged count of a field's children (or of a union's type ids)
// becomes one allocation of that many (tens of GB: a fatal out-of-memory,
// not an error). So the schema message of a stream, and the footer of a file, are walked here first, every offset
// checked against the bytes and every vector's length against the bytes
// it would take; the messages that follow are bounded by
// ipc.WithMetadataSizeLimit and WithBodySizeLimit (the file's size).

// arrowMetaBytesMax bounds a schema message or footer read to be checked.
const arrowMetaBytesMax = 64 << 20

// fbDepthMax bounds the nesting of fields: deeper is damage.
const fbDepthMax = 256

var errArrowSchema = errors.New("a damaged schema")

// checkArrowSchema checks the schema of the Arrow IPC file f (size bytes;
// fileFormat: the IPC file format, else a stream).
func checkArrowSchema(f *os.File, size int64, fileFormat bool) error {
	var buf []byte
	var root func(fb) (int, error)
	if fileFormat {
		// ... footer, int32 length, "ARROW1"
		var tail [10]byte
		if size < int64(len(tail))+8 {
			return fmt.Errorf("%w: %d bytes", errArrowSchema, size)
		}
		if _, err := f.ReadAt(tail[:], size-10); err != nil {
			return err
		}
		n := int64(int32(binary.LittleEndian.Uint32(tail[:4])))
		if n <= 0 || n > arrowMetaBytesMax || n > size-10-8 {
			return fmt.Errorf("%w: a footer of %d bytes", errArrowSchema, n)
		}
		buf = make([]byte, n)
		if _, err := f.ReadAt(buf, size-10-n); err != nil {
			return err
		}
		root = func(b fb) (int, error) { return b.table(b.root(), 1) } // Footer.schema
	} else {
		// 0xFFFFFFFF, int32 length, the Message
		var head [8]byte
		if _, err := f.ReadAt(head[:], 0); err != nil {
			return err
		}
		n := int64(int32(binary.LittleEndian.Uint32(head[4:])))
		if n <= 0 || n > arrowMetaBytesMax || n > size-8 {
			return fmt.Errorf("%w: a schema message of %d bytes", errArrowSchema, n)
		}
		buf = make([]byte, n)
		if _, err := f.ReadAt(buf, 8); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		root = func(b fb) (int, error) { return b.table(b.root(), 2) } // Message.header
	}
	b := fb(buf)
	schema, err := root(b)
	if err != nil || schema == 0 {
		return fmt.Errorf("%w: no schema", errArrowSchema)
	}
	if err := b.tables(schema, 2, 0, nil); err != nil { // Schema.custom_metadata
		return err
	}
	return b.tables(schema, 1, 0, b.field) // Schema.fields
}

// fb is a flatbuffer, read with every offset checked.
type fb []byte

func (b fb) u32(at int) (int, error) {
	if at < 0 || at+4 > len(b) {
		return 0, fmt.Errorf("%w: an offset out of its %d bytes", errArrowSchema, len(b))
	}
	return int(binary.LittleEndian.Uint32(b[at:])), nil
}

func (b fb) root() int {
	at, err := b.u32(0)
	if err != nil {
		return -1
	}
	return at
}

// slot is where field slot of the table at t is (0: absent).
func (b fb) slot(t, slot int) (int, error) {
	if t < 0 || t+4 > len(b) {
		return 0, fmt.Errorf("%w: a table out of its bytes", errArrowSchema)
	}
	vt := t - int(int32(binary.LittleEndian.Uint32(b[t:])))
	if vt < 0 || vt+4 > len(b) {
		return 0, fmt.Errorf("%w: a vtable out of its bytes", errArrowSchema)
	}
	vsize := int(binary.LittleEndian.Uint16(b[vt:]))
	at := vt + 4 + 2*slot
	if at+2 > vt+vsize || at+2 > len(b) {
		return 0, nil
	}
	o := int(binary.LittleEndian.Uint16(b[at:]))
	if o == 0 {
		return 0, nil
	}
	return t + o, nil
}

// table follows the reference in slot of the table at t (0: absent).
func (b fb) table(t, slot int) (int, error) {
	at, err := b.slot(t, slot)
	if err != nil || at == 0 {
		return 0, err
	}
	o, err := b.u32(at)
	if err != nil {
		return 0, err
	}
	if o == 0 || at+o >= len(b) {
		return 0, fmt.Errorf("%w: a reference out of its bytes", errArrowSchema)
	}
	return at + o, nil
}

// tables checks the vector of tables in slot of the table at t: its
// length against its bytes, and each table with each (nil: none).
func (b fb) tables(t, slot, depth int, each func(t, depth int) error) error {
	v, err := b.table(t, slot)
	if err != nil || v == 0 {
		return err
	}
	n, err := b.u32(v)
	if err != nil {
		return err
	}
	if n > (len(b)-v-4)/4 {
		return fmt.Errorf("%w: a vector of %d items in %d bytes", errArrowSchema, n, len(b)-v-4)
	}
	for i := range n {
		e := v + 4 + 4*i
		o, err := b.u32(e)
		if err != nil {
			return err
		}
		if o == 0 || e+o >= len(b) {
			return fmt.Errorf("%w: a reference out of its bytes", errArrowSchema)
		}
		if each != nil {
			if err := each(e+o, depth); err != nil {
				return err
			}
		}
	}
	return nil
}

// fbUnion is the Type union's member Union (Schema.fbs).
const fbUnion = 14

// field checks a Field table: its custom metadata, a union's type ids,
// and its children.
func (b fb) field(t, depth int) error {
	if depth > fbDepthMax {
		return fmt.Errorf("%w: fields nested more than %d deep", errArrowSchema, fbDepthMax)
	}
	if err := b.tables(t, 6, depth, nil); err != nil { // Field.custom_metadata
		return err
	}
	at, err := b.slot(t, 2) // Field.type_type
	if err != nil {
		return err
	}
	if at != 0 && at < len(b) && b[at] == fbUnion {
		u, err := b.table(t, 3) // Field.type
		if err != nil {
			return err
		}
		if u != 0 {
			if err := b.vector(u, 1, 4); err != nil { // Union.typeIds
				return err
			}
		}
	}
	return b.tables(t, 5, depth+1, b.field) // Field.children
}

// vector checks the length of the vector of scalars of size bytes in
// slot of the table at t against its bytes.
func (b fb) vector(t, slot, size int) error {
	v, err := b.table(t, slot)
	if err != nil || v == 0 {
		return err
	}
	n, err := b.u32(v)
	if err != nil {
		return err
	}
	if n > (len(b)-v-4)/size {
		return fmt.Errorf("%w: a vector of %d items in %d bytes", errArrowSchema, n, len(b)-v-4)
	}
	return nil
}
