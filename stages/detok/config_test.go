package detok

import (
	"os"
	"strings"
	"testing"
)

func TestParseConfig(t *testing.T) {
	data, err := os.ReadFile(fixtureDir + "/" + DirName + "/" + ConfigName)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	if c.NFFT() != 1280 || c.Hop() != 320 || c.FFNDim() != 128 || c.SlidingWindow != 30 || c.LayerTypes[1] != "sliding_attention" {
		t.Errorf("n_fft %d hop %d FFN %d window %d layers %v", c.NFFT(), c.Hop(), c.FFNDim(), c.SlidingWindow, c.LayerTypes)
	}
	for _, tc := range []struct{ from, to, want string }{
		{`"output_size": 1282`, `"output_size": 1281`, "output_size = 1281"},
		{`"output_size": 1282`, `"output_size": 0`, "output_size = 0"},
		{`"sliding_window": 30`, `"sliding_window": 0`, "sliding_window is 0"},
		{`"hidden_size": 64`, `"hidden_size": -1`, "hidden_size = -1"},
		{`"conv",`, `"mamba",`, `unknown type "mamba"`},
		{`{`, `[`, "detokenizer config"},
	} {
		bad := strings.Replace(string(data), tc.from, tc.to, 1)
		if _, err := ParseConfig([]byte(bad)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s → %s: error %v, want %q", tc.from, tc.to, err, tc.want)
		}
	}
}

// FuzzParseConfig: any input gives a config or an error, never a panic,
// and an accepted config has usable iSTFT sizes.
func FuzzParseConfig(f *testing.F) {
	data, err := os.ReadFile(fixtureDir + "/" + DirName + "/" + ConfigName)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte(`{"hidden_size": 8, "num_hidden_layers": 1, "intermediate_size": 8, "vocab_size": 1, "output_size": 10}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err != nil {
			return
		}
		if n := c.NFFT(); n < 8 || n%8 != 0 || c.Hop() <= 0 || len(c.LayerTypes) != c.NumHiddenLayers {
			t.Fatalf("accepted n_fft %d hop %d, %d layer types for %d layers", n, c.Hop(), len(c.LayerTypes), c.NumHiddenLayers)
		}
	})
}
