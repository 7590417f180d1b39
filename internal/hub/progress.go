package hub

import (
	"fmt"
	"io"
	"time"
)

// progress reports one file's transfer: on a terminal one line redrawn a
// few times a second, else a plain line every few seconds and at the end.
type progress struct {
	w        io.Writer
	terminal bool
	name     string
	start    time.Time
	from     int64 // bytes there before this transfer
	n        int64 // bytes there now
	size     int64 // -1: unknown
	last     time.Time
}

func newProgress(w io.Writer, terminal bool, name string, from, size int64) *progress {
	now := time.Now()
	return &progress{w: w, terminal: terminal, name: name, start: now, from: from, n: from, size: size, last: now}
}

func (p *progress) Write(b []byte) (int, error) {
	p.n += int64(len(b))
	if p.w == nil {
		return len(b), nil
	}
	every := 5 * time.Second
	if p.terminal {
		every = 200 * time.Millisecond
	}
	if now := time.Now(); now.Sub(p.last) >= every {
		p.last = now
		p.line(false)
	}
	return len(b), nil
}

// done writes the last line; err is the transfer's end.
func (p *progress) done(err error) {
	if p.w == nil {
		return
	}
	if err != nil {
		p.line(false)
		if p.terminal {
			fmt.Fprintln(p.w)
		}
		return
	}
	p.line(true)
}

func (p *progress) line(end bool) {
	el := time.Since(p.start).Seconds()
	rate := 0.0
	if el > 0 {
		rate = float64(p.n-p.from) / el
	}
	var s string
	switch {
	case end:
		s = fmt.Sprintf("%s  %s  done in %.1fs (%s/s)", p.name, mb(p.n), el, mb(int64(rate)))
	case p.size > 0:
		eta := "?"
		if rate > 0 {
			eta = (time.Duration(float64(p.size-p.n)/rate) * time.Second).Round(time.Second).String()
		}
		s = fmt.Sprintf("%s  %s / %s  %3.0f%%  %s/s  ETA %s", p.name, mb(p.n), mb(p.size), 100*float64(p.n)/float64(p.size), mb(int64(rate)), eta)
	default:
		s = fmt.Sprintf("%s  %s  %s/s", p.name, mb(p.n), mb(int64(rate)))
	}
	if p.terminal {
		fmt.Fprintf(p.w, "\r\x1b[K%s", s)
		if end {
			fmt.Fprintln(p.w)
		}
		return
	}
	fmt.Fprintln(p.w, s)
}

// mb spells a byte count in MB (10^6) with one decimal, or in kB below.
func mb(n int64) string {
	if n < 1e6 {
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%.1f MB", float64(n)/1e6)
}
