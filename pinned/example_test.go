package pinned_test

import (
	"errors"
	"fmt"

	"github.com/strata-ai/strata/pinned"
)

// Example maps a 1 MiB pool, takes a buffer from it and gives it back.
// Buffers are page-aligned, as O_DIRECT and GPU copies want them. With the
// default lock mode the pool is locked in RAM where mlock is allowed and
// stays unlocked where it is refused; nothing printed here depends on it.
func Example() {
	pool, err := pinned.New(pinned.Options{BudgetBytes: 1 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	buf, err := pool.Get(10_000, "staging")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(buf.Len(), buf.PaddedLen(), buf.Addr()%4096, len(buf.Bytes()))
	st := pool.Stats()
	fmt.Println(st.BudgetBytes, st.InUseBytes)

	pool.Put(buf)
	fmt.Println(pool.Stats().InUseBytes, pool.Stats().PeakBytes)
	// Output:
	// 10000 12288 0 10000
	// 1048576 12288
	// 0 12288
}

// ExamplePool_Get shows the error of a request larger than the budget: it
// matches ErrBudget and says what uses the pool.
func ExamplePool_Get() {
	pool, err := pinned.New(pinned.Options{BudgetBytes: 64 << 10})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	_, err = pool.Get(1<<20, "too big")
	fmt.Println(errors.Is(err, pinned.ErrBudget))
	// Output: true
}
