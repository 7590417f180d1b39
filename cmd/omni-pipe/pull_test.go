package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

const hubCommit = "0123456789abcdef0123456789abcdef01234567"

// hubFiles are the fixture's files a fake repo holds.
var hubFiles = []string{"config.json", "model.safetensors", "tokenizer.json", "mimi.safetensors", "mimi_config.json"}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// handMadeCache lays out the fixture as huggingface_hub would have cached
// repo at hubCommit (blobs, relative symlinks, refs/main) and returns the
// cache folder.
func handMadeCache(t *testing.T, repo string) string {
	t.Helper()
	cache := t.TempDir()
	dir := filepath.Join(cache, "models--"+strings.ReplaceAll(repo, "/", "--"))
	snap := filepath.Join(dir, "snapshots", hubCommit)
	for _, d := range []string{filepath.Join(dir, "blobs"), filepath.Join(dir, "refs"), snap} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range hubFiles {
		b, err := os.ReadFile(filepath.Join(tiny, f))
		if err != nil {
			t.Fatal(err)
		}
		e := sha256Hex(b)
		if err := os.WriteFile(filepath.Join(dir, "blobs", e), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..", "..", "blobs", e), filepath.Join(snap, f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "refs", "main"), []byte(hubCommit), 0o644); err != nil {
		t.Fatal(err)
	}
	return cache
}

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// TestModelByName: --model owner/name loads the snapshot of the Hugging
// Face cache in place, named by its repo id with its commit; tokenize takes
// a repo id too; a folder of that name here is still a folder.
func TestModelByName(t *testing.T) {
	cache := handMadeCache(t, "LiquidAI/tiny")
	getenv := envOf(map[string]string{"HF_HUB_CACHE": cache, "HF_ENDPOINT": "http://127.0.0.1:1"})
	var mf modelFlags
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	mf.register(fs, &env{stderr: io.Discard, getenv: getenv})
	if err := fs.Parse([]string{"--model", "LiquidAI/tiny", "--offline"}); err != nil {
		t.Fatal(err)
	}
	m, dev, _, err := mf.open()
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	defer m.Close()
	if m.Info().Name != "LiquidAI/tiny" || mf.source == nil || mf.source.Commit != hubCommit {
		t.Errorf("loaded %q from %+v, want LiquidAI/tiny at %s", m.Info().Name, mf.source, hubCommit)
	}

	var byName, byDir strings.Builder
	for _, c := range []struct {
		args []string
		out  *strings.Builder
	}{{[]string{"tokenize", "--model", "LiquidAI/tiny"}, &byName}, {[]string{"tokenize", "--model", tiny}, &byDir}} {
		var stderr strings.Builder
		if code := run(c.args, &env{stdin: strings.NewReader("hello"), stdout: c.out, stderr: &stderr, getenv: getenv}); code != exitOK {
			t.Fatalf("%v: exit %d: %s", c.args, code, stderr.String())
		}
	}
	if byName.String() != byDir.String() || byName.Len() == 0 {
		t.Errorf("tokenize by name %q, by folder %q", byName.String(), byDir.String())
	}

	// A folder that exists wins over the repo id it spells.
	abs, err := filepath.Abs(tiny)
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir())
	if err := os.MkdirAll("LiquidAI", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(abs, filepath.Join("LiquidAI", "tiny")); err != nil {
		t.Fatal(err)
	}
	mf.source = nil
	m2, dev2, _, err := mf.open()
	if err != nil {
		t.Fatal(err)
	}
	defer dev2.Close()
	defer m2.Close()
	if mf.source != nil || m2.Info().Name != "tiny" {
		t.Errorf("the folder LiquidAI/tiny loaded as %q from %+v, want the folder", m2.Info().Name, mf.source)
	}
}

// fakeHubServer serves one repo's fixture files the way the Hub does (API
// revision, HEAD and GET of resolve URLs), gated by token when not empty,
// and counts its requests.
func fakeHubServer(t *testing.T, repo, token string, requests *int) *httptest.Server {
	t.Helper()
	files := map[string][]byte{}
	for _, f := range hubFiles {
		b, err := os.ReadFile(filepath.Join(tiny, f))
		if err != nil {
			t.Fatal(err)
		}
		files[f] = b
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*requests++
		if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
			w.Header().Set("X-Error-Code", "GatedRepo")
			http.Error(w, "gated", http.StatusForbidden)
			return
		}
		if r.URL.Path == "/api/models/"+repo+"/revision/main" {
			var sib []map[string]string
			for _, f := range append(hubFiles, "README.md") {
				sib = append(sib, map[string]string{"rfilename": f})
			}
			json.NewEncoder(w).Encode(map[string]any{"sha": hubCommit, "siblings": sib})
			return
		}
		name, ok := strings.CutPrefix(r.URL.Path, "/"+repo+"/resolve/"+hubCommit+"/")
		b, found := files[name]
		if !ok || !found {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("X-Repo-Commit", hubCommit)
		w.Header().Set("X-Linked-Etag", `"`+sha256Hex(b)+`"`)
		w.Header().Set("X-Linked-Size", fmt.Sprint(len(b)))
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		if r.Method == http.MethodGet {
			w.Write(b)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestPullCommand: pull downloads into HF_HUB_CACHE from HF_ENDPOINT with
// HF_TOKEN and prints the snapshot folder; offline it only checks the
// cache; a gated repo without a token says to accept the licence; a bad
// command line is a usage error.
func TestPullCommand(t *testing.T) {
	var n int
	srv := fakeHubServer(t, "LiquidAI/tiny", "hf_ok", &n)
	cache := t.TempDir()
	vars := map[string]string{"HF_HUB_CACHE": cache, "HF_ENDPOINT": srv.URL, "HF_HOME": t.TempDir()}
	pull := func(args ...string) (int, string, string) {
		var stdout, stderr strings.Builder
		code := run(append([]string{"pull"}, args...), &env{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: envOf(vars)})
		return code, stdout.String(), stderr.String()
	}
	if code, _, stderr := pull("LiquidAI/tiny"); code != exitError || !strings.Contains(stderr, "licence") || !strings.Contains(stderr, "HF_TOKEN") {
		t.Errorf("gated pull without a token: exit %d, %q", code, stderr)
	}
	vars["HF_TOKEN"] = "hf_ok"
	code, stdout, stderr := pull("LiquidAI/tiny")
	want := filepath.Join(cache, "models--LiquidAI--tiny", "snapshots", hubCommit)
	if code != exitOK || strings.TrimSpace(stdout) != want {
		t.Fatalf("pull: exit %d, stdout %q, stderr %q; want %s", code, stdout, stderr, want)
	}
	if !strings.Contains(stderr, "model.safetensors") || !strings.Contains(stderr, hubCommit) {
		t.Errorf("pull's stderr %q lacks the progress and the commit", stderr)
	}
	if _, err := os.Lstat(filepath.Join(want, "README.md")); err == nil {
		t.Error("pull fetched README.md, which the model does not need")
	}
	before := n
	if code, stdout, stderr := pull("--offline", "LiquidAI/tiny"); code != exitOK || strings.TrimSpace(stdout) != want || n != before {
		t.Errorf("offline pull of a cached model: exit %d, %q, %q, %d requests", code, stdout, stderr, n-before)
	}
	if code, _, stderr := pull("--offline", "LiquidAI/other"); code != exitError || !strings.Contains(stderr, "offline") || n != before {
		t.Errorf("offline pull of a model not cached: exit %d, %q, %d requests", code, stderr, n-before)
	}
	for _, args := range [][]string{nil, {"a/b", "c/d"}, {"not-a-repo"}} {
		if code, _, _ := pull(args...); code != exitUsage {
			t.Errorf("pull %q: exit %d, want %d", args, code, exitUsage)
		}
	}
}

// TestServeModelByName: serve --model owner/name (from the Hugging Face
// cache, offline) reports the repo id and its commit in /health and
// /v1/models.
func TestServeModelByName(t *testing.T) {
	cache := handMadeCache(t, "LiquidAI/tiny")
	stderr := &lockedBuffer{}
	e := &env{stdin: strings.NewReader(""), stdout: io.Discard, stderr: stderr, getenv: envOf(map[string]string{"HF_HUB_CACHE": cache, "HF_HUB_OFFLINE": "1"})}
	exit := make(chan int, 1)
	go func() {
		exit <- run([]string{"serve", "--addr", "127.0.0.1:0", "--threads", "2", "--model", "LiquidAI/tiny"}, e)
	}()
	addr := waitListening(t, exit, stderr)
	defer func() {
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
		if code := <-exit; code != exitOK {
			t.Errorf("serve exited with %d", code)
		}
	}()
	get := func(path string, v any) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	var h struct {
		Model  string `json:"model"`
		Commit string `json:"model_commit"`
	}
	get("/health", &h)
	if h.Model != "LiquidAI/tiny" || h.Commit != hubCommit {
		t.Errorf("/health model %q commit %q, want LiquidAI/tiny %s", h.Model, h.Commit, hubCommit)
	}
	var l struct{ Data []struct{ ID, Commit string } }
	get("/v1/models", &l)
	if len(l.Data) != 1 || l.Data[0].ID != "LiquidAI/tiny" || l.Data[0].Commit != hubCommit {
		t.Errorf("/v1/models %+v, want LiquidAI/tiny at %s", l.Data, hubCommit)
	}
	if !strings.Contains(stderr.String(), "commit="+hubCommit) {
		t.Errorf("serve's log does not name the commit:\n%s", stderr.String())
	}
}
