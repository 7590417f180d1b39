package hub

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const tiny = "../../testdata/lfm2-audio-tiny"

// repoFiles are the fixture's files a fake repo holds: the model's, and
// some it does not need (a README, a reference case) that must not come.
var repoFiles = []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
	"mimi.safetensors", "mimi_config.json", "README.md", "case3_text_only.safetensors"}

// modelFiles are the repoFiles a pull fetches.
var modelFiles = []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "mimi.safetensors", "mimi_config.json"}

const (
	commitMain = "1111111111111111111111111111111111111111"
	commitV1   = "2222222222222222222222222222222222222222"
)

// fakeHub serves the Hub's endpoints for one repo: /api/models/REPO/revision/REV,
// HEAD and GET of /REPO/resolve/COMMIT/FILE (LFS files, *.safetensors,
// answered with their sha256 as X-Linked-Etag and a redirect to /cdn/SHA256),
// and /cdn/SHA256 with Range.
type fakeHub struct {
	t      *testing.T
	repo   string
	token  string            // non-empty: the repo is gated, this token opens it
	revs   map[string]string // revision → commit
	files  map[string][]byte // commit/file → content
	served map[string][]byte // what GET serves instead (a corrupted copy)
	cut    map[string]int    // cdn GETs of a file to cut off half-way
	old    string            // a former name of the repo, redirected (relative Location) to repo
	mu     sync.Mutex
	reqs   []string       // "METHOD path [range]"
	gets   map[string]int // file → content GETs
	srv    *httptest.Server
}

func newFakeHub(t *testing.T, repo string) *fakeHub {
	t.Helper()
	h := &fakeHub{t: t, repo: repo, revs: map[string]string{"main": commitMain, "v1": commitV1},
		files: map[string][]byte{}, served: map[string][]byte{}, cut: map[string]int{}, gets: map[string]int{}}
	for _, f := range repoFiles {
		b, err := os.ReadFile(filepath.Join(tiny, f))
		if err != nil {
			t.Fatal(err)
		}
		h.files[commitMain+"/"+f] = b
		if f == "config.json" { // v1 has another config
			b = append([]byte(nil), b...)
			b = append(b, '\n')
		}
		h.files[commitV1+"/"+f] = b
	}
	h.srv = httptest.NewUnstartedServer(h)
	h.srv.Start()
	t.Cleanup(h.srv.Close)
	return h
}

func (h *fakeHub) requests() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.reqs...)
}

func (h *fakeHub) getCounts() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.gets)
}

func isLFS(name string) bool { return strings.HasSuffix(name, ".safetensors") }

func etagOf(name string, b []byte) string {
	if isLFS(name) {
		s := sha256.Sum256(b)
		return hex.EncodeToString(s[:])
	}
	s := sha1.Sum(append([]byte(fmt.Sprintf("blob %d\x00", len(b))), b...))
	return hex.EncodeToString(s[:])
}

func (h *fakeHub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.reqs = append(h.reqs, strings.TrimSpace(r.Method+" "+r.URL.Path+" "+r.Header.Get("Range")))
	h.mu.Unlock()
	if h.old != "" {
		for _, p := range []string{"/api/models/", "/"} {
			if rest, ok := strings.CutPrefix(r.URL.Path, p+h.old+"/"); ok {
				http.Redirect(w, r, p+h.repo+"/"+rest, http.StatusTemporaryRedirect)
				return
			}
		}
	}
	if h.token != "" && r.Header.Get("Authorization") != "Bearer "+h.token && !strings.HasPrefix(r.URL.Path, "/cdn/") {
		w.Header().Set("X-Error-Code", "GatedRepo")
		w.Header().Set("X-Error-Message", "Access to model "+h.repo+" is restricted.")
		http.Error(w, "gated", http.StatusUnauthorized)
		return
	}
	if rest, ok := strings.CutPrefix(r.URL.Path, "/api/models/"+h.repo+"/revision/"); ok {
		commit, ok := h.revs[rest]
		if !ok && commitID.MatchString(rest) {
			commit, ok = rest, true
		}
		if !ok {
			w.Header().Set("X-Error-Code", "RevisionNotFound")
			http.Error(w, "no revision", http.StatusNotFound)
			return
		}
		var sib []map[string]string
		for _, f := range repoFiles {
			sib = append(sib, map[string]string{"rfilename": f})
		}
		json.NewEncoder(w).Encode(map[string]any{"id": h.repo, "sha": commit, "siblings": sib})
		return
	}
	if rest, ok := strings.CutPrefix(r.URL.Path, "/"+h.repo+"/resolve/"); ok {
		commit, file, _ := strings.Cut(rest, "/")
		b, ok := h.files[commit+"/"+file]
		if !ok {
			w.Header().Set("X-Error-Code", "EntryNotFound")
			http.Error(w, "no file", http.StatusNotFound)
			return
		}
		w.Header().Set("X-Repo-Commit", commit)
		if isLFS(file) {
			w.Header().Set("X-Linked-Etag", `"`+etagOf(file, b)+`"`)
			w.Header().Set("X-Linked-Size", fmt.Sprint(len(b)))
			http.Redirect(w, r, h.srv.URL+"/cdn/"+commit+"/"+file, http.StatusFound)
			return
		}
		w.Header().Set("ETag", `"`+etagOf(file, b)+`"`)
		h.serve(w, r, file, b)
		return
	}
	if rest, ok := strings.CutPrefix(r.URL.Path, "/cdn/"); ok {
		_, file, _ := strings.Cut(rest, "/")
		b, ok := h.files[rest]
		if !ok {
			http.NotFound(w, r)
			return
		}
		h.serve(w, r, file, b)
		return
	}
	http.NotFound(w, r)
}

