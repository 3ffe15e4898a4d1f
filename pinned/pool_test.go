package pinned

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"unsafe"
)

const mib = 1 << 20

func newPool(t *testing.T, o Options) *Pool {
	t.Helper()
	if o.Lock == LockIfAllowed {
		o.Lock = LockNever // locking has its own tests; keep the others cheap
	}
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

func mustGet(t *testing.T, p *Pool, size int64, purpose string) *Buffer {
	t.Helper()
	b, err := p.Get(size, purpose)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// mustPanic runs f and checks it panics with a message holding each of want.
func mustPanic(t *testing.T, f func(), want ...string) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if r == nil {
			t.Fatalf("no panic; want one containing %q", want)
		}
		msg := fmt.Sprint(r)
		for _, w := range append([]string{"pinned: "}, want...) {
			if !strings.Contains(msg, w) {
				t.Fatalf("panic %q does not contain %q", msg, w)
			}
		}
	}()
	f()
}

func TestOptionsValidate(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{}, "BudgetBytes must be set"},
		{Options{BudgetBytes: mib, AlignBytes: 512}, "power of two of at least 4096"},
		{Options{BudgetBytes: mib, AlignBytes: 12288}, "power of two"},
		{Options{BudgetBytes: 4 * mib, ArenaSizeBytes: mib + 1}, "multiple of AlignBytes"},
		{Options{BudgetBytes: 2048}, "smaller than AlignBytes"},
		{Options{BudgetBytes: mib, Lock: 7}, "unknown Lock"},
	} {
		err := c.o.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.o, err, c.want)
		}
	}
	o := Options{BudgetBytes: 3 << 30}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := o.String(), "budget=3G arena=1G align=4K lock=if-allowed populate=auto hugepages=true"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestAlignmentAndDisjoint(t *testing.T) {
	for _, align := range []int64{4096, 64 << 10} {
		p := newPool(t, Options{BudgetBytes: 8 * mib, ArenaSizeBytes: 4 * mib, AlignBytes: align})
		var bufs []*Buffer
		for i, size := range []int64{1, 4095, 4096, 4097, 12345, 64 << 10, mib + 1, 3 * mib} {
			b := mustGet(t, p, size, "test")
			mem := b.Bytes()
			if int64(len(mem)) != size || int64(cap(mem)) != b.PaddedLen() || b.PaddedLen()%align != 0 || b.PaddedLen()-size >= align {
				t.Fatalf("align %d size %d: len %d cap %d padded %d", align, size, len(mem), cap(mem), b.PaddedLen())
			}
			if addr := uintptr(unsafe.Pointer(&mem[0])); addr%uintptr(align) != 0 || addr != b.Addr() {
				t.Fatalf("align %d size %d: address %#x not aligned (Addr %#x)", align, size, addr, b.Addr())
			}
			full := mem[:cap(mem)]
			for j := range full {
				full[j] = byte(i + 1)
			}
			bufs = append(bufs, b)
		}
		// No buffer overlaps another: each still holds its own pattern.
		for i, b := range bufs {
			mem := b.Bytes()
			for j, v := range mem[:cap(mem)] {
				if v != byte(i+1) {
					t.Fatalf("align %d: buffer %d byte %d = %d, overwritten by buffer %d", align, i, j, v, v-1)
				}
			}
			p.Put(b)
		}
	}
}

func TestBudgetErrorListsPurposes(t *testing.T) {
	p := newPool(t, Options{BudgetBytes: 16 * mib})
	for range 2 {
		mustGet(t, p, 4*mib, "optimizer states")
	}
	for range 3 {
		mustGet(t, p, 2*mib, "param staging")
	}
	_, err := p.Get(4*mib, "nvme read")
	if !errors.Is(err, ErrBudget) {
		t.Fatalf("got %v, want ErrBudget", err)
	}
	want := `pinned: budget 16.0 MiB exceeded by request of 4.0 MiB for "nvme read": in use: ` +
		`optimizer states 8.0 MiB (2 buffers), param staging 6.0 MiB (3 buffers); 2.0 MiB free`
	if err.Error() != want {
		t.Fatalf("error\n got %s\nwant %s", err, want)
	}
	var be *BudgetError
	if !errors.As(err, &be) || be.RequestBytes != 4*mib || len(be.InUse) != 2 {
		t.Fatalf("BudgetError fields: %+v", be)
	}
	if _, err := p.Get(17*mib, "huge"); !errors.Is(err, ErrBudget) || !strings.Contains(err.Error(), "request of 17.0 MiB") {
		t.Fatalf("request past the budget: %v", err)
	}
	for b := range p.held {
		p.Put(b)
	}
}

