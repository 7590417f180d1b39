package hub

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// attempts is how many times one file's transfer is tried, resuming each
// time from what the last one wrote.
const attempts = 3

// Resolve returns ref's snapshot: the cached one when the cache holds the
// model's files (no request is made), else one downloaded into the cache.
func (c *Client) Resolve(ctx context.Context, ref Ref) (*Snapshot, error) {
	snap, err := c.Cached(ref)
	if err == nil {
		return snap, nil
	}
	if c.Offline {
		return nil, fmt.Errorf("%w (--offline or HF_HUB_OFFLINE): %v; run `omni-pipe pull %s` with the network", ErrOffline, err, ref)
	}
	return c.Pull(ctx, ref)
}

// Pull asks the hub which commit ref's revision is, downloads the files
// the model needs that the cache lacks, and points refs/<revision> at the
// commit. Offline, it returns the cached snapshot or an error.
func (c *Client) Pull(ctx context.Context, ref Ref) (*Snapshot, error) {
	if c.Offline {
		snap, err := c.Cached(ref)
		if err != nil {
			return nil, fmt.Errorf("%w (--offline or HF_HUB_OFFLINE): %v", ErrOffline, err)
		}
		return snap, nil
	}
	info, err := c.repoInfo(ctx, ref)
	if err != nil {
		return nil, err
	}
	dir := c.repoDir(ref.Repo)
	snap := &Snapshot{Ref: ref, Commit: info.SHA, Dir: filepath.Join(dir, "snapshots", info.SHA)}
	var files []string
	for _, s := range info.Siblings {
		if wanted(s.RFilename) {
			files = append(files, s.RFilename)
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s at %s has none of the files a model needs (config.json, model.safetensors, tokenizer.json)", ref, info.SHA)
	}
	for _, f := range files {
		if err := c.file(ctx, ref, snap, f); err != nil {
			return nil, err
		}
	}
	if ref.Revision != info.SHA {
		if err := writeAtomic(filepath.Join(dir, "refs", filepath.FromSlash(ref.Revision)), []byte(info.SHA)); err != nil {
			return nil, fmt.Errorf("%s: %w", ref, err)
		}
	}
	if missing := missingFiles(snap.Dir); len(missing) > 0 {
		return nil, fmt.Errorf("%s at %s: the repo lacks %s", ref, info.SHA, strings.Join(missing, ", "))
	}
	return snap, nil
}

type repoInfo struct {
	SHA      string `json:"sha"`
	Siblings []struct {
		RFilename string `json:"rfilename"`
	} `json:"siblings"`
}

// repoInfo asks the hub for the revision's commit and file list.
func (c *Client) repoInfo(ctx context.Context, ref Ref) (*repoInfo, error) {
	u := c.Endpoint + "/api/models/" + ref.Repo + "/revision/" + url.PathEscape(ref.Revision)
	req, err := c.request(ctx, http.MethodGet, u)
	if err != nil {
		return nil, err
	}
	resp, err := c.client().Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	defer resp.Body.Close()
	if err := c.httpError(ref, "", resp); err != nil {
		return nil, err
	}
	var info repoInfo
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&info); err != nil {
		return nil, fmt.Errorf("%s: the hub's answer at %s: %w", ref, u, err)
	}
	if !commitID.MatchString(info.SHA) {
		return nil, fmt.Errorf("%s: the hub gave the commit %q", ref, info.SHA)
	}
	return &info, nil
}

func (c *Client) client() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// request builds a request to u with the token when u is on the endpoint.
func (c *Client) request(ctx context.Context, method, u string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", "omni-pipe")
	if c.Token != "" {
		if ep, err := url.Parse(c.Endpoint); err == nil && ep.Host == req.URL.Host {
			req.Header.Set("Authorization", "Bearer "+c.Token)
		}
	}
	return req, nil
}

// httpError turns a failed answer into an error that says what to do.
func (c *Client) httpError(ref Ref, file string, resp *http.Response) error {
	if resp.StatusCode < 400 {
		return nil
	}
	what := ref.String()
	if file != "" {
		what += ": " + file
	}
	code, msg := resp.Header.Get("X-Error-Code"), resp.Header.Get("X-Error-Message")
	detail := resp.Status
	if msg != "" {
		detail += ": " + msg
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden || code == "GatedRepo":
		page := c.Endpoint + "/" + ref.Repo
		if c.Token == "" {
			return fmt.Errorf("%s: access denied (%s). The repo is gated or private (or does not exist): accept its licence on %s, "+
				"then set HF_TOKEN to an access token of that account (https://huggingface.co/settings/tokens)", what, detail, page)
		}
		return fmt.Errorf("%s: access denied with the HF_TOKEN given (%s). Accept the licence on %s with the account the token belongs to, "+
			"and check that the token may read gated repos", what, detail, page)
	case resp.StatusCode == http.StatusNotFound:
		switch code {
		case "RevisionNotFound":
			return fmt.Errorf("%s: no revision %q on the hub (%s)", what, ref.Revision, detail)
		case "EntryNotFound":
			return fmt.Errorf("%s: no such file at revision %s (%s)", what, ref.Revision, detail)
		}
		return fmt.Errorf("%s: not found on %s (%s)", what, c.Endpoint, detail)
	}
	return fmt.Errorf("%s: %s", what, detail)
}