// serve answers a HEAD or GET of a file's content, honouring Range.
func (h *fakeHub) serve(w http.ResponseWriter, r *http.Request, file string, b []byte) {
	if r.Method == http.MethodHead {
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		return
	}
	h.mu.Lock()
	h.gets[file]++
	if c, ok := h.served[file]; ok {
		b = c
	}
	cut := h.cut[file] > 0
	if cut {
		h.cut[file]--
	}
	h.mu.Unlock()
	start := 0
	if rg := r.Header.Get("Range"); rg != "" {
		if _, err := fmt.Sscanf(rg, "bytes=%d-", &start); err != nil || start >= len(b) {
			http.Error(w, "bad range", http.StatusRequestedRangeNotSatisfiable)
			return
		}
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, len(b)-1, len(b)))
		w.Header().Set("Content-Length", fmt.Sprint(len(b)-start))
		w.WriteHeader(http.StatusPartialContent)
	} else {
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
	}
	if cut {
		w.Write(b[start : start+(len(b)-start)/2])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection drops mid-file
	}
	w.Write(b[start:])
}

func (h *fakeHub) client(t *testing.T, cache string) *Client {
	return &Client{CacheDir: cache, Endpoint: h.srv.URL, HTTP: h.srv.Client(), Progress: &strings.Builder{}}
}

// checkSnapshot checks that snap holds the model's files, each a relative
// symlink into blobs/ with the commit's content, and none of the others.
func checkSnapshot(t *testing.T, h *fakeHub, snap *Snapshot, commit string) {
	t.Helper()
	if snap.Commit != commit || filepath.Base(snap.Dir) != commit {
		t.Errorf("snapshot %s at %s, want commit %s", snap.Dir, snap.Commit, commit)
	}
	for _, f := range modelFiles {
		p := filepath.Join(snap.Dir, f)
		target, err := os.Readlink(p)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		want := h.files[commit+"/"+f]
		if target != filepath.Join("..", "..", "blobs", etagOf(f, want)) {
			t.Errorf("%s links to %s, want ../../blobs/%s", f, target, etagOf(f, want))
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != string(want) {
			t.Errorf("%s: %d bytes (%v), want the repo's %d", f, len(got), err, len(want))
		}
	}
	for _, f := range []string{"README.md", "case3_text_only.safetensors"} {
		if _, err := os.Lstat(filepath.Join(snap.Dir, f)); err == nil {
			t.Errorf("%s was downloaded; the model does not need it", f)
		}
	}
	blobs, _ := filepath.Glob(filepath.Join(filepath.Dir(filepath.Dir(snap.Dir)), "blobs", "*"))
	for _, b := range blobs {
		if strings.HasSuffix(b, ".incomplete") {
			t.Errorf("%s is left", b)
		}
	}
}

func TestParseRef(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Ref
		ok   bool
	}{
		{"LiquidAI/LFM2-Audio-1.5B", Ref{"LiquidAI/LFM2-Audio-1.5B", "main"}, true},
		{"LiquidAI/LFM2-Audio-1.5B@v1.0", Ref{"LiquidAI/LFM2-Audio-1.5B", "v1.0"}, true},
		{"a/b@refs/pr/1", Ref{"a/b", "refs/pr/1"}, true},
		{"a/b@" + commitMain, Ref{"a/b", commitMain}, true},
		{"model", Ref{}, false},
		{"./models/x", Ref{}, false},
		{"/abs/path", Ref{}, false},
		{"a/b/c", Ref{}, false},
		{"a/b@", Ref{}, false},
		{"a/b@../x", Ref{}, false},
		{"a--b/c", Ref{}, false},
		{"../x", Ref{}, false},
		{"a/.x", Ref{}, false},
	} {
		got, err := ParseRef(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ParseRef(%q) = %v, %v; want %v, ok %v", c.in, got, err, c.want, c.ok)
		}
	}
}

