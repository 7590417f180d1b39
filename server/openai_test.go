package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Chat completion replies as a client decodes them.
type (
	wireCC struct {
		ID             string `json:"id"`
		Object         string `json:"object"`
		Model          string `json:"model"`
		ConversationID string `json:"conversation_id"`
		Choices        []struct {
			Message *wireCCMessage `json:"message"`
			Delta   *wireCCMessage `json:"delta"`
			Finish  *string        `json:"finish_reason"`
		} `json:"choices"`
		Usage *struct {
			Prompt     int `json:"prompt_tokens"`
			Completion int `json:"completion_tokens"`
			Total      int `json:"total_tokens"`
		} `json:"usage"`
		Error *struct{ Code string } `json:"error"`
	}
	wireCCMessage struct {
		Role    string  `json:"role"`
		Content *string `json:"content"`
		Audio   *struct {
			ID         string `json:"id"`
			Data       string `json:"data"`
			Transcript string `json:"transcript"`
			ExpiresAt  int64  `json:"expires_at"`
		} `json:"audio"`
	}
)

// reference runs a request through /v1/audio/chat (JSON) for the text and
// the number of PCM samples a chat completion with the same input must give.
func reference(t *testing.T, ts *testServer, req map[string]any) (string, int) {
	t.Helper()
	req["stream"] = false
	resp := ts.post(t, "/v1/audio/chat", req)
	defer resp.Body.Close()
	var d wireDone
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || resp.StatusCode != 200 {
		t.Fatalf("reference: status %d: %v", resp.StatusCode, err)
	}
	wav, _ := base64.StdEncoding.DecodeString(d.Audio)
	return d.Text, (len(wav) - 44) / 2
}

