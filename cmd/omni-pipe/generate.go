package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"time"

	"github.com/omni-pipe/omni-pipe/audio"
	"github.com/omni-pipe/omni-pipe/internal/parity"
	"github.com/omni-pipe/omni-pipe/internal/refcase"
	"github.com/omni-pipe/omni-pipe/pipeline"
	"github.com/omni-pipe/omni-pipe/stages/family"
)

func init() {
	register(&command{
		name: "generate",
		summary: `Run one turn from a WAV or text: print the text as it streams, write the reply WAV, print the timings.
With --dump, write every intermediate (reference tensor names) to a safetensors file; with --teacher,
replay a recorded reference case teacher-forced instead. With no --model it runs the embedded demo
model, whose words and speech are noise.`,
		usage: "[--model DIR] (--wav FILE | --text STR | --teacher REF.safetensors) [flags]",
		setup: setupGenerate,
	})
}

func setupGenerate(fs *flag.FlagSet, e *env) func([]string) error {
	var mf modelFlags
	mf.register(fs, e)
	wav := fs.String("wav", "", "the user's speech (WAV: PCM 8-32 bit or float, any rate, any channels)")
	text := fs.String("text", "", "the user's text (after the speech when both are given)")
	system := fs.String("system", "", "system prompt (default: the mode's official prompt)")
	mode := fs.String("mode", "interleaved", "interleaved (speech to speech) or sequential (ASR/TTS)")
	voice := fs.String("voice", "", "text to speech in one of the model family's voices; LFM2.5-Audio's: us_male, us_female, uk_male or uk_female "+
		"(its system prompt, e.g. \"Perform TTS. Use the US male voice.\", unless --system is given; implies --mode sequential)")
	out := fs.String("out", "reply.wav", "where to write the reply speech (24 kHz 16-bit WAV); empty: don't")
	greedy := fs.Bool("greedy", false, "greedy text and audio (deterministic; the official default samples audio with temperature 1, top-k 4)")
	seed := fs.Uint64("seed", 0, "sampling seed (the same seed gives the same reply)")
	maxNew := fs.Int("max-new-tokens", 512, "backbone steps at most (text tokens and audio frames)")
	temp := fs.Float64("audio-temperature", pipeline.DefaultAudio.Temperature, "audio sampling temperature")
	topK := fs.Int("audio-top-k", pipeline.DefaultAudio.TopK, "audio sampling top-k")
	dump := fs.String("dump", "", "write every intermediate to this safetensors file")
	teacherRef := fs.String("teacher", "", "replay this reference case teacher-forced (its conversation and trace)")
	return func(args []string) error {
		if err := noArgs(args); err != nil {
			return err
		}
		if *teacherRef == "" && *wav == "" && *text == "" {
			return usageError{"one of --wav, --text or --teacher is required"}
		}
		if *teacherRef != "" && mf.dir == "" {
			return usageError{"--teacher needs --model: a reference case replays on the model that recorded it"}
		}
		if _, err := mf.check(); err != nil {
			return err
		}
		audioSampling := pipeline.Sampling{Temperature: *temp, TopK: *topK}
		if *greedy {
			audioSampling = pipeline.Sampling{}
		}
		if err := firstError(
			intIn("--max-new-tokens", *maxNew, 1, maxNewTokensLimit),
			floatIn("--audio-temperature", *temp, 0, maxTemperature),
			intIn("--audio-top-k", *topK, 0, maxTopK),
		); err != nil {
			return err
		}
		var reqMode pipeline.Mode
		switch *mode {
		case "interleaved":
			reqMode = pipeline.Interleaved
		case "sequential":
			reqMode = pipeline.Sequential
		default:
			return usageError{fmt.Sprintf("--mode %q: want interleaved or sequential", *mode)}
		}
		// A reply is only written after the whole turn: find out now
		// whether it can be.
		if err := firstError(checkWritable("--out", *out), checkWritable("--dump", *dump)); err != nil {
			return err
		}
		m, dev, prec, err := mf.openOrDemo("running")
		if err != nil {
			return err
		}
		defer dev.Close()
		defer m.Close()
		sys := *system
		if *voice != "" {
			tmpl := m.Template()
			p, ok := family.VoicePrompt(tmpl, *voice)
			if !ok {
				if len(tmpl.Voices()) == 0 {
					return usageError{fmt.Sprintf("--voice %q: %s has no preset voices (give the TTS prompt with --system and --mode sequential)", *voice, m.Info().Family)}
				}
				return usageError{fmt.Sprintf("--voice %q: want %s", *voice, orList(family.VoiceNames(tmpl)))}
			}
			if sys == "" {
				sys = p
			}
			reqMode = pipeline.Sequential
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		defer stop()

		if *teacherRef != "" {
			ref, err := refcase.Open(*teacherRef)
			if err != nil {
				return err
			}
			defer ref.Close()
			lm, err := lfm2audioModel(m, "--teacher")
			if err != nil {
				return err
			}
			rec, err := parity.Replay(ctx, lm, dev, ref, prec)
			if err != nil {
				return err
			}
			if *dump != "" {
				if err := rec.WriteFile(*dump, map[string]string{"teacher": *teacherRef, "precision": prec.String()}); err != nil {
					return err
				}
				fmt.Fprintf(e.stderr, "dump: %s\n", *dump)
			}
			if *out != "" {
				pcm, _, _ := rec.Floats("wav_mimi_stream")
				return writeWAV(*out, pcm, e.stderr)
			}
			return nil
		}

		req := pipeline.Request{Text: *text, System: sys, Mode: reqMode, MaxNewTokens: *maxNew, Seed: *seed,
			TextSampling: pipeline.DefaultText, AudioSampling: audioSampling}
		if *wav != "" {
			f, err := os.Open(*wav)
			if err != nil {
				return err
			}
			req.Audio, err = audio.Decode(f, audio.DecodeOptions{})
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", *wav, err)
			}
		}
		if *dump != "" {
			req.Record = pipeline.NewRecorder()
		}
		eng := newEngine(m, dev, pipeline.Options{Precision: prec, MaxTurns: 1, Logger: mf.logger()})
		defer eng.Close()
		sess := eng.NewSession()
		defer sess.Close()
		st, err := eng.Start(ctx, sess, req)
		if err != nil {
			return err
		}
		var pcm []float32
		var done *pipeline.DoneEvent
		for ev := range st.Events {
			switch ev := ev.(type) {
			case *pipeline.TextEvent:
				fmt.Fprint(e.stdout, ev.Delta)
			case *pipeline.AudioEvent:
				pcm = append(pcm, ev.Samples...)
			case *pipeline.DoneEvent:
				done = ev
			case *pipeline.ErrorEvent:
				fmt.Fprintln(e.stdout)
				printTimings(e.stderr, ev.Timings)
				return ev.Err
			}
		}
		fmt.Fprintln(e.stdout)
		printTimings(e.stderr, done.Timings)
		fmt.Fprintf(e.stderr, "stop: %v\n", done.Stop)
		if *dump != "" {
			md := map[string]string{"system": *system, "precision": prec.String(), "model": m.Info().Name}
			if err := req.Record.WriteFile(*dump, md); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "dump: %s\n", *dump)
		}
		if *out != "" {
			return writeWAV(*out, pcm, e.stderr)
		}
		return nil
	}
}

func writeWAV(path string, pcm []float32, log io.Writer) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := audio.WriteWAV(f, 24000, pcm); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(log, "wrote %s: %d samples (%.2f s at 24 kHz)\n", path, len(pcm), float64(len(pcm))/24000)
	return nil
}

func printTimings(w io.Writer, t pipeline.Timings) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	fmt.Fprintf(w, "prompt %d rows, prefill %s, first text %s, first audio %s, total %s\n",
		t.PromptRows, ms(t.Prefill), ms(t.FirstText), ms(t.FirstAudio), ms(t.Total))
	fmt.Fprintf(w, "%d steps: %d tokens, %d frames, %.2f s of audio, real-time factor %.3f\n",
		t.Steps, t.Tokens, t.Frames, t.AudioSeconds, t.RTF)
	stages := make([]string, 0, len(t.Busy))
	for s := range t.Busy {
		stages = append(stages, s)
	}
	sort.Strings(stages)
	var b strings.Builder
	for _, s := range stages {
		fmt.Fprintf(&b, " %s %s", s, ms(t.Busy[s]))
	}
	fmt.Fprintf(w, "busy:%s\n", b.String())
}