func FuzzParseRef(f *testing.F) {
	for _, s := range []string{"a/b", "a/b@main", "a/b@refs/pr/1", "../x", "a/b@"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRef(s)
		if err != nil {
			return
		}
		if strings.Contains(r.Repo, "..") || strings.Count(r.Repo, "/") != 1 || strings.Contains(r.Revision, "..") {
			t.Errorf("ParseRef(%q) = %+v: escapes the cache", s, r)
		}
		if back, err := ParseRef(r.Repo + "@" + r.Revision); err != nil || back != r {
			t.Errorf("ParseRef(%q) round trip: %+v, %v", s, back, err)
		}
	})
}

func TestFromEnv(t *testing.T) {
	home := t.TempDir()
	os.WriteFile(filepath.Join(home, "token"), []byte("hf_file\n"), 0o600)
	for _, c := range []struct {
		env                    map[string]string
		cache, endpoint, token string
		offline                bool
	}{
		{map[string]string{"HOME": "/h"}, "/h/.cache/huggingface/hub", DefaultEndpoint, "", false},
		{map[string]string{"HOME": "/h", "XDG_CACHE_HOME": "/x"}, "/x/huggingface/hub", DefaultEndpoint, "", false},
		{map[string]string{"HF_HOME": home, "HF_ENDPOINT": "http://mirror/"}, home + "/hub", "http://mirror", "hf_file", false},
		{map[string]string{"HF_HOME": home, "HF_HUB_CACHE": "/c", "HF_TOKEN": "hf_env", "HF_HUB_OFFLINE": "1"}, "/c", DefaultEndpoint, "hf_env", true},
		{map[string]string{"HOME": "/h", "HF_HUB_OFFLINE": "0"}, "/h/.cache/huggingface/hub", DefaultEndpoint, "", false},
	} {
		got := FromEnv(func(k string) string { return c.env[k] })
		if got.CacheDir != c.cache || got.Endpoint != c.endpoint || got.Token != c.token || got.Offline != c.offline {
			t.Errorf("FromEnv(%v) = cache %s endpoint %s token %q offline %v", c.env, got.CacheDir, got.Endpoint, got.Token, got.Offline)
		}
	}
}

// TestPullFromEmpty: a pull into an empty cache fetches the model's files
// (only those) into huggingface_hub's layout, with refs/main, and shows
// its progress; a second resolve makes no request at all.
func TestPullFromEmpty(t *testing.T) {
	h := newFakeHub(t, "LiquidAI/tiny")
	cache := t.TempDir()
	c := h.client(t, cache)
	snap, err := c.Resolve(context.Background(), Ref{"LiquidAI/tiny", "main"})
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, h, snap, commitMain)
	if b, err := os.ReadFile(filepath.Join(cache, "models--LiquidAI--tiny", "refs", "main")); err != nil || string(b) != commitMain {
		t.Errorf("refs/main = %q, %v", b, err)
	}
	if p := c.Progress.(*strings.Builder).String(); !strings.Contains(p, "model.safetensors") || !strings.Contains(p, "MB") || strings.Contains(p, "\r") {
		t.Errorf("progress (not a terminal) = %q, want plain lines naming the files and their size", p)
	}
	n := len(h.requests())
	again, err := c.Resolve(context.Background(), Ref{"LiquidAI/tiny", "main"})
	if err != nil || again.Dir != snap.Dir {
		t.Fatalf("second resolve: %v, %v", again, err)
	}
	if r := h.requests()[n:]; len(r) != 0 {
		t.Errorf("the second resolve asked the hub %v; the cache has it all", r)
	}
	// A pull asks for the commit and nothing else.
	if _, err := c.Pull(context.Background(), Ref{"LiquidAI/tiny", "main"}); err != nil {
		t.Fatal(err)
	}
	if r := h.requests()[n:]; len(r) != 1 || !strings.HasPrefix(r[0], "GET /api/models/") {
		t.Errorf("a pull of a cached model asked %v, want only the revision", r)
	}
}

