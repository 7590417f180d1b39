package server

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
)

// TestOpenAIRealtimeSDK drives /v1/realtime with the official openai npm
// package's realtime client (OpenAIRealtimeWS on ws): a spoken turn the
// server VAD answers, and a barge-in that cancels the second reply and
// truncates it. The SDK always dials wss://, so the route is served over
// TLS here, with the test certificate handed to Node.
func TestOpenAIRealtimeSDK(t *testing.T) {
	dir := filepath.Join("testdata", "openai-client")
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not installed: install Node.js (≥ 18) and run scripts/test.sh, which runs npm ci in %s", dir)
	}
	for _, pkg := range []string{"openai", "ws"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil {
			t.Fatalf("the %s npm package is not installed: run scripts/test.sh (it runs npm ci in %s): %v", pkg, dir, err)
		}
	}
	ts := startServer(t, Config{APIKeys: []string{"sdk-key"}})
	longReplies(ts)
	tlsSrv := httptest.NewUnstartedServer(ts.Server)
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.CloseClientConnections)

	tmp := t.TempDir()
	ca := filepath.Join(tmp, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	speech := filepath.Join(tmp, "speech.pcm")
	if err := os.WriteFile(speech, audio.PCM16LE(utterance(300*time.Millisecond, 800*time.Millisecond, 800*time.Millisecond)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "realtime.mjs", tlsSrv.URL+"/v1", speech)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "NODE_EXTRA_CA_CERTS="+ca)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("node realtime.mjs: %v\n%s", err, stderr.String())
	}
	var out struct {
		Timeout bool
		Errors  []string
		Events  map[string]int
		Session struct {
			ID         string
			TurnDetect string `json:"turn_detection"`
		}
		Updated struct {
			MaxTokens float64 `json:"max_output_tokens"`
			Silence   float64 `json:"silence_duration_ms"`
		}
		Turns []struct {
			ID, Status, Transcript string
			Reason                 *string
			AudioBytes             int `json:"audio_bytes"`
			Deltas                 int
			BargedIn               bool
			ItemID                 string `json:"item_id"`
			Usage                  struct {
				Output int `json:"output_tokens"`
			}
		}
		Truncated []struct {
			ItemID     string `json:"item_id"`
			AudioEndMS int    `json:"audio_end_ms"`
		}
	}
	if err := json.Unmarshal(stdout, &out); err != nil {
		t.Fatalf("client output %q: %v\n%s", stdout, err, stderr.String())
	}
	t.Logf("SDK client: %s", stdout)
	if out.Timeout || len(out.Errors) > 0 {
		t.Fatalf("the SDK client timed out (%v) or saw errors %v", out.Timeout, out.Errors)
	}
	if !strings.HasPrefix(out.Session.ID, "sess_") || out.Session.TurnDetect != "server_vad" || out.Updated.MaxTokens != 200 || out.Updated.Silence != 500 {
		t.Errorf("session %+v, updated %+v", out.Session, out.Updated)
	}
	if len(out.Turns) < 2 {
		t.Fatalf("%d responses, want at least 2: %+v", len(out.Turns), out.Turns)
	}
	first, second := out.Turns[0], out.Turns[1]
	if first.Status != "incomplete" || first.AudioBytes == 0 || first.AudioBytes%(2*rtFrame) != 0 || first.Usage.Output != 200 {
		t.Errorf("first turn %+v: want 200 steps to max_output_tokens (incomplete), whole frames of audio", first)
	}
	if second.Status != "cancelled" || second.Reason == nil || *second.Reason != "turn_detected" || !second.BargedIn {
		t.Errorf("second turn %+v: want cancelled by the barge-in (turn_detected)", second)
	}
	if len(out.Truncated) != 2 || out.Truncated[0].ItemID != second.ItemID || out.Truncated[0].AudioEndMS != second.AudioBytes/2*1000/rtRate ||
		out.Truncated[1].AudioEndMS != 80 {
		t.Errorf("truncations %+v: want the second item at its %d ms sent, then at the 80 ms played", out.Truncated, second.AudioBytes/2*1000/rtRate)
	}
	for _, ev := range []string{"input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
		"conversation.item.added", "conversation.item.done", "response.output_audio_transcript.delta", "response.output_audio.done"} {
		if out.Events[ev] == 0 {
			t.Errorf("the SDK client saw no %s (events %v)", ev, out.Events)
		}
	}
}
