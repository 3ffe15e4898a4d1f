package cmd

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/strata-ai/strata/internal/tabletest"
	"github.com/strata-ai/strata/nvme/nvmetest"
)

// chatSchema is the messages column as Hugging Face datasets write it.
var chatSchema = []tabletest.Field{{Name: "messages", Type: "list<struct<role:string,content:string>>"}}

// chatRows is n generated conversations (from seed) as rows of a
// messages column, some with a system message; every 9th row's messages
// are null (a row a dataset left empty: skipped, as JSONL has no such line).
func chatRows(n int, seed uint64) []map[string]any {
	rng := rand.New(rand.NewPCG(seed, 11))
	things := []string{"grass", "the sky", "snow", "coal", "a lemon", "blood"}
	colours := []string{"green", "blue", "white", "black", "yellow", "red"}
	rows := make([]map[string]any, n)
	for i := range rows {
		var q, a string
		if rng.IntN(2) == 0 {
			x, y := rng.IntN(10), rng.IntN(10)
			q, a = fmt.Sprintf("What is %d plus %d?", x, y), fmt.Sprintf("%d plus %d is %d.", x, y, x+y)
		} else {
			k := rng.IntN(len(things))
			q, a = fmt.Sprintf("What colour is %s?", things[k]), fmt.Sprintf("It is %s.", colours[k])
		}
		msgs := []any{map[string]any{"role": "user", "content": q}, map[string]any{"role": "assistant", "content": a}}
		if i%4 == 0 {
			msgs = append([]any{map[string]any{"role": "system", "content": "Answer in one sentence."}}, msgs...)
		}
		rows[i] = map[string]any{"messages": msgs}
		if i%9 == 8 {
			rows[i] = map[string]any{"messages": nil}
		}
	}
	return rows
}

