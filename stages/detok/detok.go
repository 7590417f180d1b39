// Package detok is LFM2.5-Audio's audio detokenizer: the codec that turns
// the depthformer's 8 codes per 80 ms frame into a 24 kHz waveform with a
// small LFM2 network and an inverse STFT, in place of LFM2-Audio's Mimi.
//
// The forward pass follows liquid-audio's LFM2AudioDetokenizer:
//
//  1. the mean of the frame's 8 code embeddings (codebook k's code c is row
//     c + k·bins of emb.emb);
//  2. repeated 6 times in time (nearest-exact upsampling by an integer
//     factor), 75 rows per second;
//  3. the LFM2 network (stages/lfm2) over those rows, its sliding_attention
//     layers attending to the last sliding_window positions, and its final
//     norm;
//  4. lin (with bias) to n_fft+2 values per row: n_fft/2+1 log-magnitudes
//     then as many phases;
//  5. the complex spectrum exp(logmag)·e^{i·phase}, irfft(n_fft), times the
//     checkpoint's istft.window, overlap-added with hop n_fft/4, divided by
//     the overlap-added squared window, and (n_fft−hop)/2 samples trimmed
//     from both ends ("same" padding): 6·hop samples per code frame.
//
// The official module runs in fp32 with the bf16 checkpoint's values as
// its weights, so the network runs with nn.F32 (no bf16 rounding of
// activations) and fp32 RoPE frequencies. The network runs through the gpu
// op set; the spectrum, inverse FFT and overlap-add run on the host in
// float64 (the op set has no FFT), on the head's read-back output.
//
// A Stream decodes frame by frame: the network keeps a per-layer cache (the
// conv rows, the keys and values a window still sees, the position), and
// the overlap-add holds the last n_fft−hop samples, so the stream lags
// (n_fft−hop)/2 samples (20 ms) behind and Flush emits them at the end.
// The streamed samples equal Decoder.Decode's bit for bit. Decoder.DecodeBatch
// decodes several streams' next frames in the same passes, each stream's
// samples exactly those of its own calls.
package detok

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/cmplx"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/mjibson/go-dsp/fft"

	"github.com/omni-pipe/omni-pipe/gpu"
	"github.com/omni-pipe/omni-pipe/stages/config"
	"github.com/omni-pipe/omni-pipe/stages/lfm2"
	"github.com/omni-pipe/omni-pipe/stages/nn"
	"github.com/omni-pipe/omni-pipe/stages/safetensors"
	"github.com/omni-pipe/omni-pipe/stages/weights"
)

// Fixed by the official module (liquid-audio's LFM2AudioDetokenizer).
const (
	// DirName is the detokenizer's folder inside an LFM2.5-Audio model.
	DirName = "audio_detokenizer"
	// ConfigName and WeightsName are its files.
	ConfigName  = "config.json"
	WeightsName = "model.safetensors"
	// Codebooks is the number of codes per frame.
	Codebooks = 8
	// Upsample is the number of network rows per code frame.
	Upsample = 6
	// SampleRate is the output rate in Hz.
	SampleRate = 24000
)

// ErrEndOfAudio reports a frame holding the end-of-audio code (the
// codebook size, 2048): the frame that ends the audio is never decoded.
var ErrEndOfAudio = errors.New("end-of-audio frame")

// Config is the detokenizer's config.json: an Lfm2Config plus the head's
// output size.
type Config struct {
	config.LFM2
	// OutputSize is lin's width, n_fft + 2 (1282).
	OutputSize int `json:"output_size"`
}

// NFFT returns the inverse FFT's size (and the window's length).
func (c *Config) NFFT() int { return c.OutputSize - 2 }

// Hop returns the iSTFT hop: n_fft/4 (320 for 1280).
func (c *Config) Hop() int { return c.NFFT() / 4 }

// ParseConfig decodes and validates a detokenizer config.json.
func ParseConfig(data []byte) (*Config, error) {
	var c Config
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("detokenizer config: %w", err)
	}
	if err := c.LFM2.Normalize(); err != nil {
		return nil, fmt.Errorf("detokenizer config: %w", err)
	}
	if n := c.NFFT(); n < 8 || n > config.MaxNFFT || n%8 != 0 {
		return nil, fmt.Errorf("detokenizer config: output_size = %d, want n_fft+2 with n_fft a multiple of 8 in 8..%d", c.OutputSize, config.MaxNFFT)
	}
	return &c, nil
}

