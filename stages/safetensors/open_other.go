//go:build !unix

package safetensors

import "os"

// Open reads and parses the file at path (no mmap on this platform).
func Open(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parse(data, path)
}
