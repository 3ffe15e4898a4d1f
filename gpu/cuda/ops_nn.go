package cuda

import (
	"fmt"
	"math"
)

// rowThreads is NT of kernels.cu: the block size of row-wise kernels.
const rowThreads = 256

// LayerNormForward: one block per row; mean and variance summed in double
// over a fixed tree; rstd = 1/sqrt(var+eps); y in fp32 from the stored
// mean and rstd.
func (o *kernels) LayerNormForward(s *Stream, x, gamma, beta, y, mean, rstd *Buffer, rows, cols int, eps float32) {
	s.launch("layernorm_fwd", uint32(rows), rowThreads, x.p(), dt(x), gamma.p(), dt(gamma), beta.p(), dt(beta),
		y.p(), dt(y), mean.p(), rstd.p(), int64(cols), eps)
}

// LayerNormBackward accumulates dx (one block per row, double sums) and
// dgamma, dbeta (one thread per column, fp32 in row order).
func (o *kernels) LayerNormBackward(s *Stream, dy, x, gamma, mean, rstd, dx, dgamma, dbeta *Buffer, rows, cols int) {
	s.launch("layernorm_bwd_dx", uint32(rows), rowThreads, dy.p(), dt(dy), x.p(), dt(x), gamma.p(), dt(gamma),
		mean.p(), rstd.p(), dx.p(), dt(dx), int64(cols))
	s.launchN("layernorm_bwd_params", int64(cols), dy.p(), dt(dy), x.p(), dt(x), mean.p(), rstd.p(),
		dgamma.p(), dt(dgamma), dbeta.p(), dt(dbeta), int64(rows), int64(cols))
}

func checkGrid(op string, blocks int) {
	if blocks > math.MaxInt32 {
		panic(fmt.Sprintf("gpu/cuda: %s: %d blocks", op, blocks))
	}
}
