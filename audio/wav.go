package audio

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// Errors returned by Decode, wrapped with the detail of what was wrong; test
// them with errors.Is.
var (
	// ErrNotWAV: the input is not a RIFF/WAVE (or RF64/BW64) file.
	ErrNotWAV = errors.New("not a RIFF/WAVE file")
	// ErrUnsupported: a valid WAV whose encoding, channel count or sample
	// rate this decoder does not take (the codec is named).
	ErrUnsupported = errors.New("unsupported WAV")
	// ErrMalformed: a header field that no valid file has.
	ErrMalformed = errors.New("malformed WAV")
	// ErrTruncated: the input ends before what its headers announce.
	ErrTruncated = errors.New("truncated WAV")
	// ErrTooLong: the audio is longer than the caller's limit.
	ErrTooLong = errors.New("audio too long")
	// ErrEmpty: no input bytes, or a data chunk with no whole sample frame.
	ErrEmpty = errors.New("empty audio")
)

// Bounds on what Decode (and the resampler) accept.
const (
	MinSampleRate = 1000
	MaxSampleRate = 768000
	MaxChannels   = 256
	// DefaultMaxDuration applies when DecodeOptions sets no duration limit.
	DefaultMaxDuration = 10 * time.Minute
)

// Clip is mono audio: samples in [-1, 1] (float sources may exceed it) at
// SampleRate.
type Clip struct {
	SampleRate int
	Samples    []float32
}

// Duration returns the clip's length.
func (c *Clip) Duration() time.Duration {
	if c.SampleRate <= 0 {
		return 0
	}
	return time.Duration(float64(len(c.Samples)) / float64(c.SampleRate) * float64(time.Second))
}

// DecodeOptions bound what Decode accepts.
type DecodeOptions struct {
	// MaxDuration bounds the clip's length (DefaultMaxDuration when 0).
	MaxDuration time.Duration
	// MaxFrames, when positive, also bounds the number of sample frames.
	MaxFrames int
}

// maxFrames returns the frame limit at the given sample rate.
func (o DecodeOptions) maxFrames(rate int) int {
	d := o.MaxDuration
	if d <= 0 {
		d = DefaultMaxDuration
	}
	n := int(math.Min(d.Seconds()*float64(rate), math.MaxInt32))
	if o.MaxFrames > 0 && o.MaxFrames < n {
		n = o.MaxFrames
	}
	return n
}

// WAVE format tags (mmreg.h) this decoder reads.
const (
	tagPCM        = 0x0001
	tagFloat      = 0x0003
	tagExtensible = 0xFFFE
)

// codecNames names the format tags a client is likely to send, for errors.
var codecNames = map[uint32]string{
	0x0002: "Microsoft ADPCM",
	0x0006: "A-law",
	0x0007: "μ-law",
	0x0011: "IMA ADPCM",
	0x0016: "ITU G.723 ADPCM",
	0x0022: "DSP Group TrueSpeech",
	0x0031: "GSM 6.10",
	0x0040: "ITU G.721 ADPCM",
	0x0050: "MPEG audio",
	0x0055: "MP3",
	0x00FF: "AAC",
	0x0161: "WMA",
	0x0162: "WMA Pro",
	0x0163: "WMA Lossless",
	0x1610: "HE-AAC",
	0x2000: "AC-3",
	0x674F: "Ogg Vorbis",
	0x6750: "Ogg Vorbis",
	0x6751: "Ogg Vorbis",
	0xF1AC: "FLAC",
}

// containerName names the audio container that head (a file's first
// bytes) begins, for the formats clients send instead of WAV (a browser's
// MediaRecorder: WebM or MP4; phones: MP4/M4A, CAF, AMR); "" when unknown.
func containerName(head []byte) string {
	s := string(head)
	switch {
	case strings.HasPrefix(s, "\x1a\x45\xdf\xa3"):
		return "WebM/Matroska (as a browser's MediaRecorder writes)"
	case strings.HasPrefix(s, "OggS"):
		return "Ogg (Opus or Vorbis)"
	case strings.HasPrefix(s, "fLaC"):
		return "FLAC"
	case strings.HasPrefix(s, "ID3"), len(s) >= 2 && s[0] == 0xFF && s[1]&0xE0 == 0xE0 && s[1]&0x06 != 0:
		return "MP3"
	case len(s) >= 2 && s[0] == 0xFF && s[1]&0xF6 == 0xF0:
		return "AAC (ADTS)"
	case len(s) >= 8 && s[4:8] == "ftyp":
		return "MP4/M4A"
	case strings.HasPrefix(s, "FORM") && len(s) >= 12 && (s[8:12] == "AIFF" || s[8:12] == "AIFC"):
		return "AIFF"
	case strings.HasPrefix(s, "caff"):
		return "CAF (Core Audio)"
	case strings.HasPrefix(s, "#!AMR"):
		return "AMR"
	}
	return ""
}

