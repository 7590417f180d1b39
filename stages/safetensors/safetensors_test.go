package safetensors

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const fixture = "../../testdata/lfm2-audio-tiny/model.safetensors"

func TestOpenFixture(t *testing.T) {
	f, err := Open(fixture)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	emb, err := f.Lookup("lfm.embed_tokens.weight")
	if err != nil {
		t.Fatal(err)
	}
	if emb.DType != BF16 || len(emb.Shape) != 2 || emb.Shape[0] != 992 || emb.Shape[1] != 24 {
		t.Fatalf("embed_tokens: %s %v, want BF16 [992 24]", emb.DType, emb.Shape)
	}
	off, err := f.Lookup("codebook_offsets")
	if err != nil {
		t.Fatal(err)
	}
	got, err := off.Int64s()
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if v != int64(i*2049) {
			t.Fatalf("codebook_offsets = %v", got)
		}
	}
	if _, err := f.Lookup("no.such.tensor"); err == nil || !strings.Contains(err.Error(), "no.such.tensor") {
		t.Errorf("missing tensor error = %v", err)
	}
}

func TestRoundTrip(t *testing.T) {
	var b bytes.Buffer
	in := []*Tensor{NewF32("b", []float32{1, -2, 3.5}, 3), NewI64("a", []int64{7, -9}, 1, 2)}
	if err := Write(&b, in, map[string]string{"k": "v"}); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(b.Bytes(), "mem")
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["k"] != "v" {
		t.Errorf("metadata = %v", f.Metadata)
	}
	vals, _ := f.Tensor("b").Float32s()
	if len(vals) != 3 || vals[1] != -2 || vals[2] != 3.5 {
		t.Errorf("b = %v", vals)
	}
	ints, _ := f.Tensor("a").Int64s()
	if len(ints) != 2 || ints[1] != -9 {
		t.Errorf("a = %v", ints)
	}
	if got := f.Names(); len(got) != 2 || got[0] != "a" {
		t.Errorf("names = %v", got)
	}
}

func header(js string, data int) []byte {
	var b bytes.Buffer
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(js)))
	b.Write(n[:])
	b.WriteString(js)
	b.Write(make([]byte, data))
	return b.Bytes()
}

func TestBadHeaders(t *testing.T) {
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"short length", []byte{1, 2, 3}, "truncated"},
		{"length past end", header(`{}`, 0)[:9], "truncated"},
		{"not json", header(`[1,2]`, 0), "not a JSON object"},
		{"broken json", header(`{"a":`, 0), "header JSON"},
		{"unknown dtype", header(`{"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}`, 1), `unknown dtype "Q4"`},
		{"span mismatch", header(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 8), `tensor "w": shape [2] of F32 needs 8 bytes`},
		{"out of range", header(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 4), `truncated: file has 66 bytes, header needs 70`},
		{"far out of range", header(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,9223372036854775807]}}`, 4), `tensor "w": data_offsets [0, 9223372036854775807] outside`},
		{"reversed span", header(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}`, 8), `tensor "w": data_offsets [8, 0] are not a span`},
		{"negative", header(`{"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, 8), `bad shape`},
		{"overlap", header(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), `overlap`},
		{"extra field", header(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}`, 4), `unknown field`},
		{"bad metadata", header(`{"__metadata__":{"a":1}}`, 0), `__metadata__`},
		{"offsets arity", header(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}}`, 4), `2 numbers`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(tt.data, "x.safetensors")
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "x.safetensors") {
				t.Errorf("err = %v, want one naming the file and containing %q", err, tt.want)
			}
		})
	}
}

// TestTruncatedFile: a file cut short anywhere in its data says so, with
// the sizes, and the same error every time (not the first tensor that a map
// iteration happens to meet).
func TestTruncatedFile(t *testing.T) {
	data, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	hl := int(binary.LittleEndian.Uint64(data[:8]))
	for _, n := range []int{8 + hl, 8 + hl + 1, len(data) / 2, len(data) - 1} {
		p := filepath.Join(t.TempDir(), "cut.safetensors")
		if err := os.WriteFile(p, data[:n], 0o644); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("%s: truncated: file has %d bytes, header needs %d", p, n, len(data))
		for range 5 {
			_, err = Open(p)
			if err == nil || err.Error() != want {
				t.Fatalf("cut at %d: err = %v, want %q", n, err, want)
			}
			_, err = Parse(data[:n], p)
			if err == nil || err.Error() != want {
				t.Fatalf("cut at %d: Parse: err = %v, want %q", n, err, want)
			}
		}
	}
}

func TestUnsupportedDTypeNamed(t *testing.T) {
	f, err := Parse(header(`{"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}}`, 2), "fp8")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Tensor("w").Float32s(); err == nil || !strings.Contains(err.Error(), "F8_E4M3") {
		t.Errorf("err = %v, want one naming F8_E4M3", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(header(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 8))
	f.Add(header(`{"__metadata__":{"a":"b"},"a":{"dtype":"BF16","shape":[1,3],"data_offsets":[0,6]}}`, 6))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data, "fuzz")
		if err != nil {
			return
		}
		for _, n := range file.Names() {
			tt := file.Tensor(n)
			if len(tt.Data) > len(data) {
				t.Fatalf("tensor %q spans %d bytes of a %d-byte file", n, len(tt.Data), len(data))
			}
			tt.Float32s()
			tt.Int64s()
		}
	})
}
