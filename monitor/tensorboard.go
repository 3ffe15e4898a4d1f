package monitor

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// TensorBoard writes one TensorBoard event file, as torch's SummaryWriter.
type TensorBoard struct {
	f    *os.File
	path string
	size int64  // the end of the last whole record
	buf  []byte // a step's records
	now  func() time.Time
}

// fileCount is tensorboard's _global_uid: the event files this process
// has opened, the last element of their names.
var fileCount atomic.Int64

// OpenTensorBoard creates dir (with its parents) and a new event file in
// it, events.out.tfevents.<secs>.<hostname>.<pid>.<n> as tensorboard's
// EventFileWriter names it, and writes its first event (file_version
// "brain.Event:2"). Files already in dir are left as they are: TensorBoard
// reads every event file of a directory as one run.
func OpenTensorBoard(dir string) (*TensorBoard, error) {
	return openTensorBoard(dir, time.Now)
}

func openTensorBoard(dir string, now func() time.Time) (*TensorBoard, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("monitor: tensorboard: %w", err)
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("monitor: tensorboard: %w", err)
	}
	t := now()
	name := fmt.Sprintf("events.out.tfevents.%010d.%s.%d.%d", t.Unix(), host, os.Getpid(), fileCount.Add(1)-1)
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("monitor: tensorboard: %w", err)
	}
	tb := &TensorBoard{f: f, path: path, now: now}
	tb.buf = appendRecord(tb.buf, appendVersionEvent(nil, wallTime(t)))
	if err := tb.flush(); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return tb, nil
}

// Path is the event file.
func (tb *TensorBoard) Path() string { return tb.path }

// WriteEvents appends one Event per scalar (as add_scalar does), all
// stamped with the same wall time, in one write. A step the disk refuses
// is cut back off whole.
func (tb *TensorBoard) WriteEvents(events []Event) error {
	wall := wallTime(tb.now())
	var ev []byte
	for _, e := range events {
		ev = appendScalarEvent(ev[:0], wall, e.X, e.Tag, float32(e.Value))
		tb.buf = appendRecord(tb.buf, ev)
	}
	return tb.flush()
}

// flush writes the records in buf; on failure the file is cut back to its
// last whole record.
func (tb *TensorBoard) flush() error {
	defer func() { tb.buf = tb.buf[:0] }()
	if _, err := tb.f.WriteAt(tb.buf, tb.size); err != nil {
		tb.f.Truncate(tb.size)
		return fmt.Errorf("monitor: tensorboard: %w", err)
	}
	tb.size += int64(len(tb.buf))
	return nil
}

// Close closes the file (every step is written already).
func (tb *TensorBoard) Close() error {
	if err := tb.f.Close(); err != nil {
		return fmt.Errorf("monitor: tensorboard: %w", err)
	}
	return nil
}

func wallTime(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// The TFRecord framing of an event file
// (tensorboard/summary/writer/record_writer.py): the data's length as a
// little-endian uint64, the masked CRC-32C of those 8 bytes, the data, the
// masked CRC-32C of the data.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// maskedCRC is TFRecord's masked CRC-32C: rotated right by 15 bits, plus a
// constant (so that a CRC of data holding CRCs is not trivially zero).
func maskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return (c>>15 | c<<17) + 0xa282ead8
}

func appendRecord(dst, data []byte) []byte {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(data)))
	dst = append(dst, n[:]...)
	dst = binary.LittleEndian.AppendUint32(dst, maskedCRC(n[:]))
	dst = append(dst, data...)
	return binary.LittleEndian.AppendUint32(dst, maskedCRC(data))
}

// The protocol buffers of tensorboard/compat/proto, the fields used:
//
//	message Event   { double wall_time = 1; int64 step = 2;
//	                  oneof what { string file_version = 3; Summary summary = 5; } }
//	message Summary { repeated Value value = 1; }
//	message Value   { string tag = 1; oneof value { float simple_value = 2; } }
const (
	eventWallTime    protowire.Number = 1
	eventStep        protowire.Number = 2
	eventFileVersion protowire.Number = 3
	eventSummary     protowire.Number = 5
	summaryValue     protowire.Number = 1
	valueTag         protowire.Number = 1
	valueSimple      protowire.Number = 2
)

// fileVersion is the first event's file_version, as every SummaryWriter
// writes it.
const fileVersion = "brain.Event:2"

func appendVersionEvent(dst []byte, wall float64) []byte {
	dst = protowire.AppendTag(dst, eventWallTime, protowire.Fixed64Type)
	dst = protowire.AppendFixed64(dst, math.Float64bits(wall))
	dst = protowire.AppendTag(dst, eventFileVersion, protowire.BytesType)
	return protowire.AppendString(dst, fileVersion)
}

func appendScalarEvent(dst []byte, wall float64, step int64, tag string, v float32) []byte {
	var value []byte
	value = protowire.AppendTag(value, valueTag, protowire.BytesType)
	value = protowire.AppendString(value, tag)
	value = protowire.AppendTag(value, valueSimple, protowire.Fixed32Type)
	value = protowire.AppendFixed32(value, math.Float32bits(v))
	dst = protowire.AppendTag(dst, eventWallTime, protowire.Fixed64Type)
	dst = protowire.AppendFixed64(dst, math.Float64bits(wall))
	dst = protowire.AppendTag(dst, eventStep, protowire.VarintType)
	dst = protowire.AppendVarint(dst, uint64(step))
	dst = protowire.AppendTag(dst, eventSummary, protowire.BytesType)
	summary := protowire.AppendTag(nil, summaryValue, protowire.BytesType)
	summary = protowire.AppendBytes(summary, value)
	return protowire.AppendBytes(dst, summary)
}