// ksGUIDTail is the common tail of the KSDATAFORMAT_SUBTYPE_* GUIDs
// ({XXXXXXXX-0000-0010-8000-00AA00389B71}), as stored after Data1.
var ksGUIDTail = [12]byte{0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71}

// format is a parsed fmt chunk.
type format struct {
	tag        uint32 // PCM or float (extensible resolved to its sub-format)
	channels   int
	rate       int
	blockAlign int // bytes per sample frame
	width      int // bytes per sample (container)
}

// DecodeBytes decodes a WAV held in memory; see Decode.
func DecodeBytes(b []byte, opts DecodeOptions) (*Clip, error) {
	return Decode(bytes.NewReader(b), opts)
}

// Decode reads a WAV stream and returns its audio down-mixed to mono (the
// mean over channels, the usual torchaudio idiom wav.mean(0); liquid-audio
// itself takes only mono: ChatState.add_audio asserts a [1, L] wave, its
// README passes torchaudio.load's output straight in, and the demo gets mono
// int16 from fastrtc) as float32. Integer PCM is scaled by 2^-(N-1) for an
// N-bit container (int16/32768 as liquid-audio's demo does; unsigned 8-bit:
// (v-128)/128); float samples are taken as they are and must be finite.
//
// It reads RIFF/WAVE, RF64 and BW64; PCM 8/16/24/32-bit, IEEE float 32/64 and
// WAVE_FORMAT_EXTENSIBLE with the PCM or float sub-format; any chunk order
// with fmt before data, odd-sized chunks with their pad byte, and a data
// chunk whose size is 0 or 0xFFFFFFFF (a streamed WAV: read to EOF) or the
// placeholder of about 2 GiB that arecord writes to a pipe (read to EOF or
// that size).
// Allocation is bounded by the bytes actually present and by the limits in
// opts, never by a header field alone.
func Decode(r io.Reader, opts DecodeOptions) (*Clip, error) {
	d := &decoder{r: bufio.NewReaderSize(r, 64<<10), opts: opts, avail: -1}
	if l, ok := r.(interface{ Len() int }); ok { // bytes.Reader and the like
		d.avail = l.Len()
	}
	clip, err := d.decode()
	if err != nil {
		return nil, fmt.Errorf("decode wav: %w", err)
	}
	return clip, nil
}

type decoder struct {
	r    *bufio.Reader
	opts DecodeOptions
	off  int64 // bytes consumed, for messages
	rf64 bool
	ds64 uint64 // data size from an RF64 ds64 chunk (0: none)
	fmt  *format
	// avail is the input's total length when the reader tells it (-1
	// otherwise); with off it bounds the data actually present.
	avail int
}

// read fills b, reporting a short read as ErrTruncated naming what was read.
func (d *decoder) read(b []byte, what string) error {
	n, err := io.ReadFull(d.r, b)
	d.off += int64(n)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: %s: got %d of %d bytes at offset %d", ErrTruncated, what, n, len(b), d.off-int64(n))
		}
		return fmt.Errorf("read %s: %w", what, err)
	}
	return nil
}

// skip discards n bytes.
func (d *decoder) skip(n int64, what string) error {
	m, err := io.CopyN(io.Discard, d.r, n)
	d.off += m
	if err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: %s: got %d of %d bytes", ErrTruncated, what, m, n)
		}
		return fmt.Errorf("skip %s: %w", what, err)
	}
	return nil
}

