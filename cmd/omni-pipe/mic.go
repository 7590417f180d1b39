package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/omni-pipe/omni-pipe/audio/device"
	"github.com/omni-pipe/omni-pipe/audio/vad"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/pipeline/live"
)

func init() {
	register(&command{
		name: "mic",
		summary: `Talk to the model live: microphone in, speaker out.

Each pause in your speech ends a turn; the reply's text is printed (stdout)
and its speech played. With --barge-in on (the default), speaking over the
reply interrupts it. Needs a PulseAudio or PipeWire-Pulse server for the
microphone (docs/mic.md); --wav FILE uses a recording instead, --out FILE
writes the replies to a WAV file instead of playing them (both: the whole
conversation runs as fast as the model goes, reproducibly). With no --model
it runs the embedded demo model, whose words and speech are noise.
Ctrl-C ends the conversation.`,
		usage: "[--model DIR] [flags]",
		setup: setupMic,
	})
}

// onOff is a flag that takes on/off (or true/false).
type onOff bool

func (o *onOff) String() string {
	if *o {
		return "on"
	}
	return "off"
}

func (o *onOff) Set(s string) error {
	switch strings.ToLower(s) {
	case "on", "true", "yes", "1":
		*o = true
	case "off", "false", "no", "0":
		*o = false
	default:
		return fmt.Errorf("want on or off, not %q", s)
	}
	return nil
}

func setupMic(fs *flag.FlagSet, e *env) func([]string) error {
	var mf modelFlags
	mf.register(fs, e)
	bargeIn := onOff(true)
	fs.Var(&bargeIn, "barge-in", "on: speaking over the reply interrupts it; off: speech is ignored while the assistant talks")
	threshold := fs.Float64("vad-threshold", vad.DefaultStartDB, "speech starts this many dB above the room's noise floor (raise it in a noisy room)")
	silence := fs.Duration("vad-silence", vad.DefaultMinSilence, "the pause that ends your turn")
	guard := fs.Duration("echo-guard", live.DefaultEchoGuard, "with barge-in: speech starting this soon after a reply begins interrupts only if it goes on")
	boost := fs.Float64("playing-boost", live.DefaultPlayingBoostDB, "with barge-in: dB added to --vad-threshold while the reply plays (the speaker's echo)")
	input := fs.String("input-device", "", "PulseAudio source to record from (default: the server's default; see --list-devices)")
	output := fs.String("output-device", "", "PulseAudio sink to play on (default: the system's default output)")
	list := fs.Bool("list-devices", false, "list the PulseAudio sources and sinks, and exit")
	micRate := fs.Int("mic-rate", 16000, "recording rate in Hz (0: the input device's own rate)")
	wav := fs.String("wav", "", "use this WAV file as the microphone (demos, tests)")
	out := fs.String("out", "", "write the assistant's speech to this WAV file instead of playing it")
	realtime := fs.Bool("realtime", false, "with --wav and --out: pace the file in real time (default: as fast as the model goes, on a virtual clock)")
	system := fs.String("system", "", "system prompt (default: the official interleaved prompt)")
	greedy := fs.Bool("greedy", false, "greedy text and audio (deterministic; the official default samples audio with temperature 1, top-k 4)")
	seed := fs.Uint64("seed", 0, "sampling seed")
	maxNew := fs.Int("max-new-tokens", 512, "backbone steps per reply at most (text tokens and 80 ms audio frames)")
	temp := fs.Float64("audio-temperature", pipeline.DefaultAudio.Temperature, "audio sampling temperature")
	topK := fs.Int("audio-top-k", pipeline.DefaultAudio.TopK, "audio sampling top-k")
	return func(args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		if *list {
			sources, sinks, err := device.List("")
			if err != nil {
				return err
			}
			device.PrintList(e.stdout, sources, sinks)
			return nil
		}
		if _, err := mf.check(); err != nil {
			return err
		}
		if err := firstError(
			intIn("--max-new-tokens", *maxNew, 1, maxNewTokensLimit),
			floatIn("--audio-temperature", *temp, 0, maxTemperature),
			intIn("--audio-top-k", *topK, 0, maxTopK),
			durationIn("--vad-silence", *silence, time.Millisecond, 30*time.Second),
			durationIn("--echo-guard", *guard, time.Millisecond, 10*time.Second),
			floatIn("--playing-boost", *boost, 0.001, 60),
		); err != nil {
			return err
		}
		if *micRate != 0 && (*micRate < 8000 || *micRate > 384000) {
			return usageError{fmt.Sprintf("--mic-rate %d: want 0 (the device's rate) or 8000 to 384000", *micRate)}
		}
		// The release threshold keeps the defaults' proportion to the
		// onset's; a pause shorter than the default post-roll keeps all of it.
		vc := vad.Config{StartDB: *threshold, StopDB: *threshold * vad.DefaultStopDB / vad.DefaultStartDB, MinSilence: *silence}
		if vc.MinSilence > 0 && vc.MinSilence < vad.DefaultPostRoll {
			vc.PostRoll = vc.MinSilence
		}
		check := vc
		check.SampleRate = 16000 // the source's rate is set later
		if err := check.Validate(); err != nil {
			return usageError{fmt.Sprintf("--vad-threshold %g / --vad-silence %v: %v", *threshold, *silence, err)}
		}
		if *realtime && (*wav == "" || *out == "") {
			return usageError{"--realtime goes with --wav and --out"}
		}
		req := pipeline.Request{System: *system, MaxNewTokens: *maxNew, Seed: *seed,
			TextSampling: pipeline.DefaultText, AudioSampling: pipeline.Sampling{Temperature: *temp, TopK: *topK}}
		if *greedy {
			req.AudioSampling = pipeline.Sampling{}
		}
		if err := req.AudioSampling.Validate(); err != nil {
			return usageError{"audio sampling: " + err.Error()}
		}
		if err := checkWritable("--out", *out); err != nil {
			return err
		}

		m, dev, prec, err := mf.openOrDemo("talking to")
		if err != nil {
			return err
		}
		defer dev.Close()
		defer m.Close()
		eng := newEngine(m, dev, pipeline.Options{Precision: prec, MaxTurns: 1, Logger: mf.logger()})
		defer eng.Close()

		// The microphone.
		virtual := *wav != "" && *out != "" && !*realtime
		var src device.Source
		if *wav != "" {
			src, err = device.OpenFile(*wav, device.FileOptions{Realtime: !virtual})
		} else {
			src, err = device.OpenCapture(device.CaptureOptions{Device: *input, SampleRate: *micRate, DeviceRate: *micRate == 0})
		}
		if err != nil {
			return err
		}
		defer src.Close()

		// The loudspeaker.
		rate := m.AudioCodec().SampleRate()
		var sink device.Sink
		var rec *device.Recorder
		var player *device.Player
		if *out != "" {
			rec = device.NewRecorder(rate)
			sink = rec
		} else {
			player, err = device.OpenPlayer(device.PlayerOptions{SampleRate: rate, Device: *output})
			if err != nil {
				return err
			}
			defer player.Close()
			sink = player
		}

		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		mode := "barge-in " + bargeIn.String()
		if virtual {
			mode += ", virtual time"
		}
		fmt.Fprintf(e.stderr, "omni-pipe mic: %s on %s (%s), %s. Speak; Ctrl-C quits.\n", m.Info().Name, dev.Name(), prec, mode)
		p := &micPrinter{out: e.stdout, log: e.stderr}
		err = live.Run(ctx, live.Config{
			Engine: eng, Source: src, Sink: sink, VAD: vc, Request: req,
			BargeIn: bool(bargeIn), EchoGuard: *guard, PlayingBoostDB: *boost,
			VirtualTime: virtual, OnEvent: p.event,
		})
		p.finish()
		if errors.Is(err, context.Canceled) {
			fmt.Fprintln(e.stderr, "bye")
			err = nil
		}
		if rec != nil {
			if werr := writeWAV(*out, rec.Samples(), e.stderr); err == nil {
				err = werr
			}
		}
		return err
	}
}

