package demomodel

import (
	"bytes"
	"io/fs"
	"os"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
)

// The embedded files are byte-for-byte the test fixture's.
func TestEmbeddedMatchesFixture(t *testing.T) {
	for _, name := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "mimi.safetensors", "mimi_config.json"} {
		got, err := fs.ReadFile(FS(), name)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile("../../testdata/lfm2-audio-tiny/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: embedded copy (%d bytes) differs from testdata (%d bytes)", name, len(got), len(want))
		}
	}
}

func TestLoad(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	m, err := Load(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Name != Name {
		t.Errorf("name %q, want %q", m.Name, Name)
	}
	if m.Codec == nil || m.Backbone == nil || m.Params == 0 {
		t.Errorf("model incompletely loaded: codec %v, backbone %v, %d parameters", m.Codec != nil, m.Backbone != nil, m.Params)
	}
	t.Logf("%d parameters bound", m.Params)
}