func (d *decoder) decode() (*Clip, error) {
	h := make([]byte, 12)
	n, err := io.ReadFull(d.r, h)
	d.off += int64(n)
	switch {
	case n == 0 && (err == io.EOF || err == nil):
		return nil, fmt.Errorf("%w: no input bytes", ErrEmpty)
	case err != nil && !errors.Is(err, io.ErrUnexpectedEOF):
		return nil, fmt.Errorf("read RIFF header: %w", err)
	}
	magic := string(h[:min(n, 4)])
	switch {
	case n >= 4 && (magic == "RIFF" || magic == "RF64" || magic == "BW64"):
		d.rf64 = magic != "RIFF"
	case n >= 4 && magic == "RIFX":
		return nil, fmt.Errorf("%w: big-endian RIFX", ErrUnsupported)
	case n < 4 && (magic == "RIFF"[:n] || magic == "RF64"[:n]):
		return nil, fmt.Errorf("%w: RIFF header: got %d of 12 bytes", ErrTruncated, n)
	default:
		if name := containerName(h[:n]); name != "" {
			return nil, fmt.Errorf("%w: this is %s, not WAV", ErrNotWAV, name)
		}
		return nil, fmt.Errorf("%w: starts with %q", ErrNotWAV, h[:min(n, 4)])
	}
	if n < 12 {
		return nil, fmt.Errorf("%w: RIFF header: got %d of 12 bytes", ErrTruncated, n)
	}
	if form := string(h[8:12]); form != "WAVE" {
		return nil, fmt.Errorf("%w: %s form type %q, want \"WAVE\"", ErrNotWAV, magic, form)
	}
	// The RIFF size is not trusted (streamed files put 0 or 0xFFFFFFFF
	// there); chunks are read until the data chunk.
	for first := true; ; first = false {
		var ch [8]byte
		m, err := io.ReadFull(d.r, ch[:])
		d.off += int64(m)
		if err != nil {
			if m == 0 && errors.Is(err, io.EOF) {
				if d.fmt == nil {
					return nil, fmt.Errorf("%w: no fmt or data chunk", ErrTruncated)
				}
				return nil, fmt.Errorf("%w: no data chunk", ErrTruncated)
			}
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, fmt.Errorf("%w: chunk header: got %d of 8 bytes at offset %d", ErrTruncated, m, d.off-int64(m))
			}
			return nil, fmt.Errorf("read chunk header: %w", err)
		}
		id := string(ch[:4])
		size := uint64(binary.LittleEndian.Uint32(ch[4:]))
		switch id {
		case "ds64":
			if !d.rf64 || !first {
				return nil, fmt.Errorf("%w: ds64 chunk outside an RF64 header", ErrMalformed)
			}
			if err := d.readDS64(size); err != nil {
				return nil, err
			}
		case "fmt ":
			if d.fmt != nil {
				return nil, fmt.Errorf("%w: second fmt chunk", ErrMalformed)
			}
			f, err := d.readFmt(size)
			if err != nil {
				return nil, err
			}
			d.fmt = f
		case "data":
			if d.fmt == nil {
				return nil, fmt.Errorf("%w: data chunk before fmt chunk", ErrMalformed)
			}
			mode := sizeExact
			switch {
			case d.rf64 && size == 0xFFFFFFFF && d.ds64 != 0:
				size = d.ds64
			case size == 0 || size == 0xFFFFFFFF:
				mode = sizeOpen
			case size >= minPlaceholder && size <= maxPlaceholder:
				mode = sizeAtMost
			}
			return d.readData(size, mode)
		default:
			if err := d.skip(int64(size+size&1), fmt.Sprintf("%q chunk", id)); err != nil {
				return nil, err
			}
		}
	}
}

func (d *decoder) readDS64(size uint64) error {
	if size < 28 {
		return fmt.Errorf("%w: ds64 chunk of %d bytes, need 28", ErrMalformed, size)
	}
	var b [28]byte
	if err := d.read(b[:], "ds64 chunk"); err != nil {
		return err
	}
	d.ds64 = binary.LittleEndian.Uint64(b[8:16])
	return d.skip(int64(size-28+size&1), "ds64 chunk")
}