// TestResume: a file whose .incomplete blob holds its first half is
// finished with a Range request for the rest; a transfer that breaks off
// half-way is resumed within the same pull.
func TestResume(t *testing.T) {
	h := newFakeHub(t, "LiquidAI/tiny")
	cache := t.TempDir()
	full := h.files[commitMain+"/model.safetensors"]
	blobs := filepath.Join(cache, "models--LiquidAI--tiny", "blobs")
	os.MkdirAll(blobs, 0o755)
	half := len(full) / 2
	if err := os.WriteFile(filepath.Join(blobs, etagOf("model.safetensors", full)+".incomplete"), full[:half], 0o644); err != nil {
		t.Fatal(err)
	}
	h.cut["mimi.safetensors"] = 1
	snap, err := h.client(t, cache).Pull(context.Background(), Ref{"LiquidAI/tiny", "main"})
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, h, snap, commitMain)
	var model, mimi []string
	for _, r := range h.requests() {
		if strings.HasPrefix(r, "GET /cdn/"+commitMain+"/model.safetensors") {
			model = append(model, r)
		}
		if strings.HasPrefix(r, "GET /cdn/"+commitMain+"/mimi.safetensors") {
			mimi = append(mimi, r)
		}
	}
	if want := fmt.Sprintf("GET /cdn/%s/model.safetensors bytes=%d-", commitMain, half); len(model) != 1 || model[0] != want {
		t.Errorf("model.safetensors was fetched with %q, want %q", model, want)
	}
	if len(mimi) != 2 || !strings.Contains(mimi[1], "bytes=") {
		t.Errorf("mimi.safetensors, cut off once, was fetched with %q, want a second request with a Range", mimi)
	}
}

// TestCorruptBlob: content whose sha256 is not the linked ETag is deleted,
// is an error, and leaves neither a blob nor a snapshot file.
func TestCorruptBlob(t *testing.T) {
	h := newFakeHub(t, "LiquidAI/tiny")
	good := h.files[commitMain+"/model.safetensors"]
	bad := append([]byte(nil), good...)
	bad[len(bad)/2] ^= 1
	h.served["model.safetensors"] = bad
	cache := t.TempDir()
	_, err := h.client(t, cache).Pull(context.Background(), Ref{"LiquidAI/tiny", "main"})
	if err == nil || !strings.Contains(err.Error(), "sha256") || !strings.Contains(err.Error(), "model.safetensors") {
		t.Fatalf("pull of a corrupted file: %v, want a sha256 mismatch", err)
	}
	repo := filepath.Join(cache, "models--LiquidAI--tiny")
	blob := filepath.Join(repo, "blobs", etagOf("model.safetensors", good))
	for _, p := range []string{blob, blob + ".incomplete", filepath.Join(repo, "snapshots", commitMain, "model.safetensors"), filepath.Join(repo, "refs", "main")} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s exists after a refused download", p)
		}
	}
	if _, err := (&Client{CacheDir: cache}).Cached(Ref{"LiquidAI/tiny", "main"}); err == nil {
		t.Error("the cache serves the refused model")
	}
}

// TestGated: a gated repo without a token is a clear error naming the
// licence and HF_TOKEN; with the token it downloads, and the token goes to
// the hub but not to the CDN.
func TestGated(t *testing.T) {
	h := newFakeHub(t, "LiquidAI/tiny")
	h.token = "hf_secret"
	cache := t.TempDir()
	c := h.client(t, cache)
	_, err := c.Pull(context.Background(), Ref{"LiquidAI/tiny", "main"})
	if err == nil || !strings.Contains(err.Error(), "licence") || !strings.Contains(err.Error(), "HF_TOKEN") || !strings.Contains(err.Error(), h.srv.URL+"/LiquidAI/tiny") {
		t.Fatalf("gated pull without a token: %v", err)
	}
	c.Token = "hf_wrong"
	if _, err := c.Pull(context.Background(), Ref{"LiquidAI/tiny", "main"}); err == nil || !strings.Contains(err.Error(), "with the HF_TOKEN given") {
		t.Fatalf("gated pull with a wrong token: %v", err)
	}
	c.Token = "hf_secret"
	snap, err := c.Pull(context.Background(), Ref{"LiquidAI/tiny", "main"})
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, h, snap, commitMain)
}

