package server

import (
	"testing"
)

// TestModelCommit: a model that came by its Hugging Face name shows its
// repo id and commit in /health and /v1/models; a folder's shows none.
func TestModelCommit(t *testing.T) {
	const commit = "0123456789abcdef0123456789abcdef01234567"
	for _, c := range []struct{ model, commit string }{{"LiquidAI/LFM2-Audio-1.5B", commit}, {"lfm2-audio", ""}} {
		s := New(Config{Logger: discardLogger()})
		s.SetBackend(&Backend{Model: c.model, Commit: c.commit, Device: "cpu"})
		var h map[string]any
		getJSON(t, s, "/health", &h)
		if got, _ := h["model_commit"].(string); h["model"] != c.model || got != c.commit {
			t.Errorf("/health model %v commit %v, want %s %q", h["model"], h["model_commit"], c.model, c.commit)
		}
		var l struct {
			Data []map[string]any `json:"data"`
		}
		getJSON(t, s, "/v1/models", &l)
		if len(l.Data) != 1 {
			t.Fatalf("/v1/models %+v", l)
		}
		if got, _ := l.Data[0]["commit"].(string); l.Data[0]["id"] != c.model || got != c.commit {
			t.Errorf("/v1/models %+v, want id %s commit %q", l.Data[0], c.model, c.commit)
		}
	}
}
