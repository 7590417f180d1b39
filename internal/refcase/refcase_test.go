package refcase

import (
	"strings"
	"testing"
)

func TestOpenFixtureCase(t *testing.T) {
	c, err := Open("../../testdata/lfm2-audio-tiny/case4_two_turn.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.System == "" || len(c.Turns) != 3 || c.Turns[1].Trace != "turn1_step_*" || c.Gen.MaxNewTokens != 60 || c.Gen.NText != 6 {
		t.Errorf("metadata: system %q, turns %+v, generation %+v", c.System, c.Turns, c.Gen)
	}
	tr, err := c.Trace(c.Turns[1].Trace)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Steps() != 60 || tr.Codes[0] != nil || len(tr.Codes[6]) != 8 || tr.Tokens[6] != -1 {
		t.Errorf("turn-1 trace: %d steps, codes[0] %v, codes[6] %v", tr.Steps(), tr.Codes[0], tr.Codes[6])
	}
	clip, err := c.Clip("input_wav")
	if err != nil || clip.SampleRate != 24000 || len(clip.Samples) != 48000 {
		t.Errorf("clip: %v, %v", clip, err)
	}
	if _, err := Open("../../testdata/lfm2-audio-tiny/model.safetensors"); err == nil || !strings.Contains(err.Error(), "no recorded conversation") {
		t.Errorf("opening a checkpoint as a case: %v", err)
	}
}