// Decoder is a loaded detokenizer. Its methods and its streams may be used
// from several goroutines; decoding is serialised.
type Decoder struct {
	cfg  Config
	dev  gpu.Device
	file *safetensors.File

	mu  sync.Mutex
	ctx *nn.Ctx
	net *lfm2.Model
	emb gpu.Tensor // emb.emb.weight [Codebooks·bins, hidden]
	lin gpu.Tensor // [n_fft+2, hidden]
	bia gpu.Tensor // lin.bias [1, n_fft+2]

	bins    int
	maxPass int // frames of all streams one DecodeBatch pass takes
	nfft    int
	hop     int
	pad     int
	window  []float64 // istft.window, as stored (bf16-rounded Hann)
	win2    []float64 // window²
}

// Load loads the detokenizer in dir (a folder holding ConfigName and
// WeightsName) onto dev.
func Load(dev gpu.Device, dir string) (*Decoder, error) {
	data, err := os.ReadFile(filepath.Join(dir, ConfigName))
	if err != nil {
		return nil, fmt.Errorf("load detokenizer: %w", err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("load detokenizer %s: %w", dir, err)
	}
	f, err := safetensors.Open(filepath.Join(dir, WeightsName))
	if err != nil {
		return nil, fmt.Errorf("load detokenizer: %w", err)
	}
	d, err := New(dev, f, *cfg)
	if err != nil {
		f.Close()
		return nil, err
	}
	d.file = f
	return d, nil
}

// New binds a detokenizer checkpoint (liquid-audio's state_dict names) for
// decoding. Every tensor must be present with its configured shape and the
// checkpoint must hold nothing else. The file must stay open while the
// Decoder is used.
func New(dev gpu.Device, f *safetensors.File, cfg Config) (*Decoder, error) {
	H := cfg.HiddenSize
	d := &Decoder{cfg: cfg, dev: dev, nfft: cfg.NFFT(), hop: cfg.Hop(), maxPass: defaultMaxPass}
	d.pad = (d.nfft - d.hop) / 2
	et := f.Tensor("emb.emb.weight")
	if et == nil || len(et.Shape) != 2 || et.Shape[0] < Codebooks || et.Shape[0]%Codebooks != 0 {
		return nil, fmt.Errorf("load detokenizer: %s: emb.emb.weight missing or not [%d·bins, %d]", f.Path, Codebooks, H)
	}
	d.bins = et.Shape[0] / Codebooks
	wb := weights.New(dev, f)
	net, err := lfm2.Load(wb.Sub("lfm"), cfg.LFM2)
	if err != nil {
		return nil, fmt.Errorf("load detokenizer: %w", err)
	}
	// The official module computes RoPE's frequencies in fp32 and keeps
	// them so (it is built in fp32; only the weights hold bf16 values).
	net.InvFreq = nn.RoPEInvFreq(cfg.RopeTheta, cfg.HeadDim())
	net.FlashAttention = false
	d.net = net
	d.emb = wb.Tensor("emb.emb.weight", Codebooks*d.bins, H)
	d.lin = wb.Tensor("lin.weight", cfg.OutputSize, H)
	d.bia = wb.Tensor("lin.bias", cfg.OutputSize)
	w := wb.Values("istft.window", d.nfft)
	err = wb.Err()
	if extra := wb.Unexpected(); err == nil && len(extra) > 0 {
		if len(extra) > 5 {
			extra = append(extra[:5:5], fmt.Sprintf("… %d more", len(extra)-5))
		}
		err = fmt.Errorf("%s: tensors the configuration does not use: %s", f.Path, strings.Join(extra, ", "))
	}
	if err != nil {
		return nil, fmt.Errorf("load detokenizer: %w", err)
	}
	d.window = make([]float64, d.nfft)
	d.win2 = make([]float64, d.nfft)
	for i, v := range w {
		d.window[i] = float64(v)
		d.win2[i] = float64(v) * float64(v)
	}
	d.ctx = nn.NewCtx(dev, gpu.NewUrgentQueue(dev, "detokenizer"), nn.F32)
	return d, nil
}

// Config returns the detokenizer's configuration.
func (d *Decoder) Config() Config { return d.cfg }

// SampleRate returns the output rate in Hz.
func (d *Decoder) SampleRate() int { return SampleRate }

// Codebooks returns the number of codes per frame.
func (d *Decoder) Codebooks() int { return Codebooks }

// Bins returns the codebook size (2048); it is also the end-of-audio code.
func (d *Decoder) Bins() int { return d.bins }

// FrameSamples returns the samples per code frame (1920).
func (d *Decoder) FrameSamples() int { return Upsample * d.hop }

// Lag returns the samples a stream holds back until Flush (480).
func (d *Decoder) Lag() int { return d.pad }

// Close releases the decoder's memory and the checkpoint Load opened.
// Streams must not be used afterwards.
func (d *Decoder) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx != nil {
		d.ctx.A.Free()
		d.ctx = nil
	}
	if d.file != nil {
		err := d.file.Close()
		d.file = nil
		return err
	}
	return nil
}

