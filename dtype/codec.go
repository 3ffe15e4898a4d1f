package dtype

import (
	"fmt"

	"github.com/strata-ai/strata/internal/absmax8"
	"github.com/strata-ai/strata/internal/nf4"
)

// Codec is a frozen base's block format (strata.lora.base_dtype): how the
// host codes a weight into fewer bits for the tiers and how a device
// decodes it (gpu.Ops.Dequantize). Every format is laid out the same way:
// an fp32 scale per BlockSize values, then the codes.
//
// Codecs is the one table of these formats: the backends, the tier store,
// the engine and the estimate look a format up there, and a format missing
// from it is an error, never another format's branch.
type Codec struct {
	// DType is the format's element type (NF4, INT8).
	DType DType
	// Name is strata.lora.base_dtype's name of the format, which is also
	// DType's String and the CUDA kernel's suffix (dequant_<Name>).
	Name string
	// BlockSize is the number of values that share one fp32 scale.
	BlockSize int
	// Bytes is the size of n values coded.
	Bytes func(n int) int64
	// Quantize codes src into dst (Bytes(len(src)) bytes).
	Quantize func(dst []byte, src []float32)
	// Dequantize decodes src (Bytes(len(dst)) bytes) into dst.
	Dequantize func(dst []float32, src []byte)
	// DequantizeBlocks decodes blocks [lo, hi) of n values coded in src
	// into dst (the values lo·BlockSize up to min(hi·BlockSize, n)), as
	// Dequantize does: a device's reference, one range of blocks at a time.
	DequantizeBlocks func(dst []float32, src []byte, n, lo, hi int)
}

// Blocks is the number of blocks (scales) of n values.
func (c *Codec) Blocks(n int) int { return (n + c.BlockSize - 1) / c.BlockSize }

// Codecs are the frozen base's coded formats, in DType order.
var Codecs = []Codec{
	{DType: NF4, Name: "nf4", BlockSize: nf4.BlockSize, Bytes: nf4.Bytes,
		Quantize: nf4.Quantize, Dequantize: nf4.Dequantize, DequantizeBlocks: nf4.DequantizeBlocks},
	{DType: INT8, Name: "int8", BlockSize: absmax8.BlockSize, Bytes: absmax8.Bytes,
		Quantize: absmax8.Quantize, Dequantize: absmax8.Dequantize, DequantizeBlocks: absmax8.DequantizeBlocks},
}

// CodecOf returns d's codec, or an error naming the formats there are when
// d is not one (a plain dtype, or a format no codec implements).
func CodecOf(d DType) (*Codec, error) {
	if c := codecOf(d); c != nil {
		return c, nil
	}
	return nil, fmt.Errorf("dtype: %s is not a coded base format (want %s)", d, codecNames())
}

// MustCodec is CodecOf for a format the caller has already checked: it
// panics where CodecOf fails.
func MustCodec(d DType) *Codec {
	c, err := CodecOf(d)
	if err != nil {
		panic(err)
	}
	return c
}

// CodecNamed returns the codec of strata.lora.base_dtype's name ("nf4",
// "int8"), or nil and false for a name of no codec ("bf16": not coded).
func CodecNamed(name string) (*Codec, bool) {
	for i := range Codecs {
		if Codecs[i].Name == name {
			return &Codecs[i], true
		}
	}
	return nil, false
}

// Coded says whether d is a codec's format.
func (d DType) Coded() bool { return codecOf(d) != nil }

func codecOf(d DType) *Codec {
	for i := range Codecs {
		if Codecs[i].DType == d {
			return &Codecs[i]
		}
	}
	return nil
}

func codecNames() string {
	s := ""
	for i, c := range Codecs {
		if i > 0 {
			s += " or "
		}
		s += c.Name
	}
	return s
}
