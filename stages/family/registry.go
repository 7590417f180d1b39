package family

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Options choose among what a checkpoint folder holds and how it is held.
type Options struct {
	// Codec names the codec to decode with, or "" for the folder's
	// default (a family may hold more than one, as LFM2.5-Audio does).
	Codec string
	// InMemory reads the weight files into memory instead of mapping
	// them.
	InMemory bool
	// Name, when set, is the model's name in Info instead of the
	// folder's base name (e.g. the repo id it came by).
	Name string
}

// Constructor loads a checkpoint folder of its family onto dev.
type Constructor func(dev gpu.Device, dir string, opts Options) (Model, error)

var (
	mu       sync.RWMutex
	registry = map[string]Constructor{}
)

// Register makes a family loadable under name: an `architectures` entry
// of config.json (or its `model_type`). It is meant for a family
// package's init; registering a name twice panics.
func Register(name string, c Constructor) {
	mu.Lock()
	defer mu.Unlock()
	if name == "" || c == nil {
		panic("family: Register needs a name and a constructor")
	}
	if _, dup := registry[name]; dup {
		panic("family: " + name + " registered twice")
	}
	registry[name] = c
}

// Registered returns the registered names, sorted.
func Registered() []string {
	mu.RLock()
	defer mu.RUnlock()
	return registeredLocked()
}

// ErrUnknown is wrapped by Load's error for a config.json no registered
// family claims.
var ErrUnknown = errors.New("no registered model family")

// header is the part of config.json that names the family.
type header struct {
	Architectures []string `json:"architectures"`
	ModelType     string   `json:"model_type"`
}

// Load reads dir/config.json and loads the folder with the constructor
// registered under its first registered `architectures` entry, or else
// its `model_type`.
func Load(dev gpu.Device, dir string, opts Options) (Model, error) {
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("load model %s: %w", dir, err)
	}
	c, err := lookup(data)
	if err != nil {
		return nil, fmt.Errorf("load model %s: config.json: %w", dir, err)
	}
	return c(dev, dir, opts)
}

// lookup returns the constructor config.json data names.
func lookup(data []byte) (Constructor, error) {
	var h header
	if err := json.Unmarshal(data, &h); err != nil {
		return nil, err
	}
	mu.RLock()
	defer mu.RUnlock()
	for _, n := range append(slices.Clone(h.Architectures), h.ModelType) {
		if c, ok := registry[n]; ok && n != "" {
			return c, nil
		}
	}
	return nil, fmt.Errorf("%w for architectures %q, model_type %q (registered: %s)",
		ErrUnknown, h.Architectures, h.ModelType, strings.Join(registeredLocked(), ", "))
}

func registeredLocked() []string {
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
