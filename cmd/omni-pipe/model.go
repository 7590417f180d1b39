package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/omni-pipe/omni-pipe/gpu/cpu"
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
}

func (f *modelFlags) register(fs *flag.FlagSet, e *env) {
	fs.StringVar(&f.dir, "model", e.getenv("OMNIPIPE_MODEL"), "checkpoint folder (config.json, model.safetensors, tokenizer.json, codec weights); env OMNIPIPE_MODEL")
	fs.StringVar(&f.device, "device", envOr(e, "OMNIPIPE_DEVICE", "cpu"), "compute device: cpu; env OMNIPIPE_DEVICE")
	fs.IntVar(&f.threads, "threads", 0, "CPU worker threads (0: one per core)")
	fs.StringVar(&f.precision, "precision", "bf16", "activation rounding: bf16 (reproduces the official bf16 inference) or f32")
	fs.BoolVar(&f.noMmap, "no-mmap", e.getenv("OMNIPIPE_NO_MMAP") != "", "read the weights into memory instead of mapping the files (for hosts whose memory reclaimer pages out cold mapped files; see docs/performance.md); env OMNIPIPE_NO_MMAP")
}

func envOr(e *env, key, def string) string {
	if v := e.getenv(key); v != "" {
		return v
	}
	return def
}

// open loads the --model folder onto the chosen device.
func (f *modelFlags) open() (*lfm2audio.Model, *cpu.Device, nn.Precision, error) {
	if f.dir == "" {
		return nil, nil, 0, usageError{"--model DIR is required"}
	}
	return f.openDir(f.dir)
}

// check validates the device and precision flags.
func (f *modelFlags) check() (nn.Precision, error) {
	p, err := nn.ParsePrecision(f.precision)
	if err != nil {
		return 0, usageError{err.Error()}
	}
	if f.device != "cpu" {
		return 0, usageError{fmt.Sprintf("device %q is not available in this build (cpu is)", f.device)}
	}
	return p, nil
}

// openDir loads a checkpoint folder: memory-mapped, or (--no-mmap) read
// into memory.
func (f *modelFlags) openDir(dir string) (*lfm2audio.Model, *cpu.Device, nn.Precision, error) {
	p, err := f.check()
	if err != nil {
		return nil, nil, 0, err
	}
	dev := cpu.New(f.threads)
	var m *lfm2audio.Model
	if f.noMmap {
		m, err = lfm2audio.LoadFS(dev, os.DirFS(dir), filepath.Base(filepath.Clean(dir)))
	} else {
		m, err = lfm2audio.Load(dev, dir)
	}
	if err != nil {
		dev.Close()
		return nil, nil, 0, err
	}
	slog.Debug("model loaded", "model", m.Name, "params", m.Params, "device", dev.Name(), "mapped", !f.noMmap)
	return m, dev, p, nil
}
