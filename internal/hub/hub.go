// Package hub resolves Hugging Face model repos by name: from the local
// Hugging Face cache as huggingface_hub lays it out, or by downloading the
// files a model needs into that same layout, so that omni-pipe and Python
// tools share one copy.
//
// The cache of a repo owner/name is <cache>/models--owner--name/ with
//
//	refs/<revision>            the commit a branch or tag pointed to
//	blobs/<etag>               the files' contents, named by their etag
//	                           (the sha256 of an LFS file, the git blob id of another)
//	snapshots/<commit>/<file>  relative symlinks into blobs/
//
// and <cache>/.locks/models--owner--name/<etag>.lock guards a blob's download.
package hub

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// DefaultEndpoint is the public hub.
const DefaultEndpoint = "https://huggingface.co"

// DefaultRevision is the revision of a repo id without "@revision".
const DefaultRevision = "main"

// ErrOffline is wrapped by the error of a resolve that needs the network
// while offline.
var ErrOffline = errors.New("offline")

// Ref is a repo id with its revision: owner/name[@revision].
type Ref struct {
	Repo     string // owner/name
	Revision string // a branch, tag or commit; "main" when not given
}

func (r Ref) String() string {
	if r.Revision == DefaultRevision {
		return r.Repo
	}
	return r.Repo + "@" + r.Revision
}

var (
	repoPart = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	commitID = regexp.MustCompile(`^[0-9a-f]{40}$`)
	sha256ID = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// ParseRef parses owner/name[@revision]. It does not look at the disk: a
// caller that takes a folder or a repo id checks for the folder first.
func ParseRef(s string) (Ref, error) {
	repo, rev, hasRev := strings.Cut(s, "@")
	owner, name, ok := strings.Cut(repo, "/")
	if !ok || strings.Contains(name, "/") {
		return Ref{}, fmt.Errorf("%q is not a repo id owner/name[@revision]", s)
	}
	for _, p := range []string{owner, name} {
		if len(p) > 96 || !repoPart.MatchString(p) || strings.Contains(p, "--") || strings.Contains(p, "..") || strings.HasSuffix(p, ".") {
			return Ref{}, fmt.Errorf("%q is not a repo id owner/name[@revision]: bad part %q", s, p)
		}
	}
	if !hasRev {
		rev = DefaultRevision
	}
	if rev == "" || strings.Contains(rev, "..") || strings.HasPrefix(rev, "/") || strings.HasSuffix(rev, "/") || strings.ContainsAny(rev, "\\\x00") {
		return Ref{}, fmt.Errorf("%q: bad revision %q", s, rev)
	}
	return Ref{Repo: repo, Revision: rev}, nil
}

// Snapshot is a repo's files at one commit, in the cache.
type Snapshot struct {
	Ref    Ref
	Commit string
	Dir    string // <cache>/models--owner--name/snapshots/<commit>
}

// Client finds and downloads repos. Its zero value is not usable: build it
// with FromEnv or fill in at least CacheDir and Endpoint.
type Client struct {
	CacheDir string       // the hub cache: $HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub
	Endpoint string       // the hub's base URL, without a trailing slash
	Token    string       // sent as a Bearer token to the endpoint; empty: none
	Offline  bool         // never touch the network
	HTTP     *http.Client // nil: http.DefaultClient's transport
	// Progress receives the download progress; nil: none. Terminal says
	// it is a terminal (one line redrawn) rather than a log (plain lines).
	Progress io.Writer
	Terminal bool
}

// FromEnv builds a client as huggingface_hub configures itself:
// HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME, HF_ENDPOINT, HF_TOKEN (else
// the token file $HF_TOKEN_PATH or $HF_HOME/token that `hf auth login`
// writes) and HF_HUB_OFFLINE.
func FromEnv(getenv func(string) string) *Client {
	home := getenv("HF_HOME")
	if home == "" {
		cache := getenv("XDG_CACHE_HOME")
		if cache == "" {
			h := getenv("HOME")
			if h == "" {
				h, _ = os.UserHomeDir()
			}
			cache = filepath.Join(h, ".cache")
		}
		home = filepath.Join(cache, "huggingface")
	}
	c := &Client{CacheDir: getenv("HF_HUB_CACHE"), Endpoint: getenv("HF_ENDPOINT"), Token: strings.TrimSpace(getenv("HF_TOKEN"))}
	if c.CacheDir == "" {
		c.CacheDir = filepath.Join(home, "hub")
	}
	if c.Endpoint == "" {
		c.Endpoint = DefaultEndpoint
	}
	c.Endpoint = strings.TrimRight(c.Endpoint, "/")
	if c.Token == "" {
		p := getenv("HF_TOKEN_PATH")
		if p == "" {
			p = filepath.Join(home, "token")
		}
		if b, err := os.ReadFile(p); err == nil {
			c.Token = strings.TrimSpace(string(b))
		}
	}
	switch strings.ToUpper(strings.TrimSpace(getenv("HF_HUB_OFFLINE"))) {
	case "1", "ON", "YES", "TRUE":
		c.Offline = true
	}
	return c
}

// repoDir is the repo's folder in the cache.
func (c *Client) repoDir(repo string) string {
	return filepath.Join(c.CacheDir, repoFolder(repo))
}

func repoFolder(repo string) string {
	return "models--" + strings.ReplaceAll(repo, "/", "--")
}

// Cached returns the snapshot of ref in the cache when it holds the files
// a model needs, without touching the network.
func (c *Client) Cached(ref Ref) (*Snapshot, error) {
	dir := c.repoDir(ref.Repo)
	commit := ref.Revision
	if !commitID.MatchString(commit) {
		b, err := os.ReadFile(filepath.Join(dir, "refs", filepath.FromSlash(ref.Revision)))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s is not in the cache %s (no ref %s)", ref, c.CacheDir, ref.Revision)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: the cache's ref: %w", ref, err)
		}
		commit = strings.TrimSpace(string(b))
		if !commitID.MatchString(commit) {
			return nil, fmt.Errorf("%s: the cache's ref %s holds %q, not a commit", ref, ref.Revision, commit)
		}
	}
	snap := &Snapshot{Ref: ref, Commit: commit, Dir: filepath.Join(dir, "snapshots", commit)}
	if missing := missingFiles(snap.Dir); len(missing) > 0 {
		return nil, fmt.Errorf("%s: the cached snapshot %s lacks %s", ref, snap.Dir, strings.Join(missing, ", "))
	}
	return snap, nil
}

