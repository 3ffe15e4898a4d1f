package cuda

import (
	"fmt"
	"sync"
	"unsafe"
)

// HostRegistrar page-locks host memory with cuMemHostRegister so that
// copies from and to it are truly asynchronous. It satisfies the
// registration hook of package pinned (Register(arenaIndex, mem)).
type HostRegistrar struct {
	b   *Backend
	mu  sync.Mutex
	reg map[int]unsafe.Pointer
}

// HostRegistrar returns a registrar for the backend's GPUs.
func (b *Backend) HostRegistrar() *HostRegistrar {
	return &HostRegistrar{b: b, reg: map[int]unsafe.Pointer{}}
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
	r.reg[arenaIndex] = p
	r.mu.Unlock()
	return nil
}

// Unregister releases every registration made by r.
func (r *HostRegistrar) Unregister() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.b.l.gpus[0]
	drv := r.b.l.drv
	var first error
	for i, p := range r.reg {
		if err := g.do(func() error { return drv.check(drv.cuMemHostUnregister(p), "cuMemHostUnregister") }); err != nil && first == nil {
			first = fmt.Errorf("gpu/cuda: unregister arena %d: %w", i, err)
		}
		delete(r.reg, i)
	}
	return first
}
