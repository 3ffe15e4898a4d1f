package safetensors_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/strata-ai/strata/dtype"
	"github.com/strata-ai/strata/safetensors"
)

// Example writes a file of two float32 tensors, opens it, lists its header
// and reads one tensor back.
func Example() {
	dir, err := os.MkdirTemp("", "safetensors-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "model.safetensors")

	bias := []float32{0.5, -1, 2}
	err = safetensors.WriteFile(path, []safetensors.Tensor{
		{Name: "w", DType: dtype.F32, Shape: []int{2, 2}, Data: dtype.Bytes([]float32{1, 2, 3, 4})},
		{Name: "b", DType: dtype.F32, Shape: []int{3}, Data: dtype.Bytes(bias)},
	}, map[string]string{"format": "pt"})
	if err != nil {
		fmt.Println(err)
		return
	}

	f, err := safetensors.Open(path)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer f.Close()
	for _, t := range f.Header.Tensors {
		fmt.Println(t.Name, t.DType, t.Shape, t.SizeBytes())
	}
	b, _ := f.Header.Tensor("b")
	data := make([]byte, b.SizeBytes())
	if err := f.ReadTensor(b, data); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(dtype.Float32s(data), f.Header.Metadata["format"])
	// Output:
	// w F32 [2 2] 16
	// b F32 [3] 12
	// [0.5 -1 2] pt
}