// TestRevision: a tag resolves to its commit (refs/v1), a commit pins
// itself (no ref written), and an unknown revision is a clear error.
func TestRevision(t *testing.T) {
	h := newFakeHub(t, "LiquidAI/tiny")
	cache := t.TempDir()
	c := h.client(t, cache)
	snap, err := c.Resolve(context.Background(), Ref{"LiquidAI/tiny", "v1"})
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, h, snap, commitV1)
	repo := filepath.Join(cache, "models--LiquidAI--tiny")
	if b, _ := os.ReadFile(filepath.Join(repo, "refs", "v1")); string(b) != commitV1 {
		t.Errorf("refs/v1 = %q", b)
	}
	snap, err = c.Resolve(context.Background(), Ref{"LiquidAI/tiny", commitMain})
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, h, snap, commitMain)
	if refs, _ := os.ReadDir(filepath.Join(repo, "refs")); len(refs) != 1 {
		t.Errorf("refs/ holds %d refs, want v1 only", len(refs))
	}
	// Both commits share the unchanged blobs.
	if blobs, _ := filepath.Glob(filepath.Join(repo, "blobs", "*")); len(blobs) != len(modelFiles)+1 {
		t.Errorf("%d blobs, want %d (one more config)", len(blobs), len(modelFiles)+1)
	}
	if _, err := c.Resolve(context.Background(), Ref{"LiquidAI/tiny", "nope"}); err == nil || !strings.Contains(err.Error(), `no revision "nope"`) {
		t.Errorf("unknown revision: %v", err)
	}
}

// TestOffline: offline, a model not in the cache is an error that makes
// no request; one in the cache resolves without a request.
func TestOffline(t *testing.T) {
	h := newFakeHub(t, "LiquidAI/tiny")
	cache := t.TempDir()
	c := h.client(t, cache)
	c.Offline = true
	for _, f := range []func(context.Context, Ref) (*Snapshot, error){c.Resolve, c.Pull} {
		if _, err := f(context.Background(), Ref{"LiquidAI/tiny", "main"}); !errors.Is(err, ErrOffline) {
			t.Errorf("offline with an empty cache: %v, want ErrOffline", err)
		}
	}
	if r := h.requests(); len(r) != 0 {
		t.Fatalf("offline made requests %v", r)
	}
	c.Offline = false
	if _, err := c.Pull(context.Background(), Ref{"LiquidAI/tiny", "main"}); err != nil {
		t.Fatal(err)
	}
	n := len(h.requests())
	c.Offline = true
	snap, err := c.Resolve(context.Background(), Ref{"LiquidAI/tiny", "main"})
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, h, snap, commitMain)
	if r := h.requests()[n:]; len(r) != 0 {
		t.Errorf("offline made requests %v", r)
	}
}

// TestHandMadeCache: a cache laid out as huggingface_hub does (blobs,
// relative symlinks, refs/main), built by hand, is used in place with no
// request: its snapshot folder is the answer.
func TestHandMadeCache(t *testing.T) {
	cache := t.TempDir()
	repo := filepath.Join(cache, "models--LiquidAI--LFM2-Audio-1.5B")
	commit := "0123456789abcdef0123456789abcdef01234567"
	snapDir := filepath.Join(repo, "snapshots", commit)
	for _, d := range []string{filepath.Join(repo, "blobs"), filepath.Join(repo, "refs"), snapDir} {
		os.MkdirAll(d, 0o755)
	}
	for _, f := range modelFiles {
		b, err := os.ReadFile(filepath.Join(tiny, f))
		if err != nil {
			t.Fatal(err)
		}
		e := etagOf(f, b)
		os.WriteFile(filepath.Join(repo, "blobs", e), b, 0o644)
		if err := os.Symlink(filepath.Join("..", "..", "blobs", e), filepath.Join(snapDir, f)); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(repo, "refs", "main"), []byte(commit), 0o644)
	hub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("request %s %s; the cache has the model", r.Method, r.URL)
	}))
	defer hub.Close()
	c := &Client{CacheDir: cache, Endpoint: hub.URL}
	snap, err := c.Resolve(context.Background(), Ref{"LiquidAI/LFM2-Audio-1.5B", "main"})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Dir != snapDir || snap.Commit != commit {
		t.Errorf("resolved %+v, want %s", snap, snapDir)
	}
	// Half a snapshot (no codec, no weights) is not used as a model.
	c.Offline = true
	for _, f := range []string{"mimi.safetensors", "model.safetensors"} {
		os.Remove(filepath.Join(snapDir, f))
		if _, err := c.Resolve(context.Background(), Ref{"LiquidAI/LFM2-Audio-1.5B", "main"}); err == nil || !strings.Contains(err.Error(), "safetensors") {
			t.Errorf("a snapshot without %s: %v", f, err)
		}
	}
}

