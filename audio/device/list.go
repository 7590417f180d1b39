package device

import (
	"fmt"
	"io"

	"github.com/jfreymuth/pulse"
)

// Info describes a PulseAudio source (input) or sink (output).
type Info struct {
	Name        string // the id to pass as a Device option
	Description string // human-readable
	SampleRate  int
	Channels    int
	Default     bool // the server's default
}

// List returns the PulseAudio server's sources and sinks. server is a
// PulseAudio server string; empty: $PULSE_SERVER, then the user's runtime
// socket.
func List(server string) (sources, sinks []Info, err error) {
	c, err := pulse.NewClient(pulse.ClientApplicationName("omni-pipe"), pulse.ClientServerString(server))
	if err != nil {
		return nil, nil, noServer("connect to PulseAudio", err)
	}
	defer c.Close()
	srcs, err := c.ListSources()
	if err != nil {
		return nil, nil, fmt.Errorf("list PulseAudio sources: %w", err)
	}
	snks, err := c.ListSinks()
	if err != nil {
		return nil, nil, fmt.Errorf("list PulseAudio sinks: %w", err)
	}
	var defSrc, defSink string
	if s, err := c.DefaultSource(); err == nil {
		defSrc = s.ID()
	}
	if s, err := c.DefaultSink(); err == nil {
		defSink = s.ID()
	}
	for _, s := range srcs {
		sources = append(sources, Info{Name: s.ID(), Description: s.Name(), SampleRate: s.SampleRate(),
			Channels: len(s.Channels()), Default: s.ID() == defSrc})
	}
	for _, s := range snks {
		sinks = append(sinks, Info{Name: s.ID(), Description: s.Name(), SampleRate: s.SampleRate(),
			Channels: len(s.Channels()), Default: s.ID() == defSink})
	}
	return sources, sinks, nil
}

// PrintList writes sources and sinks as List returns them, one a line.
func PrintList(w io.Writer, sources, sinks []Info) {
	section := func(title string, infos []Info) {
		fmt.Fprintf(w, "%s:\n", title)
		if len(infos) == 0 {
			fmt.Fprintf(w, "  (none)\n")
		}
		for _, i := range infos {
			mark := " "
			if i.Default {
				mark = "*"
			}
			fmt.Fprintf(w, "%s %s\n    %s, %d Hz, %d channel(s)\n", mark, i.Name, i.Description, i.SampleRate, i.Channels)
		}
	}
	section("input devices (--input-device; * default)", sources)
	section("output devices (--output-device; * default)", sinks)
}
