//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package hub

import (
	"os"
	"path/filepath"
	"syscall"
)

// lock takes an exclusive advisory lock on the file name (made if need
// be), waiting for another process or goroutine that holds it. The kernel
// drops the lock of a process that dies.
func lock(name string) (unlock func(), err error) {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, &os.PathError{Op: "flock", Path: name, Err: err}
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
