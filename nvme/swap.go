package nvme

import (
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/strata-ai/strata/internal/units"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// SwapOptions configure a Swap. The zero value of each field means its default.
type SwapOptions struct {
	Paths       []string // directories, one per drive; each gets one preallocated file
	SizeBytes   int64    // total swap space, split evenly across Paths
	StripeBytes int64    // stripe unit, and the checksum granule; default 1 MiB
	// StripeMinBytes: extents at least this large are striped over all
	// paths; smaller ones live in one file. Default 2 × StripeBytes.
	StripeMinBytes int64
	// FileName: default a name of this Swap's own ("strata-<pid>-<random>.swap"),
	// so runs sharing a path never share a file. A fixed name is locked
	// the same way: a second Swap on it fails with ErrSwapInUse.
	FileName  string
	KeepFiles bool // keep the files at Close (default: remove them)
}

// Validate fills defaults and checks what can be checked without the disks.
func (o *SwapOptions) Validate() error {
	if len(o.Paths) == 0 {
		return errors.New("nvme: swap: no paths")
	}
	if o.SizeBytes <= 0 {
		return fmt.Errorf("nvme: swap: size %d: want > 0", o.SizeBytes)
	}
	if o.StripeBytes == 0 {
		o.StripeBytes = units.MiB
	}
	if o.StripeMinBytes == 0 {
		o.StripeMinBytes = 2 * o.StripeBytes
	}
	if o.FileName == "" {
		o.FileName = newSwapFileName()
	}
	if o.StripeBytes < 512 || o.StripeBytes > maxRequestBytes {
		return fmt.Errorf("nvme: swap: stripe size %d: want 512 B .. 1 GiB", o.StripeBytes)
	}
	seen := map[string]string{} // NewSwap also resolves symlinks and relative paths
	for _, p := range o.Paths {
		c := filepath.Clean(p)
		if q, ok := seen[c]; ok {
			return fmt.Errorf("nvme: swap paths %s and %s are one directory (%s): give it once", q, p, c)
		}
		seen[c] = p
	}
	return nil
}

func (o SwapOptions) String() string {
	return fmt.Sprintf("paths=%v size=%s stripe=%s stripe_min=%s", o.Paths, units.FormatBytes(o.SizeBytes),
		units.FormatSize(o.StripeBytes), units.FormatSize(o.StripeMinBytes))
}

type span struct{ off, len int64 }

// swapFile is one preallocated file and its free list, sorted by offset.
type swapFile struct {
	f         *File
	sizeBytes int64
	free      []span
	freeBytes int64
}

// piece is one stripe unit of an extent: where it lives and its checksum.
type piece struct {
	file    int
	fileOff int64
	logOff  int64 // within the extent
	len     int64
	crc     uint32
}

// Extent is a run of swap space handed out by Alloc. Its data is valid after
// a successful Write and until Free or a failed Write. The caller must not
// run Read and Write on one extent at the same time.
type Extent struct {
	id        uint64
	sizeBytes int64
	pieces    []piece
	spans     []struct {
		file int
		s    span
	}
	valid atomic.Bool
	freed bool
}

// ID names the extent in errors.
func (e *Extent) ID() uint64 { return e.id }

// SizeBytes is the extent's length.
func (e *Extent) SizeBytes() int64 { return e.sizeBytes }

// Striped reports whether the extent spans several files.
func (e *Extent) Striped() bool { return len(e.spans) > 1 }

// Swap is swap space over preallocated O_DIRECT files on one or more paths.
// Alloc and Free are safe for concurrent use; Read and Write of different
// extents may run concurrently.
type Swap struct {
	opts   SwapOptions
	dev    Device
	align  int64
	files  []*swapFile
	mu     sync.Mutex
	nextID uint64
	rr     int // round-robin start for unstriped extents
	closed bool

	fixedName bool        // opts.FileName was given, not made unique
	resolved  []string    // opts.Paths resolved (ResolvePath)
	stale     []StaleFile // found on the paths at NewSwap
}

// NewSwap checks every path (exists, is a directory, allows O_DIRECT, has the
// space, is not another path spelled differently), and only then creates,
// locks (flock, held until Close) and preallocates one file per path. It
// lists the stale swap files of killed runs it finds there (Stale). On
// error it leaves nothing behind.
func NewSwap(dev Device, opts SwapOptions) (*Swap, error) {
	fixed := opts.FileName != ""
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Swap{opts: opts, dev: dev, fixedName: fixed}
	if err := s.checkPaths(); err != nil {
		return nil, err
	}
	n := int64(len(opts.Paths))
	perPath := units.AlignUp((opts.SizeBytes+n-1)/n, opts.StripeBytes)
	for i, p := range opts.Paths {
		if err := s.openFile(p, s.resolved[i], perPath); err != nil {
			s.closeFiles(true)
			return nil, err
		}
	}
	if !opts.KeepFiles {
		live.add(s)
	}
	return s, nil
}

// checkPaths resolves every path, refuses two spellings of one directory,
// and checks each is a directory doing direct I/O with the space.
func (s *Swap) checkPaths() error {
	opts := s.opts
	n := int64(len(opts.Paths))
	perPath := units.AlignUp((opts.SizeBytes+n-1)/n, opts.StripeBytes)
	first := map[string]string{}
	for _, p := range opts.Paths {
		r, err := ResolvePath(p)
		if err != nil {
			return err
		}
		if q, ok := first[r]; ok {
			return fmt.Errorf("nvme: swap paths %s and %s are one directory (%s): give it once", q, p, r)
		}
		first[r] = p
		s.resolved = append(s.resolved, r)
		st, err := os.Stat(r)
		if err != nil {
			return fmt.Errorf("nvme: swap path %s: %w", p, err)
		}
		if !st.IsDir() {
			return fmt.Errorf("nvme: swap path %s is not a directory", p)
		}
		if err := checkDirectIOFS(r); err != nil {
			return err
		}
		stale, err := StaleSwapFiles(r)
		if err != nil {
			return err
		}
		s.stale = append(s.stale, stale...)
		if err := checkSpace(p, r, perPath, stale); err != nil {
			return err
		}
	}
	return nil
}

// CheckSwapSpace checks, creating nothing, that every directory of paths
// has the room NewSwap would take there for a swap of sizeBytes striped in
// stripeBytes units. The error (matching ErrNoSpace) names the path, what
// the swap needs there, what is free and what is reclaimable: the space
// that swap files of killed runs hold (StaleSwapFiles; RemoveStaleSwapFiles
// removes them).
func CheckSwapSpace(paths []string, sizeBytes, stripeBytes int64) error {
	if len(paths) == 0 || sizeBytes <= 0 || stripeBytes <= 0 {
		return fmt.Errorf("nvme: CheckSwapSpace: %d paths, size %d, stripe %d", len(paths), sizeBytes, stripeBytes)
	}
	n := int64(len(paths))
	perPath := units.AlignUp((sizeBytes+n-1)/n, stripeBytes)
	for _, p := range paths {
		r, err := ResolvePath(p)
		if err != nil {
			return err
		}
		stale, err := StaleSwapFiles(r)
		if err != nil {
			return err
		}
		if err := checkSpace(p, r, perPath, stale); err != nil {
			return err
		}
	}
	return nil
}

// freeBytes is FreeBytes (tests replace it).
var freeBytes = FreeBytes

// checkSpace refuses a swap file of need bytes in dir (spelled p) beyond
// its free space, saying what the stale files there would give back.
func checkSpace(p, dir string, need int64, stale []StaleFile) error {
	free, err := freeBytes(dir)
	if err != nil {
		return err
	}
	if need <= free {
		return nil
	}
	return fmt.Errorf("nvme: swap: %s needs %s, only %s free, %s reclaimable%s: %w", p,
		units.FormatBytes(need), units.FormatBytes(free), units.FormatBytes(staleBytes(stale)), staleHint(stale), ErrNoSpace)
}

// staleBytes is what stale swap files hold on disk.
func staleBytes(stale []StaleFile) int64 {
	var b int64
	for _, f := range stale {
		b += f.SizeBytes
	}
	return b
}

// staleHint says what holds the reclaimable space, for an ENOSPC error.
func staleHint(stale []StaleFile) string {
	if len(stale) == 0 {
		return " (no stale swap files there: free space on it or give another nvme_path)"
	}
	return fmt.Sprintf(" (%d stale swap files of killed runs hold it: remove them, e.g. %s, or start a run there, which removes them)", len(stale), stale[0].Path)
}

// openFile creates (or, for a fixed FileName, opens) the swap file in dir,
// locks it, and preallocates it. A new file is created under a name that
// SwapFileGlob does not match, locked, and only then renamed to its own:
// a file that matches is locked from the moment it appears, so another
// run's RemoveStaleSwapFiles (at its start) never takes it for a killed
// run's in the instant between create and flock.
func (s *Swap) openFile(p, dir string, sizeBytes int64) error {
	name := filepath.Join(dir, s.opts.FileName)
	flag := os.O_RDWR | os.O_CREATE | os.O_EXCL
	created := filepath.Join(dir, "."+s.opts.FileName+".new")
	if s.fixedName {
		flag = os.O_RDWR | os.O_CREATE // a fixed name: the lock decides
		created = name
	}
	f, err := OpenFile(created, flag, 0o600)
	if err != nil {
		return err
	}
	if err := lockSwap(f); err != nil {
		f.Close() // not ours: never removed
		return err
	}
	if !s.fixedName {
		if err := os.Rename(created, name); err != nil {
			os.Remove(created)
			f.Close()
			return fmt.Errorf("nvme: swap file %s: %w", name, err)
		}
		f.path = name
	}
	if s.fixedName {
		if err := os.Truncate(name, 0); err != nil { // ours now: no old data counts
			f.Close()
			return fmt.Errorf("nvme: truncate swap file %s: %w", name, err)
		}
	}
	s.files = append(s.files, &swapFile{f: f, sizeBytes: sizeBytes, free: []span{{0, sizeBytes}}, freeBytes: sizeBytes})
	if s.opts.StripeBytes%f.Alignment() != 0 {
		return fmt.Errorf("nvme: swap: stripe size %d is not a multiple of the I/O alignment %d of %s (%s)",
			s.opts.StripeBytes, f.Alignment(), p, f.AlignmentSource())
	}
	s.align = max(s.align, f.Alignment())
	return f.Allocate(sizeBytes)
}

// Stale lists the swap files of killed runs (no live holder) that NewSwap
// found on its paths; they are left alone (see RemoveStaleSwapFiles).
func (s *Swap) Stale() []StaleFile { return append([]StaleFile(nil), s.stale...) }

// Alignment is the multiple every extent size, buffer address and length
// must respect.
func (s *Swap) Alignment() int64 { return s.align }

// FreeBytes is the unallocated space over all files.
func (s *Swap) FreeBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, f := range s.files {
		n += f.freeBytes
	}
	return n
}

