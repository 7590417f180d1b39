package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/devices"
	"github.com/omni-pipe/omni-pipe/internal/demomodel"
	"github.com/omni-pipe/omni-pipe/internal/hub"
	"github.com/omni-pipe/omni-pipe/stages/family"
	// The families omni-pipe runs register with stages/family.
	"github.com/omni-pipe/omni-pipe/stages/lfm2audio"
	"github.com/omni-pipe/omni-pipe/stages/nn"
)

// modelFlags are the flags every command that runs the model shares.
type modelFlags struct {
	dir       string
	device    string
	threads   int
	precision string
	noMmap    bool
	offline   bool
	codec     string

	stderr io.Writer    // where the demo model's warning and download progress go
	log    *slog.Logger // where the device choice is logged; nil: text on stderr
	getenv func(string) string
	// source is the hub snapshot --model came from when it named a repo;
	// nil for a folder.
	source *hub.Snapshot
}

func (f *modelFlags) register(fs *flag.FlagSet, e *env) {
	f.stderr, f.getenv = e.stderr, e.getenv
	fs.StringVar(&f.dir, "model", e.getenv("OMNIPIPE_MODEL"), "checkpoint folder (config.json, model.safetensors, tokenizer.json, codec weights), "+
		"or a Hugging Face repo id owner/name[@revision], taken from the Hugging Face cache or downloaded into it; env OMNIPIPE_MODEL")
	fs.BoolVar(&f.offline, "offline", false, "never touch the network: a --model repo id must be in the Hugging Face cache (as HF_HUB_OFFLINE=1)")
	fs.StringVar(&f.device, "device", envOr(e, "OMNIPIPE_DEVICE", "cpu"), "compute device: "+
		"cpu, cuda (an NVIDIA GPU; fails without one) or auto (cuda when a GPU is usable, else cpu); env OMNIPIPE_DEVICE")
	fs.IntVar(&f.threads, "threads", 0, fmt.Sprintf("CPU worker threads, at most the machine's %d cores (0: one per core)", runtime.NumCPU()))
	fs.StringVar(&f.precision, "precision", "bf16", "activation rounding: bf16 (reproduces the official bf16 inference) or f32")
	fs.StringVar(&f.codec, "codec", "", "audio codec when the folder has both: mimi (LFM2-Audio's) or detokenizer (LFM2.5-Audio's audio_detokenizer/); "+
		"default: the detokenizer when the folder has one, else mimi")
	fs.BoolVar(&f.noMmap, "no-mmap", e.getenv("OMNIPIPE_NO_MMAP") != "", "read the weights into memory instead of mapping the files (for hosts whose memory reclaimer pages out cold mapped files; see docs/performance.md); env OMNIPIPE_NO_MMAP")
}

func envOr(e *env, key, def string) string {
	if v := e.getenv(key); v != "" {
		return v
	}
	return def
}

// check validates the device, threads and precision flags.
func (f *modelFlags) check() (nn.Precision, error) {
	p, err := nn.ParsePrecision(f.precision)
	if err != nil {
		return 0, usageError{"--precision: " + err.Error()}
	}
	if !slices.Contains(devices.Kinds, f.device) {
		return 0, usageError{fmt.Sprintf("--device %q: want %s", f.device, orList(devices.Kinds))}
	}
	if err := intIn("--threads", f.threads, 0, runtime.NumCPU()); err != nil {
		return 0, err
	}
	if f.codec != "" && !slices.Contains(lfm2audio.Codecs, f.codec) {
		return 0, usageError{fmt.Sprintf("--codec %q: want %s", f.codec, orList(lfm2audio.Codecs))}
	}
	return p, nil
}