// CheckCodes rejects frames of the wrong size, end-of-audio frames and
// codes outside the codebooks, so that nothing else reaches the network.
func (d *Decoder) CheckCodes(codes [][]int) error {
	for f, fr := range codes {
		if len(fr) != Codebooks {
			return fmt.Errorf("detokenizer: frame %d has %d codes, want %d", f, len(fr), Codebooks)
		}
		for k, c := range fr {
			if c == d.bins {
				return fmt.Errorf("detokenizer: frame %d codebook %d: code %d: %w (decode only the frames before it)", f, k, c, ErrEndOfAudio)
			}
			if c < 0 || c >= d.bins {
				return fmt.Errorf("detokenizer: frame %d codebook %d: code %d outside 0..%d", f, k, c, d.bins-1)
			}
		}
	}
	return nil
}

// Trace holds a whole decode's intermediate tensors, row-major, under the
// reference fixtures' names.
type Trace struct {
	EmbMean []float32 // emb_mean [T, hidden]
	Hidden  []float32 // lfm_hidden [6T, hidden]: the final norm's output
	LinOut  []float32 // lin_out [6T, n_fft+2]
	Wav     []float32 // wav [1920·T]
}

// Decode decodes a whole utterance (codes[t][k] is frame t's code of
// codebook k) in one pass and returns its FrameSamples()·len(codes)
// samples.
func (d *Decoder) Decode(codes [][]int) ([]float32, error) {
	tr, err := d.decode(codes, false)
	if err != nil {
		return nil, err
	}
	return tr.Wav, nil
}

// DecodeTrace is Decode that also returns the intermediate tensors.
func (d *Decoder) DecodeTrace(codes [][]int) (*Trace, error) { return d.decode(codes, true) }

func (d *Decoder) decode(codes [][]int, trace bool) (*Trace, error) {
	if err := d.CheckCodes(codes); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil {
		return nil, errors.New("detokenizer: decode after Close")
	}
	tr := &Trace{}
	if len(codes) == 0 {
		tr.Wav = []float32{}
		return tr, nil
	}
	cache := d.net.NewCache(d.dev)
	defer cache.Free()
	spec, err := d.forward(cache, codes, tr, trace)
	if err != nil {
		return nil, err
	}
	tr.Wav = d.istft(spec)
	return tr, nil
}

// forward runs the embedding, the network and the head over codes,
// advancing cache, and returns the head's output [6·len(codes), n_fft+2].
// d.mu is held.
func (d *Decoder) forward(cache *lfm2.Cache, codes [][]int, tr *Trace, trace bool) ([]float32, error) {
	return d.forwardSeqs([]lfm2.Seq{{Cache: cache, Rows: Upsample * len(codes)}}, codes, tr, trace)
}