// Files are the swap files (for registration with an engine).
func (s *Swap) Files() []*File {
	out := make([]*File, len(s.files))
	for i, f := range s.files {
		out[i] = f.f
	}
	return out
}

// Alloc reserves an extent of sizeBytes (a multiple of Alignment). Extents of
// at least StripeMinBytes are striped over every path in StripeBytes units.
func (s *Swap) Alloc(sizeBytes int64) (*Extent, error) {
	if sizeBytes <= 0 || sizeBytes%s.align != 0 {
		return nil, fmt.Errorf("nvme: swap alloc %d bytes: not a positive multiple of the alignment %d", sizeBytes, s.align)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("nvme: swap alloc: %w", ErrClosed)
	}
	s.nextID++
	e := &Extent{id: s.nextID, sizeBytes: sizeBytes}
	stripe := s.opts.StripeBytes
	nf := len(s.files)
	if nf > 1 && sizeBytes >= s.opts.StripeMinBytes {
		// Unit u lives in file u % nf, at that file's region start plus
		// (u / nf) × stripe (RAID-0 without a RAID device).
		need := make([]int64, nf)
		units := (sizeBytes + stripe - 1) / stripe
		for u := int64(0); u < units; u++ {
			need[u%int64(nf)] += min(stripe, sizeBytes-u*stripe)
		}
		base := make([]int64, nf)
		for i := range nf {
			off, ok := s.files[i].take(need[i])
			if !ok {
				for j := range i {
					s.files[j].give(span{base[j], need[j]})
				}
				return nil, s.noSpace(sizeBytes)
			}
			base[i] = off
			e.spans = append(e.spans, struct {
				file int
				s    span
			}{i, span{off, need[i]}})
		}
		for u := int64(0); u < units; u++ {
			f := int(u % int64(nf))
			e.pieces = append(e.pieces, piece{file: f, fileOff: base[f] + (u/int64(nf))*stripe, logOff: u * stripe, len: min(stripe, sizeBytes-u*stripe)})
		}
		return e, nil
	}
	for k := range nf {
		i := (s.rr + k) % nf
		off, ok := s.files[i].take(sizeBytes)
		if !ok {
			continue
		}
		s.rr = i + 1
		e.spans = append(e.spans, struct {
			file int
			s    span
		}{i, span{off, sizeBytes}})
		for lo := int64(0); lo < sizeBytes; lo += stripe {
			e.pieces = append(e.pieces, piece{file: i, fileOff: off + lo, logOff: lo, len: min(stripe, sizeBytes-lo)})
		}
		return e, nil
	}
	return nil, s.noSpace(sizeBytes)
}