func TestChatCompletions(t *testing.T) {
	ts := startServer(t, Config{})
	wav := questionWAV(t)
	wantText, wantSamples := reference(t, ts, map[string]any{"audio": wav, "max_new_tokens": 20, "temperature": 0})
	speech := map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_audio", "input_audio": map[string]any{"data": wav, "format": "wav"}}}}
	req := map[string]any{"model": "anything", "modalities": []string{"text", "audio"}, "audio": map[string]any{"voice": "alloy", "format": "pcm16"},
		"messages": []any{speech}, "max_tokens": 20, "temperature": 0}

	// Non-streaming, pcm16.
	resp := ts.post(t, "/v1/chat/completions", req)
	var cc wireCC
	if err := json.NewDecoder(resp.Body).Decode(&cc); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d: %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	msg := cc.Choices[0].Message
	if cc.Object != "chat.completion" || cc.Model != "lfm2-audio-tiny" || msg == nil || msg.Role != "assistant" || msg.Audio == nil || msg.Content != nil {
		t.Fatalf("reply %+v", cc)
	}
	pcm, _ := base64.StdEncoding.DecodeString(msg.Audio.Data)
	if msg.Audio.Transcript != wantText || len(pcm) != 2*wantSamples {
		t.Errorf("transcript %q and %d PCM bytes, want %q and %d", msg.Audio.Transcript, len(pcm), wantText, 2*wantSamples)
	}
	if !strings.HasSuffix(msg.Audio.ID, "_1") || msg.Audio.ExpiresAt <= time.Now().Unix() || *cc.Choices[0].Finish != "length" || cc.Usage.Completion != 20 {
		t.Errorf("audio id %q, expires %d, finish %q, usage %+v", msg.Audio.ID, msg.Audio.ExpiresAt, *cc.Choices[0].Finish, cc.Usage)
	}
	firstID := msg.Audio.ID

	// Streaming.
	req["stream"] = true
	req["stream_options"] = map[string]any{"include_usage": true}
	resp = ts.post(t, "/v1/chat/completions", req)
	evs := readAll(t, resp.Body)
	resp.Body.Close()
	if len(evs) < 3 || evs[len(evs)-1].data != "[DONE]" {
		t.Fatalf("%d events, last %+v", len(evs), evs[len(evs)-1])
	}
	var transcript string
	var pcmBytes int
	var finish string
	for i, ev := range evs[:len(evs)-1] {
		var ch wireCC
		if ev.name != "" || json.Unmarshal([]byte(ev.data), &ch) != nil || ch.Object != "chat.completion.chunk" {
			t.Fatalf("chunk %d: %+v", i, ev)
		}
		if len(ch.Choices) == 0 {
			if ch.Usage == nil || ch.Usage.Completion != 20 || i != len(evs)-2 {
				t.Errorf("usage chunk %d: %+v", i, ch.Usage)
			}
			continue
		}
		d := ch.Choices[0].Delta
		if i == 0 && (d.Role != "assistant" || ch.ConversationID == "") {
			t.Errorf("first chunk %+v", ch)
		}
		if d.Audio != nil {
			transcript += d.Audio.Transcript
			b, _ := base64.StdEncoding.DecodeString(d.Audio.Data)
			pcmBytes += len(b)
		}
		if f := ch.Choices[0].Finish; f != nil {
			finish = *f
		}
	}
	if transcript != wantText || pcmBytes != 2*wantSamples || finish != "length" {
		t.Errorf("streamed transcript %q, %d PCM bytes, finish %q; want %q, %d, length", transcript, pcmBytes, finish, wantText, 2*wantSamples)
	}

	// A second turn continues the first reply's conversation; its id, used
	// again after that, is stale.
	follow := map[string]any{"messages": []any{speech, map[string]any{"role": "assistant", "audio": map[string]any{"id": firstID}},
		map[string]any{"role": "user", "content": "And then?"}}, "modalities": []string{"text", "audio"}, "max_tokens": 5}
	resp = ts.post(t, "/v1/chat/completions", follow)
	cc = wireCC{}
	if err := json.NewDecoder(resp.Body).Decode(&cc); err != nil || resp.StatusCode != 200 {
		t.Fatalf("follow-up: status %d: %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if id := cc.Choices[0].Message.Audio.ID; id != strings.TrimSuffix(firstID, "_1")+"_2" {
		t.Errorf("follow-up audio id %q after %q", id, firstID)
	}
	checkError(t, ts.post(t, "/v1/chat/completions", follow), http.StatusConflict, "stale_audio_id", "")

	// Text only.
	resp = ts.post(t, "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "Hi"}}, "max_tokens": 8})
	cc = wireCC{}
	if err := json.NewDecoder(resp.Body).Decode(&cc); err != nil || resp.StatusCode != 200 {
		t.Fatalf("text only: status %d: %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if m := cc.Choices[0].Message; m.Content == nil || m.Audio != nil {
		t.Errorf("text-only reply %+v", m)
	}
}

// TestOpenAISDK drives /v1/chat/completions with the official openai npm
// package (server/testdata/openai-client), as a real client.
func TestOpenAISDK(t *testing.T) {
	dir := filepath.Join("testdata", "openai-client")
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not installed: install Node.js (≥ 18) and run scripts/test.sh, which runs npm ci in %s", dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err != nil {
		t.Fatalf("the openai npm package is not installed: run scripts/test.sh (it runs npm ci in %s): %v", dir, err)
	}
	ts := startServer(t, Config{})
	clip := loadClip(t, "case1_question_16k.safetensors")
	wavPath := filepath.Join(t.TempDir(), "question.wav")
	if err := os.WriteFile(wavPath, wavBytes(t, clip), 0o644); err != nil {
		t.Fatal(err)
	}
	wantText, wantSamples := reference(t, ts, map[string]any{"audio": wavBase64(t, clip), "max_new_tokens": 24, "temperature": 0, "seed": 1})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "client.mjs", ts.url+"/v1", wavPath)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("node client.mjs: %v\n%s", err, stderr.String())
	}
	var out struct {
		NonStream struct {
			Object, Model, Transcript string
			FinishReason              string `json:"finish_reason"`
			AudioID                   string `json:"audio_id"`
			ExpiresAt                 int64  `json:"expires_at"`
			WAVBytes                  int    `json:"wav_bytes"`
		} `json:"nonStream"`
		Stream struct {
			Transcript   string
			PCMBytes     int    `json:"pcm_bytes"`
			AudioChunks  int    `json:"audio_chunks"`
			FinishReason string `json:"finish_reason"`
			Role         string
			Usage        *struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		} `json:"stream"`
		FollowUp struct {
			AudioID    string `json:"audio_id"`
			Transcript string
		} `json:"followUp"`
		TextOnly struct {
			Content *string
			Audio   any
		} `json:"textOnly"`
		Error *struct {
			Name, Code, Param, Type string
			Status                  int
			RequestID               string `json:"request_id"`
		}
		Models []string
	}
	if err := json.Unmarshal(stdout, &out); err != nil {
		t.Fatalf("client output %q: %v", stdout, err)
	}
	t.Logf("openai SDK: transcript %q, %d WAV bytes, %d streamed PCM bytes in %d audio chunks", out.NonStream.Transcript, out.NonStream.WAVBytes, out.Stream.PCMBytes, out.Stream.AudioChunks)

	ns := out.NonStream
	if ns.Transcript != wantText || ns.WAVBytes != 44+2*wantSamples || ns.FinishReason != "length" || ns.AudioID == "" || ns.ExpiresAt <= time.Now().Unix() {
		t.Errorf("non-streamed: %+v; want transcript %q and %d WAV bytes", ns, wantText, 44+2*wantSamples)
	}
	st := out.Stream
	if st.Transcript != wantText || st.PCMBytes != 2*wantSamples || st.AudioChunks != wantSamples/frameLen || st.FinishReason != "length" || st.Role != "assistant" {
		t.Errorf("streamed: %+v; want transcript %q, %d PCM bytes in %d chunks", st, wantText, 2*wantSamples, wantSamples/frameLen)
	}
	if st.Usage == nil || st.Usage.CompletionTokens != 24 {
		t.Errorf("streamed usage %+v, want 24 completion tokens", st.Usage)
	}
	if !strings.HasSuffix(out.FollowUp.AudioID, "_2") || strings.TrimSuffix(out.FollowUp.AudioID, "_2") != strings.TrimSuffix(ns.AudioID, "_1") {
		t.Errorf("follow-up audio id %q after %q", out.FollowUp.AudioID, ns.AudioID)
	}
	if out.TextOnly.Content == nil || out.TextOnly.Audio != nil {
		t.Errorf("text-only reply: %+v", out.TextOnly)
	}
	if e := out.Error; e == nil || e.Status != 400 || e.Code != codeInvalidValue || e.Param != "temperature" || e.RequestID == "" || e.Name != "BadRequestError" {
		t.Errorf("error as the SDK sees it: %+v", e)
	}
	if len(out.Models) != 1 || out.Models[0] != "lfm2-audio-tiny" {
		t.Errorf("models %v", out.Models)
	}
}