// missingFiles lists the files a model folder lacks: config.json,
// tokenizer.json, the codec's weights (tokenizer-*.safetensors or
// mimi.safetensors, or LFM2.5-Audio's audio_detokenizer config and
// weights) and the weights (model.safetensors, or the index and
// every shard it names).
func missingFiles(dir string) []string {
	var missing []string
	has := func(name string) bool {
		_, err := os.Stat(filepath.Join(dir, filepath.FromSlash(name)))
		return err == nil
	}
	for _, n := range []string{"config.json", "tokenizer.json"} {
		if !has(n) {
			missing = append(missing, n)
		}
	}
	// An LFM2.5-Audio folder decodes with its audio_detokenizer (its
	// Mimi file is optional); a partial detokenizer folder is a download
	// cut short.
	detok := []string{"audio_detokenizer/config.json", "audio_detokenizer/model.safetensors"}
	if has(detok[0]) || has(detok[1]) {
		for _, n := range detok {
			if !has(n) {
				missing = append(missing, n)
			}
		}
	} else if codecs, _ := filepath.Glob(filepath.Join(dir, "tokenizer-*.safetensors")); len(codecs) == 0 && !has("mimi.safetensors") {
		missing = append(missing, "the codec's weights (tokenizer-*.safetensors)")
	}
	if has("model.safetensors") {
		return missing
	}
	const index = "model.safetensors.index.json"
	b, err := os.ReadFile(filepath.Join(dir, index))
	if err != nil {
		return append(missing, "model.safetensors")
	}
	shards, err := indexShards(b)
	if err != nil {
		return append(missing, index+" ("+err.Error()+")")
	}
	for _, s := range shards {
		if !has(s) {
			missing = append(missing, s)
		}
	}
	return missing
}

// indexShards returns the shard files a safetensors index names.
func indexShards(b []byte) ([]string, error) {
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, f := range idx.WeightMap {
		if !seen[f] && wanted(f) {
			seen[f] = true
			out = append(out, f)
		}
	}
	return out, nil
}

// wanted says whether a repo file is one the model needs: the config, the
// weights (one file, or shards and their index), the tokenizer files, the
// codec's weights and config, and the audio_detokenizer folder.
func wanted(name string) bool {
	switch name {
	case "config.json", "generation_config.json",
		"model.safetensors", "model.safetensors.index.json",
		"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
		"mimi.safetensors", "mimi_config.json":
		return true
	}
	if strings.HasPrefix(name, "audio_detokenizer/") && !strings.Contains(name, "..") {
		return true
	}
	for _, pat := range []string{"model-*-of-*.safetensors", "tokenizer-*.safetensors"} {
		if ok, _ := path.Match(pat, name); ok {
			return true
		}
	}
	return false
}