// orList spells a list as "a, b or c".
func orList(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// logger returns the logger the device choice goes to.
func (f *modelFlags) logger() *slog.Logger {
	if f.log != nil {
		return f.log
	}
	return slog.New(slog.NewTextHandler(f.stderr, nil))
}

// openDevice opens --device and logs which device it is (and, for auto,
// why CUDA was not taken).
func (f *modelFlags) openDevice() (gpu.Device, error) {
	dev, note, err := devices.Open(f.device, devices.Options{Threads: f.threads, Log: f.logger()})
	if err != nil {
		if f.device == "cuda" {
			return nil, fmt.Errorf("--device cuda: %w (--device cpu runs without a GPU; auto takes one when there is one)", err)
		}
		return nil, fmt.Errorf("--device %s: %w", f.device, err)
	}
	info := gpu.DescribeDevice(dev)
	attrs := []any{"asked", f.device, "kind", info.Kind, "name", info.Name}
	if info.Driver != "" {
		attrs = append(attrs, "driver", info.Driver)
	}
	if info.MemTotal > 0 {
		attrs = append(attrs, "mem_total_gib", fmt.Sprintf("%.1f", float64(info.MemTotal)/(1<<30)))
	}
	if note != "" {
		attrs = append(attrs, "note", note)
	}
	f.logger().Info("device", attrs...)
	return dev, nil
}

// open loads the --model folder onto --device; --model is required.
func (f *modelFlags) open() (family.Model, gpu.Device, nn.Precision, error) {
	if f.dir == "" {
		return nil, nil, 0, usageError{"--model DIR is required"}
	}
	dir, err := f.resolve()
	if err != nil {
		return nil, nil, 0, err
	}
	return f.openDir(dir)
}

// resolve returns the folder --model names: the folder itself, or for a
// repo id owner/name[@revision] that is not a folder here, its snapshot in
// the Hugging Face cache, downloaded first when the cache lacks it.
func (f *modelFlags) resolve() (string, error) {
	dir, snap, err := resolveModel(f.dir, f.getenv, f.offline, f.stderr)
	f.source = snap
	return dir, err
}

// resolveModel resolves a --model value (see modelFlags.resolve) with the
// HF_* environment, progress going to stderr.
func resolveModel(model string, getenv func(string) string, offline bool, stderr io.Writer) (string, *hub.Snapshot, error) {
	if _, err := os.Stat(model); err == nil {
		return model, nil, nil
	}
	ref, err := hub.ParseRef(model)
	if err != nil {
		return model, nil, nil // not a repo id: the loader says the folder is missing
	}
	snap, err := newHubClient(getenv, offline, stderr).Resolve(context.Background(), ref)
	if err != nil {
		return "", nil, fmt.Errorf("--model: %w", err)
	}
	return snap.Dir, snap, nil
}

// newHubClient is the hub client of the HF_* environment and --offline.
func newHubClient(getenv func(string) string, offline bool, stderr io.Writer) *hub.Client {
	c := hub.FromEnv(getenv)
	c.Offline = c.Offline || offline
	c.Progress, c.Terminal = stderr, isTerminal(stderr)
	return c
}

// isTerminal says whether w is a terminal (progress redraws one line).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// openOrDemo loads --model, or without it the embedded demo model, after a
// loud warning on stderr that says what the demo model is (what names the
// use: "talking to", "serving").
func (f *modelFlags) openOrDemo(what string) (family.Model, gpu.Device, nn.Precision, error) {
	if f.dir != "" {
		dir, err := f.resolve()
		if err != nil {
			return nil, nil, 0, err
		}
		return f.openDir(dir)
	}
	p, err := f.check()
	if err != nil {
		return nil, nil, 0, err
	}
	if f.codec == lfm2audio.CodecDetokenizer {
		return nil, nil, 0, usageError{"--codec detokenizer: the embedded demo model has no detokenizer (pass --model DIR of an LFM2.5-Audio folder)"}
	}
	dev, err := f.openDevice()
	if err != nil {
		return nil, nil, 0, err
	}
	bar := strings.Repeat("!", 78)
	fmt.Fprintf(f.stderr, "\n%s\n  NO --model GIVEN: %s the embedded DEMO model (tiny, random weights).\n"+
		"  Everything works, but its words and its speech are NOISE.\n"+
		"  Pass --model DIR (an LFM2-Audio checkpoint folder) for real replies.\n%s\n\n", bar, what, bar)
	m, err := demomodel.Load(dev)
	if err != nil {
		dev.Close()
		return nil, nil, 0, err
	}
	return m, dev, p, nil
}

// openDir loads a checkpoint folder onto --device: memory-mapped, or
// (--no-mmap) read into memory.
func (f *modelFlags) openDir(dir string) (family.Model, gpu.Device, nn.Precision, error) {
	p, err := f.check()
	if err != nil {
		return nil, nil, 0, err
	}
	dev, err := f.openDevice()
	if err != nil {
		return nil, nil, 0, err
	}
	m, err := f.loadOn(dev, dir, "")
	if err != nil {
		dev.Close()
		return nil, nil, 0, err
	}
	return m, dev, p, nil
}

// loadOn loads a checkpoint folder onto dev through the family registry:
// config.json names the family (stages/family.Load), whose constructor
// loads the folder; name, when set, replaces the folder's name (a repo id
// names its snapshot's folder otherwise).
func (f *modelFlags) loadOn(dev gpu.Device, dir, name string) (family.Model, error) {
	if name == "" && f.source != nil && filepath.Clean(dir) == filepath.Clean(f.source.Dir) {
		name = f.source.Ref.Repo // not the snapshot folder's commit
	}
	m, err := family.Load(dev, dir, family.Options{Codec: f.codec, InMemory: f.noMmap, Name: name})
	if err != nil {
		return nil, err
	}
	info := m.Info()
	f.logger().Debug("model loaded", "model", info.Name, "family", info.Family, "params", info.Params, "codec", m.AudioCodec().Kind(), "device", dev.Name(), "mapped", !f.noMmap)
	return m, nil
}

// lfm2audioModel returns m as LFM2-Audio's model, for what (parity,
// --teacher) compares its stages with the reference's recordings, which
// are LFM2-Audio's.
func lfm2audioModel(m family.Model, what string) (*lfm2audio.Model, error) {
	lm, ok := m.(*lfm2audio.Model)
	if !ok {
		return nil, fmt.Errorf("%s: the reference cases are LFM2-Audio's; %s is of family %s", what, m.Info().Name, m.Info().Family)
	}
	return lm, nil
}

// workers returns the CPU backend's worker count, or the machine's cores
// for a device without workers.
func workers(dev gpu.Device) int {
	if w, ok := dev.(interface{ Workers() int }); ok {
		return w.Workers()
	}
	return runtime.NumCPU()
}
