package family_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/internal/testmodel"
	"github.com/omni-pipe/omni-pipe/stages/family"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
)

func writeConfig(t *testing.T, cfg string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestLoadUnknown: a config.json that no registered family claims fails
// with an error that names what it says and lists the registered names.
func TestLoadUnknown(t *testing.T) {
	for _, tc := range []struct{ name, cfg, says string }{
		{"architecture", `{"architectures": ["Qwen2AudioForConditionalGeneration"], "model_type": "qwen2_audio"}`, "Qwen2AudioForConditionalGeneration"},
		{"none", `{}`, `architectures []`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := cpu.New(0)
			defer dev.Close()
			_, err := family.Load(dev, writeConfig(t, tc.cfg), family.Options{})
			if !errors.Is(err, family.ErrUnknown) {
				t.Fatalf("err %v, want ErrUnknown", err)
			}
			for _, want := range []string{tc.says, "registered: ", "Lfm2AudioForConditionalGeneration"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("err %q does not say %q", err, want)
				}
			}
		})
	}
}

// TestLoadErrors: an unreadable or malformed config.json is an error, not
// a family.
func TestLoadErrors(t *testing.T) {
	dev := cpu.New(0)
	defer dev.Close()
	if _, err := family.Load(dev, t.TempDir(), family.Options{}); err == nil || !strings.Contains(err.Error(), "config.json") {
		t.Errorf("no config.json: err %v", err)
	}
	if _, err := family.Load(dev, writeConfig(t, `{"architectures": "x"`), family.Options{}); err == nil || errors.Is(err, family.ErrUnknown) {
		t.Errorf("malformed config.json: err %v", err)
	}
}

// TestLoadLFM2Audio: the LFM2-Audio folder and the LFM2.5-Audio one (the
// same architecture, another codec) load through the registry as
// lfm2audio's model with the folder's codec.
func TestLoadLFM2Audio(t *testing.T) {
	const tiny = "../../testdata/lfm2-audio-tiny"
	lfm25 := testmodel.LFM25Tiny(t, true)
	for _, tc := range []struct{ dir, opt, family, codec string }{
		{tiny, "", lfm2audio.FamilyLFM2Audio, lfm2audio.CodecMimi},
		{lfm25, "", lfm2audio.FamilyLFM25Audio, lfm2audio.CodecDetokenizer},
		{lfm25, lfm2audio.CodecMimi, lfm2audio.FamilyLFM25Audio, lfm2audio.CodecMimi},
	} {
		dev := cpu.New(0)
		m, err := family.Load(dev, tc.dir, family.Options{Codec: tc.opt})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := m.(*lfm2audio.Model); !ok {
			t.Errorf("%s: loaded a %T", tc.dir, m)
		}
		if got := m.Info().Family; got != tc.family {
			t.Errorf("%s: family %q, want %q", tc.dir, got, tc.family)
		}
		if got := m.AudioCodec().Kind(); got != tc.codec {
			t.Errorf("%s: codec %q, want %q", tc.dir, got, tc.codec)
		}
		m.Close()
		dev.Close()
	}
}

// TestRegisterTwice: a second registration of a name panics.
func TestRegisterTwice(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	family.Register("Lfm2AudioForConditionalGeneration", func(dev gpu.Device, dir string, opts family.Options) (family.Model, error) { return nil, nil })
}