// readFmt parses a fmt chunk of the given size.
func (d *decoder) readFmt(size uint64) (*format, error) {
	if size < 16 {
		return nil, fmt.Errorf("%w: fmt chunk of %d bytes, need at least 16", ErrMalformed, size)
	}
	var b [40]byte
	n := min(size, uint64(len(b)))
	if err := d.read(b[:n], "fmt chunk"); err != nil {
		return nil, err
	}
	if err := d.skip(int64(size-n+size&1), "fmt chunk"); err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	f := &format{
		tag:        uint32(le.Uint16(b[0:])),
		channels:   int(le.Uint16(b[2:])),
		rate:       int(le.Uint32(b[4:])),
		blockAlign: int(le.Uint16(b[12:])),
	}
	bits := int(le.Uint16(b[14:]))
	if f.tag == tagExtensible {
		if n < 40 {
			return nil, fmt.Errorf("%w: WAVE_FORMAT_EXTENSIBLE fmt chunk of %d bytes, need 40", ErrMalformed, size)
		}
		if valid := int(le.Uint16(b[18:])); valid != 0 && valid > bits {
			return nil, fmt.Errorf("%w: %d valid bits in a %d-bit sample", ErrMalformed, valid, bits)
		}
		g := b[24:40]
		if !bytes.Equal(g[4:], ksGUIDTail[:]) {
			return nil, fmt.Errorf("%w: WAVE_FORMAT_EXTENSIBLE sub-format GUID {%08X-%04X-%04X-%X-%X}",
				ErrUnsupported, le.Uint32(g), le.Uint16(g[4:]), le.Uint16(g[6:]), g[8:10], g[10:16])
		}
		f.tag = le.Uint32(g)
	}
	switch f.tag {
	case tagPCM, tagFloat:
	default:
		name, ok := codecNames[f.tag]
		if !ok {
			name = "unknown codec"
		}
		return nil, fmt.Errorf("%w: %s (format %d, 0x%04X); send PCM or IEEE float", ErrUnsupported, name, f.tag, f.tag)
	}
	switch {
	case f.channels == 0:
		return nil, fmt.Errorf("%w: zero channels", ErrMalformed)
	case f.channels > MaxChannels:
		return nil, fmt.Errorf("%w: %d channels (at most %d)", ErrUnsupported, f.channels, MaxChannels)
	case f.rate == 0:
		return nil, fmt.Errorf("%w: sample rate 0", ErrMalformed)
	case f.rate < MinSampleRate || f.rate > MaxSampleRate:
		return nil, fmt.Errorf("%w: sample rate %d Hz (want %d..%d)", ErrUnsupported, f.rate, MinSampleRate, MaxSampleRate)
	}
	// The container width comes from the block alignment; bits per sample
	// may be smaller (left-justified valid bits) and is 0 in some writers.
	if f.blockAlign == 0 {
		f.blockAlign = f.channels * ((bits + 7) / 8)
	}
	if f.blockAlign == 0 || f.blockAlign%f.channels != 0 {
		return nil, fmt.Errorf("%w: block align %d for %d channels of %d bits", ErrMalformed, f.blockAlign, f.channels, bits)
	}
	f.width = f.blockAlign / f.channels
	if bits > 8*f.width {
		return nil, fmt.Errorf("%w: %d bits per sample in a %d-byte container", ErrMalformed, bits, f.width)
	}
	switch {
	case f.tag == tagPCM && f.width >= 1 && f.width <= 4:
	case f.tag == tagFloat && (f.width == 4 || f.width == 8):
	case f.tag == tagPCM:
		return nil, fmt.Errorf("%w: %d-byte integer PCM samples (want 1 to 4)", ErrUnsupported, f.width)
	default:
		return nil, fmt.Errorf("%w: %d-byte IEEE float samples (want 4 or 8)", ErrUnsupported, f.width)
	}
	return f, nil
}

// dataSize says how a data chunk's declared size bounds its audio.
type dataSize int

const (
	// sizeExact: the chunk holds its declared size; less is truncation.
	sizeExact dataSize = iota
	// sizeOpen: a streamed WAV's 0 or 0xFFFFFFFF; the audio runs to EOF.
	sizeOpen
	// sizeAtMost: a size of about 2 GiB, which a writer that cannot seek
	// back (arecord to a pipe: 0x7FFFFF00 or 2^31) puts in a streamed
	// WAV's header; the audio ends at EOF or at that size.
	sizeAtMost
)

// The declared data sizes read as sizeAtMost.
const (
	minPlaceholder = 0x7FFF0000
	maxPlaceholder = 0x80000000
)

