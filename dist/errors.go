package dist

import "errors"

// ErrNoMPI says that no usable MPI library was found.
var ErrNoMPI = errors.New("dist: no MPI")