func (s *Swap) noSpace(sizeBytes int64) error {
	var free int64
	for _, f := range s.files {
		free += f.freeBytes
	}
	return fmt.Errorf("nvme: swap alloc %s: %s free in %d files (maybe fragmented): %w",
		units.FormatBytes(sizeBytes), units.FormatBytes(free), len(s.files), ErrNoSpace)
}

// Free returns the extent's space. Freeing an extent twice panics.
func (s *Swap) Free(e *Extent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.freed {
		panic(fmt.Sprintf("nvme: extent %d freed twice", e.id))
	}
	e.freed = true
	e.valid.Store(false)
	for _, sp := range e.spans {
		s.files[sp.file].give(sp.s)
	}
}

// take is first-fit allocation from the free list.
func (f *swapFile) take(n int64) (int64, bool) {
	for i, sp := range f.free {
		if sp.len < n {
			continue
		}
		off := sp.off
		if sp.len == n {
			f.free = append(f.free[:i], f.free[i+1:]...)
		} else {
			f.free[i] = span{sp.off + n, sp.len - n}
		}
		f.freeBytes -= n
		return off, true
	}
	return 0, false
}

// give returns a span and merges it with its neighbours.
func (f *swapFile) give(sp span) {
	if sp.len == 0 {
		return
	}
	i := sort.Search(len(f.free), func(i int) bool { return f.free[i].off >= sp.off })
	if (i < len(f.free) && f.free[i].off < sp.off+sp.len) || (i > 0 && f.free[i-1].off+f.free[i-1].len > sp.off) {
		panic(fmt.Sprintf("nvme: swap: span [%d,+%d) freed while free", sp.off, sp.len))
	}
	f.free = append(f.free, span{})
	copy(f.free[i+1:], f.free[i:])
	f.free[i] = sp
	if i+1 < len(f.free) && f.free[i].off+f.free[i].len == f.free[i+1].off {
		f.free[i].len += f.free[i+1].len
		f.free = append(f.free[:i+1], f.free[i+2:]...)
	}
	if i > 0 && f.free[i-1].off+f.free[i-1].len == f.free[i].off {
		f.free[i-1].len += f.free[i].len
		f.free = append(f.free[:i], f.free[i+1:]...)
	}
	f.freeBytes += sp.len
}

