package cuda

import (
	"errors"

	"github.com/omni-pipe/omni-pipe/gpu"
)

// Device is a CUDA GPU.
type Device struct{ gpu.Device }

func openDevice(o Options) (*Device, error) { return nil, errors.New("cuda: backend under construction") }