// readData decodes the data chunk of the declared size, as mode says.
func (d *decoder) readData(size uint64, mode dataSize) (*Clip, error) {
	f := d.fmt
	limit := d.opts.maxFrames(f.rate)
	ba := uint64(f.blockAlign)
	past := (uint64(limit) + 1) * ba // read at most one frame past the limit
	switch mode {
	case sizeExact:
		if size/ba > uint64(limit) {
			return nil, d.tooLong(size/ba, true)
		}
		size -= size % ba // a trailing partial frame is ignored
	case sizeAtMost:
		size = min(size-size%ba, past)
	default:
		size = past
	}
	// Samples grow with the data actually read: the first allocation is
	// capped by what the reader holds, if it says, else by 64 Ki samples;
	// never by the header's size alone.
	first := uint64(1 << 16)
	if d.avail >= 0 {
		first = uint64(max(0, int64(d.avail)-d.off)) / ba
	}
	out := make([]float32, 0, min(size/ba, first))
	buf := make([]byte, max(ba, (64<<10)/ba*ba))
	conv := converter(f)
	var got uint64
	for got < size {
		want := min(uint64(len(buf)), size-got)
		n, err := io.ReadFull(d.r, buf[:want])
		d.off += int64(n)
		whole := uint64(n) / ba * ba
		out = conv(out, buf[:whole])
		got += uint64(n)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, fmt.Errorf("read data chunk: %w", err)
			}
			if mode == sizeExact {
				return nil, fmt.Errorf("%w: data chunk declares %d bytes, only %d present", ErrTruncated, size, got)
			}
			break
		}
	}
	if len(out) > limit {
		return nil, d.tooLong(uint64(len(out)), false)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: data chunk holds no whole sample frame", ErrEmpty)
	}
	if f.tag == tagFloat {
		for i, v := range out {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return nil, fmt.Errorf("%w: non-finite sample %v at frame %d", ErrMalformed, v, i)
			}
		}
	}
	return &Clip{SampleRate: f.rate, Samples: out}, nil
}

// tooLong reports a clip over the limit: frames is its length when exact,
// else the count read when reading stopped one frame past the limit.
func (d *decoder) tooLong(frames uint64, exact bool) error {
	f := d.fmt
	limit := d.opts.maxFrames(f.rate)
	if !exact {
		return fmt.Errorf("%w: more than %d frames (%.2f s at %d Hz), the limit",
			ErrTooLong, limit, float64(limit)/float64(f.rate), f.rate)
	}
	return fmt.Errorf("%w: %d frames (%.2f s at %d Hz); the limit is %.2f s",
		ErrTooLong, frames, float64(frames)/float64(f.rate), f.rate, float64(limit)/float64(f.rate))
}

// converter returns the function that appends the mono samples of whole
// frames in b to out.
func converter(f *format) func(out []float32, b []byte) []float32 {
	c, w := f.channels, f.width
	if f.tag == tagPCM {
		// Each frame's channels are summed exactly in int64 and divided
		// once in float64, so the mono value is the correctly rounded mean
		// (for one channel, v/2^(N-1) rounded once, as numpy's float64
		// division then the cast to float32).
		scale := float64(int64(1) << (8*w - 1))
		div := scale * float64(c)
		return func(out []float32, b []byte) []float32 {
			for p := 0; p+w*c <= len(b); p += w * c {
				var s int64
				for k := range c {
					s += pcmSample(b[p+k*w:], w)
				}
				out = append(out, float32(float64(s)/div))
			}
			return out
		}
	}
	return func(out []float32, b []byte) []float32 {
		for p := 0; p+w*c <= len(b); p += w * c {
			var s float64
			for k := range c {
				s += floatSample(b[p+k*w:], w)
			}
			out = append(out, float32(s/float64(c)))
		}
		return out
	}
}

// pcmSample decodes one little-endian integer sample of width bytes
// (unsigned when 1 byte, centred on 128).
func pcmSample(p []byte, width int) int64 {
	switch width {
	case 1:
		return int64(p[0]) - 128
	case 2:
		return int64(int16(binary.LittleEndian.Uint16(p)))
	case 3:
		return int64(int32(uint32(p[0])<<8|uint32(p[1])<<16|uint32(p[2])<<24) >> 8)
	default:
		return int64(int32(binary.LittleEndian.Uint32(p)))
	}
}

// floatSample decodes one little-endian IEEE float of width 4 or 8.
func floatSample(p []byte, width int) float64 {
	if width == 4 {
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(p)))
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(p))
}