// TestRenamedRepo: a repo asked for by a former name follows the hub's
// relative redirects (the API's and the resolve URLs') and is cached under
// the name asked for, as huggingface_hub does.
func TestRenamedRepo(t *testing.T) {
	h := newFakeHub(t, "LiquidAI/tiny")
	h.old = "Liquid/old-tiny"
	cache := t.TempDir()
	snap, err := h.client(t, cache).Pull(context.Background(), Ref{"Liquid/old-tiny", "main"})
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, h, snap, commitMain)
	if want := filepath.Join(cache, "models--Liquid--old-tiny", "snapshots", commitMain); snap.Dir != want {
		t.Errorf("snapshot in %s, want %s", snap.Dir, want)
	}
}

// TestProgress: on a terminal one line is redrawn with the bytes, percent,
// rate and ETA; elsewhere plain lines, and the last says done.
func TestProgress(t *testing.T) {
	for _, terminal := range []bool{true, false} {
		var b strings.Builder
		p := newProgress(&b, terminal, "a/b: model.safetensors", 0, 4e6)
		p.last = p.last.Add(-time.Hour) // due for a line
		p.Write(make([]byte, 1e6))
		p.done(nil)
		out := b.String()
		if !strings.Contains(out, "1.0 MB / 4.0 MB") || !strings.Contains(out, " 25%") || !strings.Contains(out, "ETA") || !strings.Contains(out, "done") {
			t.Errorf("terminal %v: progress %q, want bytes, percent, ETA and done", terminal, out)
		}
		if got := strings.Contains(out, "\r"); got != terminal {
			t.Errorf("terminal %v: progress %q redraws: %v", terminal, out, got)
		}
		if !terminal && strings.Count(out, "\n") != 2 {
			t.Errorf("plain progress %q, want two lines", out)
		}
	}
}

// TestConcurrentPulls: two pulls of one model at once both succeed, and
// each file is downloaded once (the blob lock makes the second wait and
// then find it).
func TestConcurrentPulls(t *testing.T) {
	h := newFakeHub(t, "LiquidAI/tiny")
	cache := t.TempDir()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	snaps := make([]*Snapshot, 2)
	for i := range 2 {
		wg.Go(func() {
			c := h.client(t, cache)
			c.Progress = nil
			snaps[i], errs[i] = c.Pull(context.Background(), Ref{"LiquidAI/tiny", "main"})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("pull %d: %v", i, err)
		}
		checkSnapshot(t, h, snaps[i], commitMain)
	}
	for f, n := range h.getCounts() {
		if n != 1 {
			t.Errorf("%s downloaded %d times", f, n)
		}
	}
}

// TestConcurrentProcesses: two processes (this test binary run again)
// pulling one model into one cache both succeed, each file downloaded
// once: the blob locks are file locks, held across processes.
func TestConcurrentProcesses(t *testing.T) {
	h := newFakeHub(t, "LiquidAI/tiny")
	cache := t.TempDir()
	cmds := make([]*exec.Cmd, 2)
	for i := range cmds {
		cmds[i] = exec.Command(os.Args[0], "-test.run=^TestHelperPull$")
		cmds[i].Env = append(os.Environ(), "HUB_TEST_PULL="+cache+"|"+h.srv.URL)
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("process %d: %v", i, err)
		}
	}
	snap, err := (&Client{CacheDir: cache}).Cached(Ref{"LiquidAI/tiny", "main"})
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, h, snap, commitMain)
	for f, n := range h.getCounts() {
		if n != 1 {
			t.Errorf("%s downloaded %d times", f, n)
		}
	}
}

// TestHelperPull is TestConcurrentProcesses's other process.
func TestHelperPull(t *testing.T) {
	arg := os.Getenv("HUB_TEST_PULL")
	if arg == "" {
		t.Skip("run by TestConcurrentProcesses")
	}
	cache, endpoint, _ := strings.Cut(arg, "|")
	if _, err := (&Client{CacheDir: cache, Endpoint: endpoint}).Pull(context.Background(), Ref{"LiquidAI/tiny", "main"}); err != nil {
		t.Fatal(err)
	}
}
