package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRepositoryStandsAlone: no source file, script or document points to
// files outside the repository (the team's working notes a checkout does
// not have): each fact is stated with its public source instead. The
// patterns are built from parts so that this file does not match them.
func TestRepositoryStandsAlone(t *testing.T) {
	patterns := []string{
		".." + "/shared", "shared" + "/reference", "shared" + "/spec", "shared" + "/fixtures",
		"field" + ".md", "design" + ".md", "go-stack" + ".md", "pytorch" + "-h200",
	}
	// pending lists files whose references are being rewritten elsewhere;
	// an entry that no longer matches fails, so the list only shrinks.
	pending := map[string]bool{}
	text := map[string]bool{".go": true, ".md": true, ".sh": true, ".py": true, ".txt": true, ".json": true,
		".yaml": true, ".yml": true, ".toml": true, ".cu": true, ".c": true, ".h": true, ".mod": true}
	root := filepath.Join("..", "..")
	scanned := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			// Not the repository's own files: git's, installed npm
			// packages (scripts/test.sh), build and device outputs.
			switch d.Name() {
			case ".git", "node_modules", ".device-out":
				return filepath.SkipDir
			}
			if rel == "devbin" || rel == "bin" {
				return filepath.SkipDir
			}
			return nil
		}
		if !text[filepath.Ext(rel)] && !strings.HasPrefix(rel, ".ci/") {
			return nil
		}
		info, err := d.Info()
		if err != nil || info.Size() > 4<<20 {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		scanned++
		var hits []string
		for i, line := range strings.Split(string(data), "\n") {
			for _, p := range patterns {
				if strings.Contains(line, p) {
					hits = append(hits, fmt.Sprintf("%d: %.200s", i+1, strings.TrimSpace(line)))
					break
				}
			}
		}
		switch {
		case pending[rel] && len(hits) == 0:
			t.Errorf("%s no longer points outside the repository: remove it from pending", rel)
		case !pending[rel]:
			for _, h := range hits {
				t.Errorf("%s:%s: points outside the repository", rel, h)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if scanned < 50 {
		t.Errorf("scanned %d files: is the repository root %s?", scanned, root)
	}
}
