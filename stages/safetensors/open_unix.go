//go:build unix

package safetensors

import (
	"fmt"
	"os"
	"syscall"
)

// Open memory-maps and parses the file at path.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	if size == 0 {
		return nil, fmt.Errorf("%s: truncated: empty file", path)
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("%s: file of %d bytes is too large to map", path, size)
	}
	data, err := syscall.Mmap(int(fd.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%s: mmap: %w", path, err)
	}
	f, err := parse(data, path)
	if err != nil {
		syscall.Munmap(data)
		return nil, err
	}
	f.closer = func() error { return syscall.Munmap(data) }
	return f, nil
}