func (s *Swap) checkBuf(op string, e *Extent, buf []byte) {
	if e.freed {
		panic(fmt.Sprintf("nvme: swap %s of extent %d after Free", op, e.id))
	}
	if int64(len(buf)) != e.sizeBytes {
		panic(fmt.Sprintf("nvme: swap %s of extent %d: buffer of %d bytes, extent of %d", op, e.id, len(buf), e.sizeBytes))
	}
}

// The checksums are computed in step with the I/O, not before or after all
// of it: a write checksums crcGroupBytes of stripe units and submits them
// before it checksums the next, and a read verifies each unit as it lands.
// CRC-32C runs at about 10 GB/s on one core, so an extent checksummed whole
// before its first request (a write) or after its last (a read) kept the
// drive idle for a tenth of a second per GB; with several moves starting
// together (the optimizer's master, m and v) the drive and the cores took
// turns, and a 192 MiB extent moved at two thirds of the drive's rate.
const crcGroupBytes = 4 << 20

// Write stores buf (exactly the extent's size, aligned) in the extent and
// records a CRC-32C per stripe unit. If any part fails, the extent holds no
// valid data and the error names every part that was lost.
func (s *Swap) Write(e *Extent, buf []byte) error {
	s.checkBuf("write", e, buf)
	e.valid.Store(false)
	reqs := make([]Request, len(e.pieces))
	ptrs := make([]*Request, len(e.pieces))
	var c Completion
	group := max(1, int(crcGroupBytes/s.opts.StripeBytes))
	for lo := 0; lo < len(e.pieces); lo += group {
		hi := min(lo+group, len(e.pieces))
		for i := lo; i < hi; i++ {
			p := &e.pieces[i]
			b := buf[p.logOff : p.logOff+p.len]
			p.crc = crc32.Checksum(b, castagnoli)
			reqs[i] = Request{Op: OpWrite, File: s.files[p.file].f, Buf: b, Offset: p.fileOff, Wait: &c}
			ptrs[i] = &reqs[i]
		}
		if err := s.dev.Submit(ptrs[lo:hi]...); err != nil {
			c.Wait() // the groups already queued still use buf
			return fmt.Errorf("nvme: swap write extent %d: lost: %w", e.id, inner{err})
		}
	}
	if err := c.Wait(); err != nil {
		return fmt.Errorf("nvme: swap write extent %d (%s): lost: %w", e.id, units.FormatBytes(e.sizeBytes), inner{err})
	}
	e.valid.Store(true)
	return nil
}