func TestFragmentedBudgetSaysSo(t *testing.T) {
	p := newPool(t, Options{BudgetBytes: 4 * mib})
	var bufs []*Buffer
	for range 4 {
		bufs = append(bufs, mustGet(t, p, mib, "a"))
	}
	p.Put(bufs[0])
	p.Put(bufs[2]) // 2 MiB free in two holes of 1 MiB
	_, err := p.Get(2*mib, "b")
	if !errors.Is(err, ErrBudget) || !strings.Contains(err.Error(), "2.0 MiB free but fragmented (largest run 1.0 MiB)") {
		t.Fatalf("got %v", err)
	}
	p.Put(bufs[1]) // the holes coalesce once reclaimed
	b := mustGet(t, p, 3*mib, "b")
	if b.Offset() != 0 {
		t.Fatalf("coalesced buffer at offset %d, want 0", b.Offset())
	}
	p.Put(b)
	p.Put(bufs[3])
}

func TestPutCoalesces(t *testing.T) {
	p := newPool(t, Options{BudgetBytes: 8 * mib, ArenaSizeBytes: 2 * mib})
	a := mustGet(t, p, 100_000, "x")
	addr := a.Addr()
	p.Put(a)
	b := mustGet(t, p, 98_305, "y") // the same padded size (102400): the same memory back
	if b.Addr() != addr || b.PaddedLen() != 102400 {
		t.Fatalf("reuse: addr %#x want %#x, padded %d", b.Addr(), addr, b.PaddedLen())
	}
	p.Put(b)
	// Fill the whole budget with 1 MiB buffers, give them back in an order
	// that leaves holes between them until the last: a single 8 MiB buffer,
	// across the four arenas, then takes the whole mapping.
	var bufs []*Buffer
	for {
		b, err := p.Get(mib, "fill")
		if err != nil {
			break
		}
		bufs = append(bufs, b)
	}
	if len(bufs) != 8 {
		t.Fatalf("filled with %d buffers of 1 MiB, want 8", len(bufs))
	}
	for _, i := range []int{0, 2, 4, 6, 1, 3, 5, 7} {
		p.Put(bufs[i])
	}
	big := mustGet(t, p, 8*mib, "big")
	if st := p.Stats(); st.InUseBytes != 8*mib || big.Offset() != 0 {
		t.Fatalf("after the Puts: %+v at offset %d", st, big.Offset())
	}
	p.Put(big)
}

func TestLeasesBlockPut(t *testing.T) {
	p := newPool(t, Options{BudgetBytes: 4 * mib})
	b := mustGet(t, p, 8192, "nvme read")
	b.Lease()
	b.Lease()
	mustPanic(t, func() { p.Put(b) }, "2 leases outstanding", `"nvme read"`)
	b.Release()
	mustPanic(t, func() { p.Put(b) }, "1 leases outstanding")
	b.Release()
	mustPanic(t, b.Release, "without a Lease")
	p.Put(b) // after completion
	mustPanic(t, b.Lease, "already returned")
	mustPanic(t, func() { b.Bytes() }, "already returned")
	if st := p.Stats(); st.InUseBytes != 0 {
		t.Fatalf("in use after Put: %d", st.InUseBytes)
	}
}

func TestDoublePutPanics(t *testing.T) {
	p := newPool(t, Options{BudgetBytes: 4 * mib})
	b1 := mustGet(t, p, 4096, "x")
	p.Put(b1)
	mustPanic(t, func() { p.Put(b1) }, "already returned")
	b2 := mustGet(t, p, 4096, "x") // the same memory, a new handle
	if b2.Addr() != b1.Addr() {
		t.Fatal("expected the cached slot back")
	}
	mustPanic(t, func() { p.Put(b1) }, "already returned") // stale handle still caught
	p.Put(b2)
	other := newPool(t, Options{BudgetBytes: mib})
	b3 := mustGet(t, other, 4096, "x")
	mustPanic(t, func() { p.Put(b3) }, "another pool")
	other.Put(b3)
}