// rowsJSONL is rows as JSONL lines, leaving out the null ones.
func rowsJSONL(t *testing.T, rows []map[string]any) string {
	t.Helper()
	var b strings.Builder
	for _, r := range rows {
		if r["messages"] == nil {
			continue
		}
		line, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.String()
}

// TestTrainParquetAsJSONL: the same conversations as Parquet shards (two
// files, zstd and snappy, dictionary and plain, several row groups), as a
// save_to_disk directory of Arrow stream files and as JSONL train to the
// same losses, bit for bit, at stages 0-3 (the tiers included); a run on
// the shards resumed from its checkpoint ends with the uninterrupted JSONL
// run's losses.
func TestTrainParquetAsJSONL(t *testing.T) {
	rows := chatRows(180, 1)
	dir := t.TempDir()
	no := false
	tabletest.Write(t, dir,
		tabletest.Fixture{Name: "shards/train-00000-of-00002.parquet", Format: "parquet", Compression: "zstd", RowGroupRows: 25, Schema: chatSchema, Rows: rows[:90]},
		tabletest.Fixture{Name: "shards/train-00001-of-00002.parquet", Format: "parquet", Compression: "snappy", Dictionary: &no, RowGroupRows: 40, Schema: chatSchema, Rows: rows[90:]},
		tabletest.Fixture{Name: "saved/data-00000-of-00002.arrow", Format: "arrow-stream", BatchRows: 30, Schema: chatSchema, Rows: rows[:100]},
		tabletest.Fixture{Name: "saved/data-00001-of-00002.arrow", Format: "arrow-stream", BatchRows: 30, Schema: chatSchema, Rows: rows[100:]},
	)
	saved := filepath.Join(dir, "saved")
	for name, content := range map[string]string{
		"state.json":        `{"_data_files": [{"filename": "data-00000-of-00002.arrow"}, {"filename": "data-00001-of-00002.arrow"}], "_fingerprint": "f", "_format_columns": null, "_format_kwargs": {}, "_format_type": null, "_output_all_columns": false, "_split": "train"}`,
		"dataset_info.json": `{"features": {"messages": [{"role": {"dtype": "string", "_type": "Value"}, "content": {"dtype": "string", "_type": "Value"}}]}}`,
	} {
		if err := os.WriteFile(filepath.Join(saved, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	jsonl := writeFile(t, "chat.jsonl", rowsJSONL(t, rows))
	shards := filepath.Join(dir, "shards")
	nv := nvmetest.Dir(t)
	const steps = 4
	cases := []struct {
		stage      int
		param, opt string
	}{{0, "none", "none"}, {1, "none", "none"}, {2, "none", "cpu"}, {3, "cpu", "cpu"}, {3, "nvme", "nvme"}}
	for _, c := range cases {
		name := fmt.Sprintf("stage%d/param-%s/opt-%s", c.stage, c.param, c.opt)
		dirNV := ""
		if c.param == "nvme" || c.opt == "nvme" {
			dirNV = nv
		}
		cfg := jobConfig(t, c.stage, c.param, c.opt, dirNV)
		train := func(data string, args ...string) map[int64]float64 {
			t.Helper()
			out := t.TempDir()
			_, stderr, err := runApp(t, append([]string{"train", "--config", cfg, "--data", data, "--steps", fmt.Sprint(steps), "--out", out, "--no-progress"}, args...)...)
			if err != nil {
				t.Fatalf("%s: --data %s: %v\n%s", name, data, err, stderr)
			}
			return stepLosses(t, out)
		}
		want := train(jsonl)
		sameLosses(t, name+": Parquet shards", train(shards), want, 1, steps)
		if c.stage == 3 && c.param == "cpu" {
			sameLosses(t, name+": save_to_disk", train(saved), want, 1, steps)
			sameLosses(t, name+": a glob of shards", train(filepath.Join(shards, "train-*.parquet")), want, 1, steps)
		}
	}

	// Resumed: 2 steps on the shards, then --resume to 4.
	cfg := jobConfig(t, 3, "cpu", "cpu", "")
	run := t.TempDir()
	if _, stderr, err := runApp(t, "train", "--config", cfg, "--data", shards, "--steps", "2", "--out", run, "--no-progress"); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if _, stderr, err := runApp(t, "train", "--resume", run, "--data", shards, "--steps", fmt.Sprint(steps), "--out", run, "--no-progress"); err != nil {
		t.Fatalf("resume: %v\n%s", err, stderr)
	}
	one := t.TempDir()
	if _, stderr, err := runApp(t, "train", "--config", cfg, "--data", jsonl, "--steps", fmt.Sprint(steps), "--out", one, "--no-progress"); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	sameLosses(t, "Parquet resumed", stepLosses(t, run), stepLosses(t, one), 1, steps)

	// strata eval reads the shards as the JSONL: the same loss and tokens.
	evalOf := func(data string) string {
		t.Helper()
		stdout, stderr, err := runApp(t, "eval", "--model", run, "--data", data, "--json")
		if err != nil {
			t.Fatalf("eval --data %s: %v\n%s", data, err, stderr)
		}
		return stdout
	}
	if got, want := evalOf(shards), evalOf(jsonl); got != want {
		t.Errorf("eval on the Parquet shards: %s, on the JSONL: %s", got, want)
	}

	// A binary file is refused by eval as by train, never read as text.
	bin := writeFile(t, "weights.bin", "\x00\x01\x02 not text"+strings.Repeat("\x00", 100))
	for _, cmd := range [][]string{{"eval", "--model", run, "--data", bin}, {"train", "--config", cfg, "--data", bin, "--steps", "1", "--no-progress"}} {
		if _, stderr, err := runApp(t, cmd...); err == nil || !strings.Contains(err.Error(), "binary") {
			t.Errorf("%s --data weights.bin: err %v, want it refused as a binary file\n%s", cmd[0], err, stderr)
		}
	}

	// A shard rewritten under the run: its resume is refused naming it.
	tabletest.Write(t, dir, tabletest.Fixture{Name: "shards/train-00001-of-00002.parquet", Format: "parquet", Compression: "zstd", Schema: chatSchema, Rows: rows[91:]})
	_, stderr, err := runApp(t, "train", "--resume", run, "--data", shards, "--steps", "6", "--out", run, "--no-progress")
	if err == nil || !strings.Contains(err.Error()+stderr, "train-00001-of-00002.parquet") {
		t.Errorf("resume on a rewritten shard: err %v, want a refusal naming train-00001-of-00002.parquet\n%s", err, stderr)
	}
}

// TestDataColumnsResume: a run on a column named "dialog" with
// --data-columns messages=dialog records the mapping (strata.data_columns):
// resumed without the flag it reads the same examples and ends with the
// losses of the uninterrupted run on the same conversations as JSONL.
func TestDataColumnsResume(t *testing.T) {
	rows := chatRows(120, 3)
	dialog := make([]map[string]any, len(rows))
	for i, r := range rows {
		dialog[i] = map[string]any{"dialog": r["messages"], "id": int64(i)}
	}
	dir := t.TempDir()
	tabletest.Write(t, dir, tabletest.Fixture{Name: "d.parquet", Format: "parquet", Compression: "zstd", RowGroupRows: 32,
		Schema: []tabletest.Field{{Name: "id", Type: "int64"}, {Name: "dialog", Type: "list<struct<role:string,content:string>>"}}, Rows: dialog})
	pq := filepath.Join(dir, "d.parquet")
	jsonl := writeFile(t, "chat.jsonl", rowsJSONL(t, rows))
	cfg := jobConfig(t, 3, "cpu", "cpu", "")
	run := t.TempDir()
	_, stderr, err := runApp(t, "train", "--config", cfg, "--data", pq, "--steps", "2", "--out", run, "--no-progress")
	if err == nil || !strings.Contains(err.Error(), "dialog") {
		t.Errorf("without --data-columns: err %v, want a refusal naming the columns found (dialog)\n%s", err, stderr)
	}
	if _, stderr, err := runApp(t, "train", "--config", cfg, "--data", pq, "--data-columns", "messages=dialog", "--steps", "2", "--out", run, "--no-progress"); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if _, stderr, err := runApp(t, "train", "--resume", run, "--steps", "4", "--out", run, "--no-progress"); err != nil {
		t.Fatalf("resume without --data-columns: %v\n%s", err, stderr)
	}
	one := t.TempDir()
	if _, stderr, err := runApp(t, "train", "--config", cfg, "--data", jsonl, "--steps", "4", "--out", one, "--no-progress"); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	sameLosses(t, "--data-columns resumed", stepLosses(t, run), stepLosses(t, one), 1, 4)
}
