package cuda

import (
	"fmt"
	"sync"
	"unsafe"
)

// HostRegistrar page-locks host memory with cuMemHostRegister so that
// copies from and to it are truly asynchronous. It satisfies the
// registration hook of package pinned (pinned.Registrar): one registrar may
// serve several pools (registrations are keyed by address).
type HostRegistrar struct {
	b   *Backend
	mu  sync.Mutex
	reg map[unsafe.Pointer]int // address -> bytes
}

// HostRegistrar returns a registrar for the backend's GPUs.
func (b *Backend) HostRegistrar() *HostRegistrar {
	return &HostRegistrar{b: b, reg: map[unsafe.Pointer]int{}}
}

// Register registers mem (portable: usable by every context).
func (r *HostRegistrar) Register(arenaIndex int, mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	g := r.b.l.gpus[0]
	drv := r.b.l.drv
	p := unsafe.Pointer(&mem[0])
	err := g.do(func() error {
		return drv.check(drv.cuMemHostRegister(p, uint64(len(mem)), cuMemHostRegisterPortable), "cuMemHostRegister %d bytes", len(mem))
	})
	if err != nil {
		return fmt.Errorf("gpu/cuda: register arena %d: %w", arenaIndex, err)
	}
	r.mu.Lock()
	r.reg[p] = len(mem)
	r.mu.Unlock()
	// The devices' link counters count copies of it as page-locked. An
	// overlap would be a second registration of the same memory, which
	// cuMemHostRegister refuses before this.
	_ = r.b.hosts.Register(arenaIndex, mem)
	return nil
}

// Unregister releases the registration of mem made by Register.
func (r *HostRegistrar) Unregister(arenaIndex int, mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	p := unsafe.Pointer(&mem[0])
	r.mu.Lock()
	_, ok := r.reg[p]
	delete(r.reg, p)
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("gpu/cuda: unregister arena %d: not registered", arenaIndex)
	}
	_ = r.b.hosts.Unregister(arenaIndex, mem)
	g := r.b.l.gpus[0]
	drv := r.b.l.drv
	if err := g.do(func() error { return drv.check(drv.cuMemHostUnregister(p), "cuMemHostUnregister") }); err != nil {
		return fmt.Errorf("gpu/cuda: unregister arena %d: %w", arenaIndex, err)
	}
	return nil
}