func TestStatsPerPurpose(t *testing.T) {
	p := newPool(t, Options{BudgetBytes: 8 * mib})
	a := mustGet(t, p, mib, "param staging")
	b := mustGet(t, p, 2*mib, "param staging")
	c := mustGet(t, p, 5000, "nvme read")
	p.Put(b)
	st := p.Stats()
	want := []PurposeStats{
		{Purpose: "nvme read", InUseBytes: 8192, PeakBytes: 8192, Count: 1, Gets: 1},
		{Purpose: "param staging", InUseBytes: mib, PeakBytes: 3 * mib, Count: 1, Gets: 2},
	}
	if fmt.Sprint(st.Purposes) != fmt.Sprint(want) {
		t.Fatalf("purposes\n got %+v\nwant %+v", st.Purposes, want)
	}
	if st.BudgetBytes != 8*mib || st.InUseBytes != mib+8192 || st.PeakBytes != 3*mib+8192 {
		t.Fatalf("totals %+v", st)
	}
	p.Put(a)
	p.Put(c)
}

// TestConcurrentGetPut: many goroutines Get, Lease, Release and Put buffers
// of mixed sizes; each checks its pattern survived (no two live buffers
// overlap) and every error is a budget error. Run under -race.
func TestConcurrentGetPut(t *testing.T) {
	p := newPool(t, Options{BudgetBytes: 16 * mib, ArenaSizeBytes: 4 * mib})
	const workers, rounds = 8, 300
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range rounds {
				size := int64(1 + rng.IntN(int(mib)))
				b, err := p.Get(size, fmt.Sprintf("worker %d", w%3))
				if err != nil {
					if !errors.Is(err, ErrBudget) {
						mu.Lock()
						failures = append(failures, err.Error())
						mu.Unlock()
					}
					continue
				}
				mem := b.Bytes()
				tag := byte(w*rounds + i)
				for j := 0; j < len(mem); j += 512 {
					mem[j] = tag
				}
				b.Lease()
				done := make(chan struct{})
				go func() { b.Release(); close(done) }() // completion elsewhere
				for j := 0; j < len(mem); j += 512 {
					if mem[j] != tag {
						mu.Lock()
						failures = append(failures, fmt.Sprintf("worker %d: byte %d overwritten", w, j))
						mu.Unlock()
						break
					}
				}
				<-done
				p.Put(b)
			}
		}()
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatal(strings.Join(failures, "\n"))
	}
	st := p.Stats()
	if st.InUseBytes != 0 || st.PeakBytes > st.BudgetBytes {
		t.Fatalf("after: %+v", st)
	}
	var gets int64
	for _, ps := range st.Purposes {
		gets += ps.Gets
		if ps.Count != 0 || ps.InUseBytes != 0 {
			t.Fatalf("purpose left in use: %+v", ps)
		}
	}
	if gets == 0 {
		t.Fatal("no Get succeeded")
	}
}

type recorder struct {
	mu                  sync.Mutex
	registered, dropped []string
	failAt              int // Register of this arena index fails; -1 never
}

func (r *recorder) Register(i int, mem []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i == r.failAt {
		return errors.New("cuMemHostRegister: out of memory")
	}
	r.registered = append(r.registered, fmt.Sprintf("%d:%d:%#x", i, len(mem), uintptr(unsafe.Pointer(&mem[0]))))
	return nil
}

func (r *recorder) Unregister(i int, mem []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropped = append(r.dropped, fmt.Sprintf("%d:%d:%#x", i, len(mem), uintptr(unsafe.Pointer(&mem[0]))))
	return nil
}