// meta is what a HEAD of a resolve URL says about one file.
type meta struct {
	etag string // the blob's name: sha256 (LFS) or git blob id
	size int64  // -1: unknown
	url  string // where to GET the content (a CDN for LFS files)
}

// head asks the hub about one file at the snapshot's commit, following
// redirects within the hub (a renamed repo) but not to a CDN: the linked
// ETag and size are on the hub's own answer.
func (c *Client) head(ctx context.Context, ref Ref, commit, file string) (*meta, error) {
	u := c.Endpoint + "/" + ref.Repo + "/resolve/" + commit + "/" + escapePath(file)
	hc := *c.client()
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for range 10 {
		req, err := c.request(ctx, http.MethodHead, u)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Accept-Encoding", "identity")
		resp, err := hc.Do(req)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", ref, file, err)
		}
		resp.Body.Close()
		if err := c.httpError(ref, file, resp); err != nil {
			return nil, err
		}
		loc := resp.Header.Get("Location")
		if resp.StatusCode >= 300 && resp.StatusCode < 400 && loc != "" {
			l, err := url.Parse(loc)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: bad redirect %q: %w", ref, file, loc, err)
			}
			if l.Host == "" && resp.Header.Get("X-Linked-Etag") == "" { // within the hub: ask again there
				u = req.URL.ResolveReference(l).String()
				continue
			}
			loc = req.URL.ResolveReference(l).String()
		} else {
			loc = u
		}
		m := &meta{etag: normEtag(resp.Header.Get("X-Linked-Etag")), size: -1, url: loc}
		if m.etag == "" {
			m.etag = normEtag(resp.Header.Get("ETag"))
		}
		size := resp.Header.Get("X-Linked-Size")
		if size == "" && resp.StatusCode < 300 {
			size = resp.Header.Get("Content-Length")
		}
		if n, err := strconv.ParseInt(size, 10, 64); err == nil && n >= 0 {
			m.size = n
		}
		if m.etag == "" || strings.ContainsAny(m.etag, `/\`) || m.etag == "." || m.etag == ".." {
			return nil, fmt.Errorf("%s: %s: the hub gave no usable ETag (%q)", ref, file, m.etag)
		}
		if rc := resp.Header.Get("X-Repo-Commit"); rc != "" && rc != commit {
			return nil, fmt.Errorf("%s: %s: asked for commit %s, the hub answered for %s", ref, file, commit, rc)
		}
		return m, nil
	}
	return nil, fmt.Errorf("%s: %s: too many redirects", ref, file)
}

func normEtag(s string) string {
	return strings.Trim(strings.TrimPrefix(strings.TrimSpace(s), "W/"), `"`)
}

func escapePath(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return strings.Join(parts, "/")
}

// file puts one repo file into the snapshot: skipped when the snapshot has
// it, linked when its blob is cached, else downloaded under the blob's
// lock, checked, and moved into place.
func (c *Client) file(ctx context.Context, ref Ref, snap *Snapshot, file string) error {
	pointer := filepath.Join(snap.Dir, filepath.FromSlash(file))
	if _, err := os.Stat(pointer); err == nil {
		return nil
	}
	m, err := c.head(ctx, ref, snap.Commit, file)
	if err != nil {
		return err
	}
	repoDir := c.repoDir(ref.Repo)
	blob := filepath.Join(repoDir, "blobs", m.etag)
	unlock, err := lock(filepath.Join(c.CacheDir, ".locks", repoFolder(ref.Repo), m.etag+".lock"))
	if err != nil {
		return fmt.Errorf("%s: %s: %w", ref, file, err)
	}
	defer unlock()
	if _, err := os.Stat(blob); err != nil {
		if err := c.download(ctx, ref, file, m, blob); err != nil {
			return err
		}
	}
	if err := link(blob, pointer); err != nil {
		return fmt.Errorf("%s: %s: %w", ref, file, err)
	}
	return nil
}

