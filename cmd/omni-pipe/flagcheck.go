package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Ranges shared by several commands.
const (
	// maxNewTokensLimit is the engine's context: a turn's steps cannot
	// exceed it (pipeline.Options.MaxContext's default, 32768 positions).
	maxNewTokensLimit = 32768
	// maxTextBytesLimit bounds serve's --max-text-bytes: 16 MiB, 512 bytes
	// for each of the context's positions (text takes 3 to 5 bytes a
	// token), far more than can be answered; the bound keeps a typo from
	// letting requests make the server tokenize gigabytes.
	maxTextBytesLimit = 16 << 20
	// maxTopK and maxTemperature bound audio sampling. A top-k at or above
	// a codebook's vocabulary (the codec's codebook size and end-of-audio:
	// 2049 entries in the released models, read from the checkpoint at
	// load) keeps every entry, so the bound only refuses absurd values
	// before the model loads: 2^20 + 1, the vocabulary of the largest
	// codebooks stages/mimi accepts. pipeline.Sampling refuses
	// temperatures above 100.
	maxTopK        = 1<<20 + 1
	maxTemperature = 100
)

// intIn is a usage error unless lo ≤ v ≤ hi.
func intIn(flag string, v, lo, hi int) error {
	if v < lo || v > hi {
		return usageError{fmt.Sprintf("%s %d: want %d to %d", flag, v, lo, hi)}
	}
	return nil
}

// durationIn is a usage error unless lo ≤ v ≤ hi.
func durationIn(flag string, v, lo, hi time.Duration) error {
	if v < lo || v > hi {
		return usageError{fmt.Sprintf("%s %v: want %s to %s", flag, v, shortDuration(lo), shortDuration(hi))}
	}
	return nil
}

// floatIn is a usage error unless v is a number with lo ≤ v ≤ hi.
func floatIn(flag string, v, lo, hi float64) error {
	if math.IsNaN(v) || v < lo || v > hi {
		return usageError{fmt.Sprintf("%s %v: want %v to %v", flag, v, lo, hi)}
	}
	return nil
}

// firstError returns the first non-nil error.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// shortDuration writes d without zero units: 168h, 1m, 1h30m (Duration's
// String writes 168h0m0s).
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// checkWritable reports, before any work, whether a file can be created at
// path (the flag names it in the error): its folder must exist and take new
// files, and path must not be a folder. The probe file it creates is
// removed; an existing file at path is left as it is.
func checkWritable(flag, path string) error {
	if path == "" {
		return nil
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("%s %s: is a folder", flag, path)
	}
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	switch {
	case os.IsNotExist(err):
		return fmt.Errorf("%s %s: folder %s does not exist", flag, path, dir)
	case err != nil:
		return fmt.Errorf("%s %s: %w", flag, path, err)
	case !st.IsDir():
		return fmt.Errorf("%s %s: %s is not a folder", flag, path, dir)
	}
	probe, err := os.CreateTemp(dir, "."+filepath.Base(path)+".probe-*")
	if err != nil {
		return fmt.Errorf("%s %s: cannot create files in %s: %w", flag, path, dir, unwrapPath(err))
	}
	name := probe.Name()
	probe.Close()
	return os.Remove(name)
}

// unwrapPath drops a *PathError's operation and path (the probe's name
// would only confuse).
func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}