// forwardSeqs is forward over several streams' frames in one pass: codes
// are the streams' frames one stream after another, seqs[i].Rows
// Upsample times stream i's frame count, and the output's rows are the
// streams' rows in the same order. Each stream's rows are exactly those of
// its own forward (lfm2.Model.Forward keeps attention and the convolution
// state per sequence). d.mu is held.
func (d *Decoder) forwardSeqs(seqs []lfm2.Seq, codes [][]int, tr *Trace, trace bool) ([]float32, error) {
	c := d.ctx
	c.A.Reset()
	T, H := len(codes), d.cfg.HiddenSize
	R := Upsample * T
	ids := make([]int32, 0, R*Codebooks)
	for s := range R {
		for k, code := range codes[s/Upsample] {
			ids = append(ids, int32(code+k*d.bins))
		}
	}
	x := c.Tmp(R, H)
	c.Q.Embed(x, d.emb, ids)
	c.Q.Scale(x, x, 1.0/Codebooks)
	if trace {
		all := make([]float32, R*H)
		if err := c.Q.Read(all, x); err != nil {
			return nil, fmt.Errorf("detokenizer: read embeddings: %w", err)
		}
		tr.EmbMean = make([]float32, 0, T*H)
		for t := range T {
			tr.EmbMean = append(tr.EmbMean, all[t*Upsample*H:(t*Upsample+1)*H]...)
		}
	}
	h := d.net.Forward(c, x, seqs)
	if trace {
		tr.Hidden = make([]float32, R*H)
		if err := c.Q.Read(tr.Hidden, h); err != nil {
			return nil, fmt.Errorf("detokenizer: read hidden states: %w", err)
		}
	}
	z := c.Tmp(R, d.cfg.OutputSize)
	c.Q.MatMul(z, h, d.lin, d.bia)
	out := make([]float32, R*d.cfg.OutputSize)
	if err := c.Q.Read(out, z); err != nil {
		return nil, fmt.Errorf("detokenizer: read spectra: %w", err)
	}
	if trace {
		tr.LinOut = out
	}
	return out, nil
}

// frame returns the windowed inverse FFT of one head row (n_fft+2 values:
// the log-magnitudes of bins 0..n_fft/2, then their phases): torch.irfft of
// exp(logmag)·e^{i·phase}, which ignores the imaginary parts of the DC and
// Nyquist bins, times the window.
func (d *Decoder) frame(dst []float64, row []float32, z []complex128) {
	n, nb := d.nfft, d.nfft/2+1
	for b := range nb {
		z[b] = cmplx.Rect(math.Exp(float64(row[b])), float64(row[nb+b]))
	}
	z[0] = complex(real(z[0]), 0)
	z[n/2] = complex(real(z[n/2]), 0)
	for b := 1; b < n/2; b++ {
		z[n-b] = cmplx.Conj(z[b])
	}
	f := fft.IFFT(z) // scaled by 1/n, as norm="backward"
	for j := range n {
		dst[j] = real(f[j]) * d.window[j]
	}
}

// istft is the whole-utterance inverse STFT of the head's rows (the
// official ISTFT with "same" padding): overlap-add of every windowed frame
// at m·hop, divided by the overlap-added squared window, pad samples
// trimmed at both ends.
func (d *Decoder) istft(spec []float32) []float32 {
	n, hop, W := d.nfft, d.hop, d.cfg.OutputSize
	M := len(spec) / W
	L := (M-1)*hop + n
	ola, env := make([]float64, L), make([]float64, L)
	f, z := make([]float64, n), make([]complex128, n)
	for m := range M {
		d.frame(f, spec[m*W:(m+1)*W], z)
		o := m * hop
		for j := range n {
			ola[o+j] += f[j]
			env[o+j] += d.win2[j]
		}
	}
	out := make([]float32, 0, L-2*d.pad)
	for p := d.pad; p < L-d.pad; p++ {
		out = append(out, sample(ola[p], env[p]))
	}
	return out
}

// sample is one normalised output sample. The official decode asserts the
// envelope is above 1e-11 inside the kept region, where it always is for
// a Hann window; below it the raw sum is returned, as llama.cpp's
// streaming iSTFT does.
func sample(ola, env float64) float32 {
	if env <= 1e-11 {
		return float32(ola)
	}
	return float32(ola / env)
}
