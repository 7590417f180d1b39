package parity

import (
	"bytes"
	"context"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/internal/refcase"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
)

// TestFixtureCases runs `omni-pipe parity` on every fixture case: each
// stage must be within its stated tolerance.
func TestFixtureCases(t *testing.T) {
	dev := cpu.New(0)
	defer dev.Close()
	m, err := lfm2audio.Load(dev, "../../testdata/lfm2-audio-tiny")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, name := range []string{"case1_question_16k", "case2_tone_noise_24k", "case3_text_only", "case4_two_turn"} {
		t.Run(name, func(t *testing.T) {
			ref, err := refcase.Open("../../testdata/lfm2-audio-tiny/" + name + ".safetensors")
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			rep, err := Run(context.Background(), m, dev, ref)
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			rep.Print(&b)
			t.Log("\n" + b.String())
			if !rep.OK() {
				t.Error("a stage is outside its tolerance")
			}
		})
	}
}
