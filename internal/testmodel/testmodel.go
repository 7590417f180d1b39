// Package testmodel builds the tiny model folders that tests across the
// repository share, from the fixtures in testdata/ (made with the official
// code; see each fixture's README.md).
package testmodel

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Root returns the repository's root directory, found from this source
// file's location (tests run from their package's directory).
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// LFM2AudioTiny returns testdata/lfm2-audio-tiny: the tiny LFM2-Audio
// checkpoint folder.
func LFM2AudioTiny() string { return filepath.Join(Root(), "testdata", "lfm2-audio-tiny") }

// LFM25DetokTiny returns testdata/lfm25-detok-tiny: the tiny LFM2.5
// detokenizer fixture.
func LFM25DetokTiny() string { return filepath.Join(Root(), "testdata", "lfm25-detok-tiny") }

// LFM25Tiny builds a tiny LFM2.5-Audio folder in t's temporary directory:
// the LFM2-Audio tiny fixture's files (Mimi's only when withMimi) and the
// detokenizer fixture as audio_detokenizer/, all symlinks.
func LFM25Tiny(t testing.TB, withMimi bool) string {
	t.Helper()
	dir := t.TempDir()
	link := func(src, dst string) {
		abs, err := filepath.Abs(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(abs, dst); err != nil {
			t.Fatal(err)
		}
	}
	tiny := LFM2AudioTiny()
	entries, err := os.ReadDir(tiny)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !withMimi && strings.HasPrefix(e.Name(), "mimi") {
			continue
		}
		link(filepath.Join(tiny, e.Name()), filepath.Join(dir, e.Name()))
	}
	link(filepath.Join(LFM25DetokTiny(), "audio_detokenizer"), filepath.Join(dir, "audio_detokenizer"))
	return dir
}