// download fetches a blob into blob.incomplete, resuming what is there,
// checks its size and (LFS) sha256, and renames it to blob.
func (c *Client) download(ctx context.Context, ref Ref, file string, m *meta, blob string) error {
	if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
		return err
	}
	part := blob + ".incomplete"
	var err error
	for try := range attempts {
		if err = c.transfer(ctx, ref, file, m, part); err == nil || ctx.Err() != nil || !retryable(err) {
			break
		}
		if c.Progress != nil {
			fmt.Fprintf(c.Progress, "%s: %s: %v; resuming (try %d of %d)\n", ref, file, err, try+2, attempts)
		}
	}
	if err != nil {
		return err
	}
	if err := verify(part, m); err != nil {
		os.Remove(part)
		return fmt.Errorf("%s: %s: %w; the download was deleted", ref, file, err)
	}
	if err := os.Rename(part, blob); err != nil {
		return fmt.Errorf("%s: %s: %w", ref, file, err)
	}
	return nil
}

// transferError is a transfer that broke off: worth resuming.
type transferError struct{ err error }

func (t transferError) Error() string { return t.err.Error() }
func (t transferError) Unwrap() error { return t.err }

func retryable(err error) bool {
	var t transferError
	return errors.As(err, &t)
}

// transfer appends to part what the server has past its current length.
func (c *Client) transfer(ctx context.Context, ref Ref, file string, m *meta, part string) error {
	f, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	have, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	if m.size >= 0 && have >= m.size {
		return nil // all there: verify decides
	}
	req, err := c.request(ctx, http.MethodGet, m.url)
	if err != nil {
		return err
	}
	req.Header.Set("Accept-Encoding", "identity")
	if have > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", have))
	}
	resp, err := c.client().Do(req)
	if err != nil {
		return transferError{fmt.Errorf("%s: %s: %w", ref, file, err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusRequestedRangeNotSatisfiable {
		if err := f.Truncate(0); err != nil {
			return err
		}
		return transferError{fmt.Errorf("%s: %s: the server refused to resume at byte %d", ref, file, have)}
	}
	if err := c.httpError(ref, file, resp); err != nil {
		return err
	}
	switch {
	case resp.StatusCode == http.StatusPartialContent && have > 0:
		if start, ok := rangeStart(resp.Header.Get("Content-Range")); !ok || start != have {
			return fmt.Errorf("%s: %s: asked for bytes from %d, got Content-Range %q", ref, file, have, resp.Header.Get("Content-Range"))
		}
	case resp.StatusCode == http.StatusOK:
		if err := f.Truncate(0); err != nil {
			return err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		have = 0
	default:
		return fmt.Errorf("%s: %s: unexpected %s", ref, file, resp.Status)
	}
	p := newProgress(c.Progress, c.Terminal, ref.String()+": "+file, have, m.size)
	n, err := io.Copy(f, io.TeeReader(resp.Body, p))
	p.done(err)
	if err != nil {
		return transferError{fmt.Errorf("%s: %s: after %d bytes: %w", ref, file, have+n, err)}
	}
	return f.Close()
}

// rangeStart parses "bytes START-END/SIZE".
func rangeStart(s string) (int64, bool) {
	s, ok := strings.CutPrefix(s, "bytes ")
	if !ok {
		return 0, false
	}
	start, _, ok := strings.Cut(s, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(start, 10, 64)
	return n, err == nil
}

// verify checks a finished download's size and, for an LFS file (its
// etag a sha256), its sha256.
func verify(part string, m *meta) error {
	f, err := os.Open(part)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return err
	}
	if m.size >= 0 && n != m.size {
		return fmt.Errorf("got %d bytes, the hub says %d", n, m.size)
	}
	if sha256ID.MatchString(m.etag) {
		if got := hex.EncodeToString(h.Sum(nil)); got != m.etag {
			return fmt.Errorf("sha256 %s does not match the hub's %s", got, m.etag)
		}
	}
	return nil
}

// link points pointer at blob with a relative symlink, as huggingface_hub
// does, made under a temporary name and renamed into place. Where symlinks
// are refused it makes a hard link instead.
func link(blob, pointer string) error {
	dir := filepath.Dir(pointer)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	rel, err := filepath.Rel(dir, blob)
	if err != nil {
		return err
	}
	tmp := pointer + ".tmp-" + rand.Text()[:8]
	if err := os.Symlink(rel, tmp); err != nil {
		if err := os.Link(blob, tmp); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, pointer); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// writeAtomic writes a file under a temporary name and renames it.
func writeAtomic(name string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	tmp := name + ".tmp-" + rand.Text()[:8]
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, name); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
