package gputest

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/strata-ai/strata/gpu"
	"github.com/strata-ai/strata/internal/bf16"
	"github.com/strata-ai/strata/internal/fp16"
)

// NewBackend creates a fresh backend with the given number of devices and
// one Comm per device (comms[i] on devices[i]). Backends release their
// resources with t.Cleanup.
type NewBackend func(t *testing.T, devices int) ([]gpu.Device, []gpu.Comm)

// Run runs the whole suite.
func Run(t *testing.T, newBackend NewBackend) {
	t.Run("Memory", func(t *testing.T) { testMemory(t, newBackend) })
	t.Run("Copies", func(t *testing.T) { testCopies(t, newBackend) })
	t.Run("Streams", func(t *testing.T) { testStreams(t, newBackend) })
	t.Run("Collectives", func(t *testing.T) { testCollectives(t, newBackend) })
	t.Run("Ops", func(t *testing.T) { testOps(t, newBackend) })
	t.Run("Grad", func(t *testing.T) { testGrads(t, newBackend) })
	t.Run("Contracts", func(t *testing.T) { testContracts(t, newBackend) })
	t.Run("Scratch", func(t *testing.T) { testScratch(t, newBackend) })
}

// one returns a single fresh device and its default stream.
func one(t *testing.T, nb NewBackend) (gpu.Device, gpu.Stream) {
	t.Helper()
	devs, _ := nb(t, 1)
	if len(devs) != 1 {
		t.Fatalf("backend returned %d devices, want 1", len(devs))
	}
	return devs[0], devs[0].DefaultStream()
}

// encode returns vals as the bytes of dt (floats rounded once to dt).
func encode(vals []float64, dt gpu.DType) []byte {
	b := make([]byte, len(vals)*dt.Size())
	for i, v := range vals {
		switch dt {
		case gpu.F32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
		case gpu.BF16:
			binary.LittleEndian.PutUint16(b[2*i:], bf16.FromFloat32(float32(v)))
		case gpu.F16:
			binary.LittleEndian.PutUint16(b[2*i:], fp16.FromFloat32(float32(v)))
		case gpu.I32:
			binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(v)))
		case gpu.F64:
			binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
		}
	}
	return b
}

// decode reads n elements of dt.
func decode(b []byte, dt gpu.DType) []float64 {
	out := make([]float64, len(b)/dt.Size())
	for i := range out {
		switch dt {
		case gpu.F32:
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
		case gpu.BF16:
			out[i] = float64(bf16.ToFloat32(binary.LittleEndian.Uint16(b[2*i:])))
		case gpu.F16:
			out[i] = float64(fp16.ToFloat32(binary.LittleEndian.Uint16(b[2*i:])))
		case gpu.I32:
			out[i] = float64(int32(binary.LittleEndian.Uint32(b[4*i:])))
		case gpu.F64:
			out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
		}
	}
	return out
}

// stored returns what a dt buffer holds after storing vals.
func stored(vals []float64, dt gpu.DType) []float64 { return decode(encode(vals, dt), dt) }

// upload allocates a buffer of dt holding vals (rounded to dt) and waits
// for the copy.
// viewAt returns a function that uploads values at element off of a
// larger buffer of dt and returns their view: a buffer that starts off a
// backend's vector alignment when off is not a multiple of it.
func viewAt(t *testing.T, d gpu.Device, s gpu.Stream, off int, dt gpu.DType) func([]float64) gpu.Buffer {
	return func(vals []float64) gpu.Buffer {
		return upload(t, d, s, append(make([]float64, off), vals...), dt).Slice(off, len(vals))
	}
}

func upload(t *testing.T, d gpu.Device, s gpu.Stream, vals []float64, dt gpu.DType) gpu.Buffer {
	t.Helper()
	b, err := d.Alloc(len(vals), dt, gpu.Tag{Kind: gpu.Workspace, Purpose: "gputest"})
	if err != nil {
		t.Fatalf("alloc %d×%s: %v", len(vals), dt, err)
	}
	t.Cleanup(func() { d.Free(b) })
	src := encode(vals, dt)
	d.CopyHostToDevice(s, b, 0, src)
	waitStream(t, s)
	return b
}

// alloc allocates n zeroed elements.
func alloc(t *testing.T, d gpu.Device, n int, dt gpu.DType) gpu.Buffer {
	t.Helper()
	b, err := d.Alloc(n, dt, gpu.Tag{Kind: gpu.Workspace, Purpose: "gputest"})
	if err != nil {
		t.Fatalf("alloc %d×%s: %v", n, dt, err)
	}
	t.Cleanup(func() { d.Free(b) })
	return b
}

// download synchronizes s and returns b's elements.
func download(t *testing.T, d gpu.Device, s gpu.Stream, b gpu.Buffer) []float64 {
	t.Helper()
	dst := make([]byte, b.Bytes())
	d.CopyDeviceToHost(s, dst, b, 0)
	waitStream(t, s)
	return decode(dst, b.DType())
}

// ReadBytes copies b to the host on d's default stream, waits, and
// returns its bytes: what backend tests compare bit for bit.
func ReadBytes(t testing.TB, d gpu.Device, b gpu.Buffer) []byte {
	t.Helper()
	out := make([]byte, b.Bytes())
	s := d.DefaultStream()
	d.CopyDeviceToHost(s, out, b, 0)
	if err := s.Synchronize(); err != nil {
		t.Fatalf("read %d bytes back: %v", len(out), err)
	}
	return out
}

func waitStream(t *testing.T, s gpu.Stream) {
	t.Helper()
	if err := s.Synchronize(); err != nil {
		t.Fatalf("synchronize: %v", err)
	}
}

// randVals returns n values uniform in [-scale, scale), exactly
// representable in fp32.
func randVals(r *rand.Rand, n int, scale float64) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = float64(float32((r.Float64()*2 - 1) * scale))
	}
	return v
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x5eed)) }

// tolerance of the suite; see the package doc.
const (
	rtolF32  = 1e-5
	rtolBF16 = 1.0 / 256
	rtolF16  = 1.0 / 2048
	rtolGrad = 1e-4
)

// checkClose compares got with ref element by element: |got-ref| <=
// rtol*mag + (bf16 output ? 2^-8|ref| : 0) + atol.
func checkClose(t *testing.T, what string, got, ref, mag []float64, outDT gpu.DType, rtol float64) {
	t.Helper()
	if len(got) != len(ref) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(ref))
	}
	bad := 0
	for i := range got {
		m := math.Abs(ref[i])
		if mag != nil {
			m = mag[i]
		}
		tol := rtol*m + 1e-30
		switch outDT {
		case gpu.BF16:
			tol += rtolBF16 * math.Abs(ref[i])
		case gpu.F16:
			tol += rtolF16*math.Abs(ref[i]) + 0x1p-25 // half an ulp, and of the subnormals' spacing
		}
		if !(math.Abs(got[i]-ref[i]) <= tol) {
			if bad < 5 {
				t.Errorf("%s[%d] = %.9g, want %.9g (tolerance %.3g)", what, i, got[i], ref[i], tol)
			}
			bad++
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d of %d values out of tolerance", what, bad, len(got))
	}
}

func equalBits(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) {
			return false
		}
	}
	return true
}

func dtName(dts ...gpu.DType) string {
	s := ""
	for i, d := range dts {
		if i > 0 {
			s += "-"
		}
		s += d.String()
	}
	return s
}

func catch(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
		}
	}()
	f()
	return ""
}