// Read fills buf (exactly the extent's size, aligned) from the extent and
// verifies every stripe unit's CRC-32C as it lands. On error buf's contents
// are undefined.
func (s *Swap) Read(e *Extent, buf []byte) error {
	s.checkBuf("read", e, buf)
	if !e.valid.Load() {
		return fmt.Errorf("nvme: swap read extent %d: %w (never written, or its last write failed)", e.id, ErrNoData)
	}
	n := len(e.pieces)
	reqs := make([]Request, n)
	ptrs := make([]*Request, n)
	landed := make(chan int, n) // never blocks the engine's goroutine: room for every unit
	for i, p := range e.pieces {
		reqs[i] = Request{Op: OpRead, File: s.files[p.file].f, Buf: buf[p.logOff : p.logOff+p.len], Offset: p.fileOff,
			Tag: uint64(i), Done: func(r *Request) { landed <- int(r.Tag) }}
		ptrs[i] = &reqs[i]
	}
	if err := s.dev.Submit(ptrs...); err != nil {
		return fmt.Errorf("nvme: swap read extent %d: %w", e.id, inner{err})
	}
	bad := make([]error, n) // per unit, so the error lists them in the extent's order
	failed := false
	for range n {
		i := <-landed
		r, p := &reqs[i], &e.pieces[i]
		switch {
		case r.Err != nil:
			bad[i] = r.Err
		case failed:
			continue // the read fails anyway; checksums would only delay it
		default:
			if got := crc32.Checksum(r.Buf, castagnoli); got != p.crc {
				bad[i] = &CorruptionError{Extent: e.id, Path: s.files[p.file].f.path, Offset: p.fileOff, Length: p.len, Want: p.crc, Got: got}
			}
		}
		failed = failed || bad[i] != nil
	}
	if !failed {
		return nil
	}
	err := errors.Join(bad...)
	var ce *CorruptionError
	if errors.As(err, &ce) && !hasIOError(bad) {
		return fmt.Errorf("nvme: swap read: %w", inner{err})
	}
	return fmt.Errorf("nvme: swap read extent %d (%s): %w", e.id, units.FormatBytes(e.sizeBytes), inner{err})
}

// hasIOError reports whether one of errs is not a checksum mismatch.
func hasIOError(errs []error) bool {
	for _, err := range errs {
		var ce *CorruptionError
		if err != nil && !errors.As(err, &ce) {
			return true
		}
	}
	return false
}

// Close closes the files (and removes them unless KeepFiles). Extents must
// not be in use.
func (s *Swap) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	live.remove(s)
	return s.closeFiles(!s.opts.KeepFiles)
}

func (s *Swap) closeFiles(remove bool) error {
	var errs []error
	for _, f := range s.files {
		// The name goes first, while the lock is held: closing releases
		// it, and a run waiting for it must not lock a name about to go.
		if remove {
			if err := os.Remove(f.f.path); err != nil && !os.IsNotExist(err) {
				errs = append(errs, fmt.Errorf("nvme: remove %s: %w", f.f.path, err))
			}
		}
		if err := f.f.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	s.files = nil
	return errors.Join(errs...)
}