func TestRegistrarCalledForEachArena(t *testing.T) {
	p, err := New(Options{BudgetBytes: 10 * mib, ArenaSizeBytes: 4 * mib, Lock: LockNever})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i, mem := range p.Arenas() {
		want = append(want, fmt.Sprintf("%d:%d:%#x", i, len(mem), uintptr(unsafe.Pointer(&mem[0]))))
	}
	if len(want) != 3 || !strings.HasPrefix(want[2], fmt.Sprintf("2:%d:", 2*mib)) {
		t.Fatalf("arenas %v, want 4+4+2 MiB", want)
	}
	r1, r2 := &recorder{failAt: -1}, &recorder{failAt: -1}
	if err := p.AddRegistrar(r1); err != nil {
		t.Fatal(err)
	}
	if err := p.AddRegistrar(r2); err != nil {
		t.Fatal(err)
	}
	bad := &recorder{failAt: 1}
	if err := p.AddRegistrar(bad); err == nil || !strings.Contains(err.Error(), "register arena 1 (4.0 MiB): cuMemHostRegister") {
		t.Fatalf("failing registrar: %v", err)
	}
	if fmt.Sprint(bad.dropped) != fmt.Sprint(want[:1]) {
		t.Fatalf("failed registration not rolled back: %v", bad.dropped)
	}
	// A buffer may span arenas: the mapping is one, its arenas adjacent.
	for i := 1; i < len(p.Arenas()); i++ {
		prev, mem := p.Arenas()[i-1], p.Arenas()[i]
		if uintptr(unsafe.Pointer(&prev[0]))+uintptr(len(prev)) != uintptr(unsafe.Pointer(&mem[0])) {
			t.Fatalf("arena %d does not follow arena %d", i, i-1)
		}
	}
	small := mustGet(t, p, mib, "x")
	b := mustGet(t, p, 9*mib, "x")
	if b.Offset() != mib || len(b.Bytes()) != 9*mib {
		t.Fatalf("9 MiB buffer at %d, %d bytes; want the rest of the mapping", b.Offset(), len(b.Bytes()))
	}
	b.Bytes()[9*mib-1] = 1 // the last byte of the last arena
	p.Put(small)
	p.Put(b)
	if err := p.RemoveRegistrar(r2); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*recorder{r1, r2} {
		if fmt.Sprint(r.registered) != fmt.Sprint(want) || fmt.Sprint(r.dropped) != fmt.Sprint(want) {
			t.Fatalf("registered %v dropped %v, want %v", r.registered, r.dropped, want)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := p.RemoveRegistrar(r1); err != nil || len(r1.dropped) != len(want) {
		t.Fatalf("RemoveRegistrar after Close: %v, %d Unregister calls", err, len(r1.dropped))
	}
	mustPanic(t, func() { p.Get(1, "x") }, "Get after Close")
}

func TestCloseWithBuffersOut(t *testing.T) {
	p, err := New(Options{BudgetBytes: 4 * mib, Lock: LockNever})
	if err != nil {
		t.Fatal(err)
	}
	leased := mustGet(t, p, 4096, "nvme write")
	mustGet(t, p, mib, "param staging")
	leased.Lease()
	mustPanic(t, func() { p.Close() }, `still leased: "nvme write" 4.0 KiB (1 leases)`)
	leased.Release()
	err = p.Close()
	if err == nil || !strings.Contains(err.Error(), "2 buffers still held (unmapped anyway): param staging 1.0 MiB (1 buffer), nvme write 4.0 KiB (1 buffer)") {
		t.Fatalf("close with held buffers: %v", err)
	}
	mustPanic(t, func() { leased.Bytes() }, "after the pool was closed")
	p.Put(leased) // allowed: nothing left to return it to
}

func TestCheckPlan(t *testing.T) {
	o := Options{BudgetBytes: 16 * mib, ArenaSizeBytes: 4 * mib}
	reqs := []Requirement{
		{"optimizer states", 2 * mib, 4},
		{"param staging", 2*mib - 100, 3},
	}
	pl, err := Check(o, reqs)
	if err != nil || !pl.Fits || pl.NeedBytes != 14*mib {
		t.Fatalf("plan %v, err %v", pl, err)
	}
	if got, want := pl.String(), "needs 14.0 MiB of budget 16.0 MiB: optimizer states 4 × 2.0 MiB = 8.0 MiB, param staging 3 × 2.0 MiB = 6.0 MiB"; got != want {
		t.Fatalf("plan\n got %s\nwant %s", got, want)
	}
	// A fresh pool meets the plan.
	p := newPool(t, o)
	for _, r := range reqs {
		for range r.Count {
			mustGet(t, p, r.SizeBytes, r.Purpose)
		}
	}
	for b := range p.held {
		p.Put(b)
	}

	_, err = Check(o, append(reqs, Requirement{"nvme read", mib, 3}))
	if !errors.Is(err, ErrBudget) || !strings.HasSuffix(err.Error(), "nvme read 3 × 1.0 MiB = 3.0 MiB; short by 1.0 MiB") {
		t.Fatalf("over budget: %v", err)
	}
	// Buffers span arenas: two 4 MiB arenas hold three 2.5 MiB buffers,
	// and one larger than an arena.
	o = Options{BudgetBytes: 8 * mib, ArenaSizeBytes: 4 * mib}
	reqs = []Requirement{{"layer", 5 * mib / 2, 3}}
	if _, err = Check(o, reqs); err != nil {
		t.Fatalf("packing: %v", err)
	}
	p = newPool(t, o)
	for range 3 {
		mustGet(t, p, 5*mib/2, "layer")
	}
	for b := range p.held {
		p.Put(b)
	}
	mustGet(t, p, 5*mib, "one larger than an arena")
	for b := range p.held {
		p.Put(b)
	}
}
