package main

import (
	"flag"
	"fmt"
	"log/slog"

	"github.com/omni-pipe/omni-pipe/gpu"
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
}

func (f *modelFlags) register(fs *flag.FlagSet, e *env) {
	fs.StringVar(&f.dir, "model", e.getenv("OMNIPIPE_MODEL"), "checkpoint folder (config.json, model.safetensors, tokenizer.json, codec weights); env OMNIPIPE_MODEL")
	fs.StringVar(&f.device, "device", envOr(e, "OMNIPIPE_DEVICE", "cpu"), "compute device: cpu; env OMNIPIPE_DEVICE")
	fs.IntVar(&f.threads, "threads", 0, "CPU worker threads (0: one per core)")
	fs.StringVar(&f.precision, "precision", "bf16", "activation rounding: bf16 (reproduces the official bf16 inference) or f32")
}

func envOr(e *env, key, def string) string {
	if v := e.getenv(key); v != "" {
		return v
	}
	return def
}

// open loads the model onto the chosen device.
func (f *modelFlags) open() (*lfm2audio.Model, gpu.Device, nn.Precision, error) {
	p, err := nn.ParsePrecision(f.precision)
	if err != nil {
		return nil, nil, 0, usageError{err.Error()}
	}
	if f.device != "cpu" {
		return nil, nil, 0, usageError{fmt.Sprintf("device %q is not available in this build (cpu is)", f.device)}
	}
	if f.dir == "" {
		return nil, nil, 0, usageError{"--model DIR is required"}
	}
	dev := cpu.New(f.threads)
	m, err := lfm2audio.Load(dev, f.dir)
	if err != nil {
		dev.Close()
		return nil, nil, 0, err
	}
	slog.Debug("model loaded", "model", m.Name, "params", m.Params, "device", dev.Name())
	return m, dev, p, nil
}
