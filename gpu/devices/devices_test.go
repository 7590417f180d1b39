package devices

import (
	"strings"
	"testing"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/gpu/cuda"
)

func TestOpen(t *testing.T) {
	dev, note, err := Open("cpu", Options{Threads: 1})
	if err != nil || note != "" || gpu.DescribeDevice(dev).Kind != "cpu" {
		t.Fatalf("cpu: %v %q %v", dev, note, err)
	}
	dev.Close()

	if _, _, err := Open("tpu", Options{}); err == nil || !strings.Contains(err.Error(), "cpu, cuda or auto") {
		t.Errorf("an unknown device: %v", err)
	}

	probe, cudaErr := cuda.New(cuda.Options{})
	if cudaErr == nil {
		probe.Close()
	}
	dev, note, err = Open("auto", Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	switch kind := gpu.DescribeDevice(dev).Kind; {
	case cudaErr != nil && (kind != "cpu" || !strings.Contains(note, cudaErr.Error())):
		t.Errorf("auto without a usable GPU: %s, note %q (want cpu and why: %v)", kind, note, cudaErr)
	case cudaErr == nil && (kind != "cuda" || note != ""):
		t.Errorf("auto with a GPU: %s, note %q", kind, note)
	}
	if cudaErr != nil {
		if _, _, err := Open("cuda", Options{}); err == nil {
			t.Error("cuda without a GPU opened")
		}
	}
}
