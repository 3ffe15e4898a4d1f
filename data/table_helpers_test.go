package data

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/strata-ai/strata/internal/tabletest"
)

// The tests' tables, written by the npm writer (internal/tabletest).
type (
	tableFixture = tabletest.Fixture
	tableField   = tabletest.Field
	tableRowJS   = map[string]any
)

// writeTables writes files under dir with the npm writer.
func writeTables(t *testing.T, dir string, files ...tableFixture) {
	t.Helper()
	tabletest.Write(t, dir, files...)
}

// jsonlOf is rows as JSONL lines, leaving out those skip says.
func jsonlOf(t *testing.T, rows []tableRowJS, skip func(tableRowJS) bool) string {
	t.Helper()
	var b []byte
	for _, r := range rows {
		if skip != nil && skip(r) {
			continue
		}
		line, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		b = append(append(b, line...), '\n')
	}
	return string(b)
}

// specialBytes is the byte-level vocabulary with a BOS (256, added with
// the special tokens) and an EOS (257), so that a row's special tokens
// are seen in its ids.
type specialBytes struct{ Bytes }

func (specialBytes) Encode(text string, addSpecial bool) []int32 {
	ids := Bytes{}.Encode(text, false)
	if addSpecial {
		ids = append([]int32{256}, ids...)
	}
	return ids
}
func (specialBytes) VocabSize() int     { return 258 }
func (specialBytes) BOS() (int32, bool) { return 256, true }
func (specialBytes) EOS() (int32, bool) { return 257, true }

// tokens is a token file's content: every example's ids and loss bits.
type tokens struct {
	spans [][2]int64
	ids   []int32
	train []bool
}

func readTokens(t *testing.T, s *Source) tokens {
	t.Helper()
	f := s.File
	var tk tokens
	for i := range f.Examples() {
		a, b, err := f.Span(i)
		if err != nil {
			t.Fatal(err)
		}
		tk.spans = append(tk.spans, [2]int64{a, b})
	}
	tk.ids, tk.train = make([]int32, f.Tokens()), make([]bool, f.Tokens())
	if err := f.Read(0, tk.ids, tk.train); err != nil {
		t.Fatal(err)
	}
	return tk
}

func (a tokens) equal(b tokens) bool {
	return slices.Equal(a.spans, b.spans) && slices.Equal(a.ids, b.ids) && slices.Equal(a.train, b.train)
}

// exampleText is example i of tk under the byte-level tokenizer, the
// trained tokens in [brackets], BOS as <B> and EOS as <E>.
func (tk tokens) exampleText(i int) string {
	a, b := tk.spans[i][0], tk.spans[i][1]
	ex := example{ids: tk.ids[a:b], train: tk.train[a:b]}
	var out []byte
	in := false
	for j, id := range ex.ids {
		if ex.train[j] != in {
			out = append(out, map[bool]string{true: "[", false: "]"}[ex.train[j]]...)
			in = ex.train[j]
		}
		switch id {
		case 256:
			out = append(out, "<B>"...)
		case 257:
			out = append(out, "<E>"...)
		default:
			out = append(out, byte(id))
		}
	}
	if in {
		out = append(out, ']')
	}
	return string(out)
}
