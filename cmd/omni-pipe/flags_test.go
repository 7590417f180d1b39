package main

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// TestFlagRanges: every count and duration flag of every command outside
// its range is a one-line usage error naming the flag and the range, found
// before anything is loaded.
func TestFlagRanges(t *testing.T) {
	tooManyThreads := fmt.Sprint(runtime.NumCPU() + 1)
	tests := []struct {
		args []string
		env  map[string]string
		want string // the error line after "omni-pipe CMD: "
	}{
		// The model flags, on every command that loads a model.
		{[]string{"generate", "--text", "hi", "--threads", "-3"}, nil, "--threads -3: want 0 to "},
		{[]string{"generate", "--text", "hi", "--threads", "1000"}, nil, "--threads 1000: want 0 to "},
		{[]string{"serve", "--threads", tooManyThreads}, nil, "--threads " + tooManyThreads + ": want 0 to "},
		{[]string{"mic", "--threads", "-1"}, nil, "--threads -1: want 0 to "},
		{[]string{"bench", "--model", tiny, "--threads", "1000"}, nil, "--threads 1000: want 0 to "},
		{[]string{"parity", "--model", tiny, "--reference", tiny + "/case3_text_only.safetensors", "--threads", "-3"}, nil, "--threads -3: want 0 to "},
		{[]string{"generate", "--text", "hi", "--device", "tpu"}, nil, `--device "tpu": want cpu, cuda or auto`},
		{[]string{"serve"}, map[string]string{"OMNIPIPE_DEVICE": "tpu"}, `--device "tpu": want cpu, cuda or auto`},

		// generate
		{[]string{"generate", "--text", "hi", "--max-new-tokens", "0"}, nil, "--max-new-tokens 0: want 1 to 32768"},
		{[]string{"generate", "--text", "hi", "--max-new-tokens", "-5"}, nil, "--max-new-tokens -5: want 1 to 32768"},
		{[]string{"generate", "--text", "hi", "--max-new-tokens", "40000"}, nil, "--max-new-tokens 40000: want 1 to 32768"},
		{[]string{"generate", "--text", "hi", "--audio-top-k", "-1"}, nil, "--audio-top-k -1: want 0 to "},
		{[]string{"generate", "--text", "hi", "--audio-temperature", "-1"}, nil, "--audio-temperature -1: want 0 to 100"},
		{[]string{"generate", "--text", "hi", "--audio-temperature", "NaN"}, nil, "--audio-temperature NaN: want 0 to 100"},

		// serve
		{[]string{"serve", "--conversation-ttl", "2ns"}, nil, "--conversation-ttl 2ns: want 1s to 168h"},
		{[]string{"serve", "--conversation-ttl", "-1s"}, nil, "--conversation-ttl -1s: want 1s to 168h"},
		{[]string{"serve"}, map[string]string{"OMNIPIPE_CONVERSATION_TTL": "0s"}, "--conversation-ttl 0s: want 1s to 168h"},
		{[]string{"serve", "--queue-timeout", "0s"}, nil, "--queue-timeout 0s: want 1ms to 1h"},
		{[]string{"serve", "--max-audio", "100ms"}, nil, "--max-audio 100ms: want 1s to 1h"},
		{[]string{"serve", "--shutdown-grace", "-1s"}, nil, "--shutdown-grace -1s: want 1ms to 1h"},
		{[]string{"serve", "--write-stall", "2h"}, nil, "--write-stall 2h0m0s: want 1s to 1h"},
		{[]string{"serve", "--max-new-tokens", "0"}, nil, "--max-new-tokens 0: want 1 to 32768"},
		{[]string{"serve", "--max-new-tokens", "-5"}, nil, "--max-new-tokens -5: want 1 to 32768"},
		{[]string{"serve", "--max-concurrent", "0"}, nil, "--max-concurrent 0: want 1 to 1024"},
		{[]string{"serve", "--max-queue", "-1"}, nil, "--max-queue -1: want 0 to 65536"},
		{[]string{"serve", "--max-body-mb", "0"}, nil, "--max-body-mb 0: want 1 to 4096"},
		{[]string{"serve", "--max-text-bytes", "0"}, nil, "--max-text-bytes 0: want 1 to 16777216"},
		{[]string{"serve", "--max-text-bytes", "-1"}, nil, "--max-text-bytes -1: want 1 to 16777216"},
		{[]string{"serve"}, map[string]string{"OMNIPIPE_MAX_TEXT_BYTES": "1073741824"}, "--max-text-bytes 1073741824: want 1 to 16777216"},
		{[]string{"serve", "--max-conversations", "2"}, nil, "--max-conversations 2: want 4 (--max-concurrent) to 1048576"},

		// mic
		{[]string{"mic", "--max-new-tokens", "-5"}, nil, "--max-new-tokens -5: want 1 to 32768"},
		{[]string{"mic", "--echo-guard", "-1s"}, nil, "--echo-guard -1s: want 1ms to 10s"},
		{[]string{"mic", "--vad-silence", "1m"}, nil, "--vad-silence 1m0s: want 1ms to 30s"},
		{[]string{"mic", "--playing-boost", "-3"}, nil, "--playing-boost -3: want 0.001 to 60"},
		{[]string{"mic", "--mic-rate", "1000000"}, nil, "--mic-rate 1000000: want 0 (the device's rate) or 8000 to 384000"},
		{[]string{"mic", "--audio-top-k", "-2"}, nil, "--audio-top-k -2: want 0 to "},

		// bench
		{[]string{"bench", "--model", tiny, "--turns", "0"}, nil, "--turns 0: want 1 to 10000"},
		{[]string{"bench", "--model", tiny, "--warmup", "-1"}, nil, "--warmup -1: want 0 to 1000"},
		{[]string{"bench", "--model", tiny, "--max-new-tokens", "0"}, nil, "--max-new-tokens 0: want 1 to 32768"},
		{[]string{"bench", "--model", tiny, "--seconds", "0"}, nil, "--seconds 0: want 0.01 to 600"},
	}
	for _, tt := range tests {
		if tt.args[0] == "serve" {
			// A value that passes would start a server: let it fail to listen instead.
			tt.args = append(tt.args, "--addr", "127.0.0.1:-1")
		}
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			stdout, stderr := &strings.Builder{}, &strings.Builder{}
			e := &env{stdin: strings.NewReader(""), stdout: stdout, stderr: stderr, getenv: func(k string) string { return tt.env[k] }}
			code := run(tt.args, e)
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			want := "omni-pipe " + tt.args[0] + ": " + tt.want
			if code != exitUsage || !strings.HasPrefix(lines[0], want) || len(lines) != 2 || stdout.Len() != 0 {
				t.Errorf("exit %d, stdout %q, stderr:\n%s\nwant exit %d and two lines, the first starting %q", code, stdout, stderr, exitUsage, want)
			}
		})
	}
}