// micPrinter shows the conversation: the reply's text on stdout, one line
// a turn; everything else on stderr.
type micPrinter struct {
	out, log io.Writer
	midLine  bool     // stdout has a reply line open
	notes    []string // status lines held until it closes
}

func (p *micPrinter) endLine() {
	if p.midLine {
		fmt.Fprintln(p.out)
		p.midLine = false
	}
	for _, n := range p.notes {
		fmt.Fprintln(p.log, n)
	}
	p.notes = p.notes[:0]
}

// note prints a status line, or holds it while a reply line is open.
func (p *micPrinter) note(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	if p.midLine {
		p.notes = append(p.notes, s)
		return
	}
	fmt.Fprintln(p.log, s)
}

func (p *micPrinter) event(ev live.Event) {
	switch ev.Kind {
	case live.Listening:
		fmt.Fprintln(p.log, "● listening")
	case live.SpeechEnd:
		fmt.Fprintf(p.log, "you ▸ %.1f s of speech\n", ev.Audio.Seconds())
	case live.SpeechIgnored:
		p.note("  (speech ignored: %s)", ev.Reason)
	case live.Skipped:
		p.note("  (not sent: %v)", ev.Err)
	case live.HistoryReset:
		p.note("  (the conversation outgrew the model's context: starting a new one)")
	case live.TurnStart:
		fmt.Fprint(p.log, "assistant ▸ ")
	case live.Text:
		fmt.Fprint(p.out, ev.Text)
		p.midLine = true
	case live.BargeIn:
		p.endLine()
		fmt.Fprintf(p.log, "  [interrupted after %.1f s]\n", ev.Heard.Seconds())
	case live.TurnEnd:
		p.endLine()
		tm := ev.Timings
		switch {
		case ev.Err != nil && !errors.Is(ev.Err, context.Canceled):
			fmt.Fprintf(p.log, "  (the reply failed: %v)\n", ev.Err)
		case ev.Err == nil:
			fmt.Fprintf(p.log, "  (%.1f s of speech; first audio after %d ms; real-time factor %.2f)\n",
				ev.Audio.Seconds(), tm.FirstAudio.Milliseconds(), tm.RTF)
		}
	}
}

func (p *micPrinter) finish() { p.endLine() }
