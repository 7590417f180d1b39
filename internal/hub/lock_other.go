//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package hub

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// lock makes the file name exclusively, waiting while another holder has
// it; unlock removes it.
func lock(name string) (unlock func(), err error) {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return nil, err
	}
	for {
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			f.Close()
			return func() { os.Remove(name) }, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
