package bench

import (
	"context"
	"maps"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
	"github.com/omni-pipe/omni-pipe/internal/testmodel"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
)

// TestStepKindsMatchTheTeacher: the audio steps read from the
// depthformer's intervals are the steps a teacher sees sampling audio.
func TestStepKindsMatchTheTeacher(t *testing.T) {
	dev := cpu.New(1)
	defer dev.Close()
	m, err := lfm2audio.Load(dev, testmodel.LFM2AudioTiny())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tr := &pipeline.Trace{}
	eng := pipeline.New(m, dev, pipeline.Options{Trace: tr})
	defer eng.Close()
	obs := &observer{sp: m.Info().Special, kinds: map[int]pipeline.Kind{}}
	st, err := eng.Start(context.Background(), eng.NewSession(), pipeline.Request{Text: "Hello there.", MaxNewTokens: 30, Teacher: obs, AudioSampling: pipeline.DefaultAudio})
	if err != nil {
		t.Fatal(err)
	}
	for range st.Events {
	}
	want := map[int]pipeline.Kind{}
	for s, k := range obs.kinds {
		if k == pipeline.AudioStep {
			want[s] = k
		}
	}
	if got := stepKinds(tr.Intervals()); len(want) == 0 || !maps.Equal(got, want) {
		t.Errorf("audio steps from the trace %v, the teacher's %v", got, want)
	}
}
