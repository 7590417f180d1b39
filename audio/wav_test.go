package audio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// chunk is an extra RIFF chunk for test files.
type chunk struct {
	id   string
	body []byte
}

// wavSpec describes a test WAV; zero fields take plain defaults.
type wavSpec struct {
	magic      string // "RIFF" when empty
	form       string // "WAVE" when empty
	tag        uint16
	sub        uint32 // sub-format code when tag is WAVE_FORMAT_EXTENSIBLE
	badGUID    bool   // corrupt the sub-format GUID's tail
	channels   int
	rate       int
	bits       int
	validBits  int
	blockAlign int // derived from channels and bits when 0
	fmtSize    int // 16 (or 40 for extensible) when 0
	before     []chunk
	between    []chunk
	after      []chunk
	dataSize   *uint32 // the declared data size (the real size when nil)
	ds64Size   uint64  // RF64: the ds64 data size (the real size when 0)
	noData     bool
}

func le32(v uint32) []byte   { return binary.LittleEndian.AppendUint32(nil, v) }
func ptr32(v uint32) *uint32 { return &v }

func appendChunk(b []byte, c chunk) []byte {
	b = append(b, c.id...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(c.body)))
	b = append(b, c.body...)
	if len(c.body)%2 == 1 {
		b = append(b, 0) // pad byte
	}
	return b
}

// buildWAV assembles a WAV file around raw data bytes.
func buildWAV(s wavSpec, data []byte) []byte {
	if s.magic == "" {
		s.magic = "RIFF"
	}
	if s.form == "" {
		s.form = "WAVE"
	}
	if s.blockAlign == 0 {
		s.blockAlign = s.channels * ((s.bits + 7) / 8)
	}
	le := binary.LittleEndian
	fmtBody := le.AppendUint16(nil, s.tag)
	fmtBody = le.AppendUint16(fmtBody, uint16(s.channels))
	fmtBody = le.AppendUint32(fmtBody, uint32(s.rate))
	fmtBody = le.AppendUint32(fmtBody, uint32(s.rate*s.blockAlign))
	fmtBody = le.AppendUint16(fmtBody, uint16(s.blockAlign))
	fmtBody = le.AppendUint16(fmtBody, uint16(s.bits))
	if s.tag == tagExtensible {
		fmtBody = le.AppendUint16(fmtBody, 22)
		fmtBody = le.AppendUint16(fmtBody, uint16(s.validBits))
		fmtBody = le.AppendUint32(fmtBody, 0) // channel mask
		fmtBody = le.AppendUint32(fmtBody, s.sub)
		tail := ksGUIDTail
		if s.badGUID {
			tail[11] ^= 0xFF
		}
		fmtBody = append(fmtBody, tail[:]...)
	}
	if s.fmtSize != 0 {
		fmtBody = append(fmtBody, make([]byte, max(0, s.fmtSize-len(fmtBody)))...)[:s.fmtSize]
	}
	var body []byte
	if s.magic != "RIFF" {
		ds := le.AppendUint64(nil, 0)
		size := s.ds64Size
		if size == 0 {
			size = uint64(len(data))
		}
		ds = le.AppendUint64(ds, size)
		ds = le.AppendUint64(ds, 0)
		ds = le.AppendUint32(ds, 0)
		body = appendChunk(body, chunk{"ds64", ds})
	}
	for _, c := range s.before {
		body = appendChunk(body, c)
	}
	body = appendChunk(body, chunk{"fmt ", fmtBody})
	for _, c := range s.between {
		body = appendChunk(body, c)
	}
	if !s.noData {
		size := uint32(len(data))
		if s.magic != "RIFF" {
			size = 0xFFFFFFFF
		}
		if s.dataSize != nil {
			size = *s.dataSize
		}
		body = append(body, "data"...)
		body = le.AppendUint32(body, size)
		body = append(body, data...)
		if len(data)%2 == 1 && len(s.after) > 0 {
			body = append(body, 0)
		}
	}
	for _, c := range s.after {
		body = appendChunk(body, c)
	}
	out := []byte(s.magic)
	out = le.AppendUint32(out, uint32(4+len(body)))
	out = append(out, s.form...)
	return append(out, body...)
}

// pcm encodes integer samples in width-byte little-endian containers
// (unsigned for width 1).
func pcm(width int, v ...int64) []byte {
	var b []byte
	for _, x := range v {
		switch width {
		case 1:
			b = append(b, byte(x))
		case 2:
			b = binary.LittleEndian.AppendUint16(b, uint16(x))
		case 3:
			b = append(b, byte(x), byte(x>>8), byte(x>>16))
		case 4:
			b = binary.LittleEndian.AppendUint32(b, uint32(x))
		}
	}
	return b
}

func f32le(v ...float32) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

func f64le(v ...float64) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
	}
	return b
}

// writeTestWAV writes interleaved samples quantised for spec (PCM 16 or
// float 32), for benchmarks.
func writeTestWAV(w io.Writer, s wavSpec, inter []float32) error {
	var data []byte
	switch {
	case s.tag == tagPCM && s.bits == 16:
		data = PCM16LE(inter)
	case s.tag == tagFloat && s.bits == 32:
		data = f32le(inter...)
	default:
		return fmt.Errorf("writeTestWAV: unsupported spec %+v", s)
	}
	_, err := w.Write(buildWAV(s, data))
	return err
}

var mono16 = wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16}

func TestDecode(t *testing.T) {
	junk := chunk{"JUNK", make([]byte, 28)}
	list := chunk{"LIST", []byte("INFOISFT\x05\x00\x00\x00omni\x00")} // odd size: a pad byte follows
	bext := chunk{"bext", make([]byte, 602)}
	fact := chunk{"fact", le32(3)}
	odd := chunk{"odd ", []byte{1, 2, 3}}
	s16 := pcm(2, 0, 1, -1, 32767, -32768)
	want16 := []float32{0, 1.0 / 32768, -1.0 / 32768, 32767.0 / 32768, -1}
	tests := []struct {
		name string
		spec wavSpec
		data []byte
		rate int
		want []float32
	}{
		{"pcm16 mono", mono16, s16, 16000, want16},
		{"pcm8 unsigned", wavSpec{tag: tagPCM, channels: 1, rate: 8000, bits: 8}, pcm(1, 0, 128, 255, 1), 8000,
			[]float32{-1, 0, 127.0 / 128, -127.0 / 128}},
		{"pcm24", wavSpec{tag: tagPCM, channels: 1, rate: 48000, bits: 24}, pcm(3, -8388608, 8388607, 1, -1), 48000,
			[]float32{-1, 8388607.0 / 8388608, 1.0 / 8388608, -1.0 / 8388608}},
		{"pcm32", wavSpec{tag: tagPCM, channels: 1, rate: 48000, bits: 32}, pcm(4, -1<<31, 1<<31-1, 12345), 48000,
			[]float32{-1, float32(float64(1<<31-1) / (1 << 31)), float32(12345.0 / (1 << 31))}},
		{"pcm12 in 16-bit container", wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 12}, pcm(2, 0x7FF0, -0x8000), 16000,
			[]float32{float32(0x7FF0) / 32768, -1}},
		{"float32", wavSpec{tag: tagFloat, channels: 1, rate: 24000, bits: 32}, f32le(0.5, -0.25, 1.5, -3), 24000,
			[]float32{0.5, -0.25, 1.5, -3}},
		{"float64", wavSpec{tag: tagFloat, channels: 1, rate: 24000, bits: 64}, f64le(0.1, -1e-3), 24000,
			[]float32{float32(0.1), float32(-1e-3)}},
		{"stereo pcm16 mean", wavSpec{tag: tagPCM, channels: 2, rate: 44100, bits: 16}, pcm(2, 32767, -32768, 100, 300), 44100,
			[]float32{-0.5 / 32768, 200.0 / 32768}},
		{"three channels pcm16", wavSpec{tag: tagPCM, channels: 3, rate: 16000, bits: 16}, pcm(2, 1, 2, 4, -3, -3, -3), 16000,
			[]float32{float32(7.0 / 3 / 32768), -3.0 / 32768}},
		{"stereo float32 mean", wavSpec{tag: tagFloat, channels: 2, rate: 16000, bits: 32}, f32le(0.5, 0.25, -1, 1), 16000,
			[]float32{0.375, 0}},
		{"extensible pcm16 stereo", wavSpec{tag: tagExtensible, sub: tagPCM, channels: 2, rate: 16000, bits: 16, validBits: 16},
			pcm(2, 2, 4), 16000, []float32{3.0 / 32768}},
		{"extensible float32", wavSpec{tag: tagExtensible, sub: tagFloat, channels: 1, rate: 16000, bits: 32, validBits: 32},
			f32le(0.75), 16000, []float32{0.75}},
		{"extensible 24 valid bits in 32", wavSpec{tag: tagExtensible, sub: tagPCM, channels: 1, rate: 96000, bits: 32, validBits: 24},
			pcm(4, 0x7FFFFF00, -0x80000000), 96000, []float32{float32(float64(0x7FFFFF00) / (1 << 31)), -1}},
		{"chunks before and after fmt", wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16,
			before: []chunk{list, junk, bext}, between: []chunk{fact, odd}, after: []chunk{list}}, s16, 16000, want16},
		{"odd-sized data chunk then more chunks", wavSpec{tag: tagPCM, channels: 1, rate: 8000, bits: 8, after: []chunk{list}},
			pcm(1, 0, 255, 128), 8000, []float32{-1, 127.0 / 128, 0}},
		{"streamed: data size 0", wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, dataSize: ptr32(0)}, s16, 16000, want16},
		{"streamed: data size 0xFFFFFFFF", wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, dataSize: ptr32(0xFFFFFFFF)},
			append(s16, 7), 16000, want16}, // a trailing partial frame is dropped
		{"piped arecord: data size 0x7FFFFF00", wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, dataSize: ptr32(0x7FFFFF00)},
			s16, 16000, want16},
		{"piped arecord: data size 2^31", wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, dataSize: ptr32(0x80000000)},
			append(s16, 7), 16000, want16},
		{"partial trailing frame", wavSpec{tag: tagPCM, channels: 2, rate: 16000, bits: 16}, pcm(2, 2, 4, 6), 16000,
			[]float32{3.0 / 32768}},
		{"block align 0", wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, blockAlign: 0}, s16, 16000, want16},
		{"fmt chunk with extra bytes", wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, fmtSize: 18}, s16, 16000, want16},
		{"RF64 with ds64", wavSpec{magic: "RF64", tag: tagPCM, channels: 1, rate: 16000, bits: 16}, s16, 16000, want16},
		{"BW64 without ds64 size", wavSpec{magic: "BW64", tag: tagPCM, channels: 1, rate: 16000, bits: 16, dataSize: ptr32(10)},
			s16, 16000, want16},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := buildWAV(tc.spec, tc.data)
			for _, reader := range []struct {
				name string
				r    io.Reader
			}{{"bytes", bytes.NewReader(file)}, {"one byte at a time", iotest.OneByteReader(bytes.NewReader(file))}} {
				clip, err := Decode(reader.r, DecodeOptions{})
				if err != nil {
					t.Fatalf("%s: %v", reader.name, err)
				}
				if clip.SampleRate != tc.rate {
					t.Errorf("%s: rate %d, want %d", reader.name, clip.SampleRate, tc.rate)
				}
				if !equalF32(clip.Samples, tc.want) {
					t.Errorf("%s: samples %v, want %v", reader.name, clip.Samples, tc.want)
				}
			}
		})
	}
}

func equalF32(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) && a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestDecodeErrors(t *testing.T) {
	s16 := pcm(2, 1, 2, 3, 4)
	header := buildWAV(mono16, nil)[:12]
	tests := []struct {
		name    string
		file    []byte
		opts    DecodeOptions
		want    error
		message string // a substring the error must name
	}{
		{"empty input", nil, DecodeOptions{}, ErrEmpty, "no input bytes"},
		{"short magic", []byte("RIF"), DecodeOptions{}, ErrTruncated, "RIFF header"},
		{"short header", []byte("RIFF\x00\x00"), DecodeOptions{}, ErrTruncated, "RIFF header"},
		{"not riff", []byte("hello, world!"), DecodeOptions{}, ErrNotWAV, `"hell"`},
		{"webm", []byte("\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01\x42\xf7\x81"), DecodeOptions{}, ErrNotWAV, "this is WebM/Matroska"},
		{"ogg", []byte("OggS\x00\x02\x00\x00\x00\x00\x00\x00"), DecodeOptions{}, ErrNotWAV, "this is Ogg (Opus or Vorbis)"},
		{"flac", []byte("fLaC\x00\x00\x00\x22\x10\x00\x10\x00"), DecodeOptions{}, ErrNotWAV, "this is FLAC"},
		{"mp3 with ID3", []byte("ID3\x04\x00\x00\x00\x00\x00\x23TSSE"), DecodeOptions{}, ErrNotWAV, "this is MP3"},
		{"mp3 frame", []byte("\xff\xfb\x90\x64\x00\x00\x00\x00\x00\x00\x00\x00"), DecodeOptions{}, ErrNotWAV, "this is MP3"},
		{"aac adts", []byte("\xff\xf1\x50\x80\x02\x1f\xfc\x21\x00\x00\x00\x00"), DecodeOptions{}, ErrNotWAV, "this is AAC (ADTS)"},
		{"m4a", []byte("\x00\x00\x00\x20ftypM4A \x00\x00"), DecodeOptions{}, ErrNotWAV, "this is MP4/M4A"},
		{"aiff", []byte("FORM\x00\x00\x10\x00AIFF"), DecodeOptions{}, ErrNotWAV, "this is AIFF"},
		{"caf", []byte("caff\x00\x01\x00\x00desc"), DecodeOptions{}, ErrNotWAV, "this is CAF"},
		{"amr", []byte("#!AMR\n\x3c\x00\x00\x00\x00\x00"), DecodeOptions{}, ErrNotWAV, "this is AMR"},
		{"riff but not wave", buildWAV(wavSpec{form: "AVI ", tag: tagPCM, channels: 1, rate: 16000, bits: 16}, s16), DecodeOptions{}, ErrNotWAV, `"AVI "`},
		{"big-endian RIFX", append([]byte("RIFX"), header[4:]...), DecodeOptions{}, ErrUnsupported, "RIFX"},
		{"mu-law", buildWAV(wavSpec{tag: 7, channels: 1, rate: 8000, bits: 8}, []byte{1, 2}), DecodeOptions{}, ErrUnsupported, "μ-law (format 7"},
		{"a-law", buildWAV(wavSpec{tag: 6, channels: 1, rate: 8000, bits: 8}, []byte{1, 2}), DecodeOptions{}, ErrUnsupported, "A-law (format 6"},
		{"mp3", buildWAV(wavSpec{tag: 0x55, channels: 2, rate: 44100, bits: 0, blockAlign: 1}, []byte{1, 2}), DecodeOptions{}, ErrUnsupported, "MP3 (format 85"},
		{"adpcm", buildWAV(wavSpec{tag: 2, channels: 1, rate: 8000, bits: 4, blockAlign: 256}, []byte{1, 2}), DecodeOptions{}, ErrUnsupported, "Microsoft ADPCM"},
		{"unknown codec", buildWAV(wavSpec{tag: 0x1234, channels: 1, rate: 8000, bits: 8}, []byte{1, 2}), DecodeOptions{}, ErrUnsupported, "0x1234"},
		{"extensible mu-law", buildWAV(wavSpec{tag: tagExtensible, sub: 7, channels: 1, rate: 8000, bits: 8}, []byte{1, 2}), DecodeOptions{}, ErrUnsupported, "μ-law"},
		{"extensible unknown GUID", buildWAV(wavSpec{tag: tagExtensible, sub: 1, badGUID: true, channels: 1, rate: 8000, bits: 16}, s16), DecodeOptions{}, ErrUnsupported, "sub-format GUID"},
		{"extensible fmt too short", buildWAV(wavSpec{tag: tagExtensible, sub: 1, channels: 1, rate: 8000, bits: 16, fmtSize: 18}, s16), DecodeOptions{}, ErrMalformed, "need 40"},
		{"valid bits above container", buildWAV(wavSpec{tag: tagExtensible, sub: 1, channels: 1, rate: 8000, bits: 16, validBits: 24}, s16), DecodeOptions{}, ErrMalformed, "valid bits"},
		{"zero channels", buildWAV(wavSpec{tag: tagPCM, channels: 0, rate: 16000, bits: 16, blockAlign: 2}, s16), DecodeOptions{}, ErrMalformed, "zero channels"},
		{"too many channels", buildWAV(wavSpec{tag: tagPCM, channels: 300, rate: 16000, bits: 16}, s16), DecodeOptions{}, ErrUnsupported, "300 channels"},
		{"sample rate 0", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 0, bits: 16}, s16), DecodeOptions{}, ErrMalformed, "sample rate 0"},
		{"sample rate too low", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 100, bits: 16}, s16), DecodeOptions{}, ErrUnsupported, "sample rate 100 Hz"},
		{"sample rate absurd", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 4000000000, bits: 16}, s16), DecodeOptions{}, ErrUnsupported, "sample rate 4000000000 Hz"},
		{"fmt chunk too small", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, fmtSize: 14}, s16), DecodeOptions{}, ErrMalformed, "fmt chunk of 14 bytes"},
		{"block align not a multiple of channels", buildWAV(wavSpec{tag: tagPCM, channels: 2, rate: 16000, bits: 16, blockAlign: 3}, s16), DecodeOptions{}, ErrMalformed, "block align 3"},
		{"bits above container", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 24, blockAlign: 2}, s16), DecodeOptions{}, ErrMalformed, "24 bits per sample in a 2-byte container"},
		{"5-byte pcm", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 40}, make([]byte, 10)), DecodeOptions{}, ErrUnsupported, "5-byte integer"},
		{"16-bit float", buildWAV(wavSpec{tag: tagFloat, channels: 1, rate: 16000, bits: 16}, s16), DecodeOptions{}, ErrUnsupported, "2-byte IEEE float"},
		{"second fmt chunk", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, between: []chunk{{"fmt ", make([]byte, 16)}}}, s16), DecodeOptions{}, ErrMalformed, "second fmt"},
		{"data before fmt", append(append(append([]byte(nil), header...), "data\x02\x00\x00\x00\x01\x02"...), buildWAV(mono16, nil)[12:]...), DecodeOptions{}, ErrMalformed, "data chunk before fmt"},
		{"no data chunk", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, noData: true}, nil), DecodeOptions{}, ErrTruncated, "no data chunk"},
		{"no chunks", header, DecodeOptions{}, ErrTruncated, "no fmt or data chunk"},
		{"truncated chunk header", append(append([]byte(nil), header...), "fmt \x10\x00"...), DecodeOptions{}, ErrTruncated, "chunk header"},
		{"truncated fmt chunk", append(append([]byte(nil), header...), "fmt \x10\x00\x00\x00\x01\x00"...), DecodeOptions{}, ErrTruncated, "fmt chunk"},
		{"truncated skipped chunk", append(append([]byte(nil), header...), "LIST\x00\x10\x00\x00abc"...), DecodeOptions{}, ErrTruncated, `"LIST" chunk`},
		{"truncated data", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, dataSize: ptr32(1000)}, s16), DecodeOptions{}, ErrTruncated, "declares 1000 bytes, only 8"},
		{"empty data chunk", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, dataSize: ptr32(1)}, []byte{9}), DecodeOptions{}, ErrEmpty, "no whole sample frame"},
		{"streamed, no frames", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, dataSize: ptr32(0)}, nil), DecodeOptions{}, ErrEmpty, "no whole sample frame"},
		{"too long by header", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 1000, bits: 16, dataSize: ptr32(2002)}, s16), DecodeOptions{MaxDuration: time.Second}, ErrTooLong, "1001 frames"},
		{"too long streamed", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 1000, bits: 16, dataSize: ptr32(0xFFFFFFFF)}, make([]byte, 2004)), DecodeOptions{MaxDuration: time.Second}, ErrTooLong, "more than 1000 frames"},
		{"too long with a placeholder size", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 1000, bits: 16, dataSize: ptr32(0x7FFFFF00)}, make([]byte, 2004)), DecodeOptions{MaxDuration: time.Second}, ErrTooLong, "more than 1000 frames"},
		{"truncated just under the placeholders", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, dataSize: ptr32(0x7FFEFFFE)}, s16), DecodeOptions{MaxDuration: 24 * time.Hour}, ErrTruncated, "only 8 present"},
		{"too many frames", buildWAV(mono16, s16), DecodeOptions{MaxFrames: 3}, ErrTooLong, "4 frames"},
		{"NaN sample", buildWAV(wavSpec{tag: tagFloat, channels: 1, rate: 16000, bits: 32}, f32le(0, float32(math.NaN()))), DecodeOptions{}, ErrMalformed, "non-finite sample NaN at frame 1"},
		{"float64 out of float32 range", buildWAV(wavSpec{tag: tagFloat, channels: 1, rate: 16000, bits: 64}, f64le(1e300)), DecodeOptions{}, ErrMalformed, "non-finite"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clip, err := DecodeBytes(tc.file, tc.opts)
			if err == nil {
				t.Fatalf("decoded %d samples, want error %v", len(clip.Samples), tc.want)
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("error %q is not %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.message) {
				t.Errorf("error %q does not say %q", err, tc.message)
			}
		})
	}
}

// A read error other than EOF is passed on, wrapped.
func TestDecodeReadError(t *testing.T) {
	file := buildWAV(mono16, pcm(2, 1, 2, 3, 4))
	for _, n := range []int{0, 6, 20, 46} {
		r := io.MultiReader(bytes.NewReader(file[:n]), iotest.ErrReader(iotest.ErrTimeout))
		_, err := Decode(r, DecodeOptions{})
		if !errors.Is(err, iotest.ErrTimeout) {
			t.Errorf("error after %d bytes: %v, want %v", n, err, iotest.ErrTimeout)
		}
	}
}

// Allocation follows the bytes present, not the sizes a header claims.
func TestDecodeLyingHeaderAllocation(t *testing.T) {
	tests := []struct {
		name string
		file []byte
	}{
		{"data size 4 GB", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: MaxSampleRate, bits: 16, dataSize: ptr32(0xFFFFFFF0)}, make([]byte, 100))},
		{"RF64 data size 2^60", buildWAV(wavSpec{magic: "RF64", tag: tagPCM, channels: 1, rate: 16000, bits: 16, ds64Size: 1 << 60}, make([]byte, 100))},
		{"JUNK chunk 4 GB", buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, before: []chunk{{"JUNK", nil}}}, nil)[:20]},
	}
	// A chunk header claiming 4 GB.
	tests[2].file = append(tests[2].file[:12:12], "JUNK\xff\xff\xff\xff"...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, err := DecodeBytes(tc.file, DecodeOptions{MaxDuration: time.Hour})
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrTooLong) {
				t.Errorf("error %v, want truncated or too long", err)
			}
			// 64 KiB read buffer + 64 Ki samples + bufio: well under 2 MiB.
			if d := after.TotalAlloc - before.TotalAlloc; d > 2<<20 {
				t.Errorf("allocated %d bytes for a %d-byte file", d, len(tc.file))
			}
		})
	}
}

func TestPCM16(t *testing.T) {
	tests := []struct {
		in   float32
		want int16
	}{
		{0, 0},
		{1, 32767},
		{-1, -32767},
		{1.5, 32767}, // clipped, never wrapped
		{-1.5, -32767},
		{float32(math.Inf(1)), 32767},
		{float32(math.Inf(-1)), -32767},
		{float32(math.NaN()), 0},
		{0.5, 16383}, // 16383.5 truncated toward zero, as numpy's astype(int16)
		{-0.5, -16383},
		{0.1, 3276}, // float32(0.1·32767) = 3276.7002
		{-0.1, -3276},
		{1e-5, 0},
		{-1e-5, 0},
		{0.99999, 32766}, // float32(0.99999·32767) = 32766.672
	}
	for _, tc := range tests {
		if got := PCM16(tc.in); got != tc.want {
			t.Errorf("PCM16(%v) = %d, want %d", tc.in, got, tc.want)
		}
	}
	b := PCM16LE([]float32{1.5, -1.5, 0.5})
	if want := []byte{0xFF, 0x7F, 0x01, 0x80, 0xFF, 0x3F}; !bytes.Equal(b, want) {
		t.Errorf("PCM16LE = % x, want % x", b, want)
	}
}

func TestWriteWAVRoundTrip(t *testing.T) {
	x := []float32{0, 0.25, -0.25, 1, -1, 1.5, -1.5, 0.123456, -0.987654, 1e-6}
	var buf bytes.Buffer
	if err := WriteWAV(&buf, 24000, x); err != nil {
		t.Fatal(err)
	}
	if got, want := buf.Len(), 44+2*len(x); got != want {
		t.Fatalf("file is %d bytes, want %d", got, want)
	}
	clip, err := DecodeBytes(buf.Bytes(), DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if clip.SampleRate != 24000 || len(clip.Samples) != len(x) {
		t.Fatalf("decoded %d Hz × %d, want 24000 × %d", clip.SampleRate, len(clip.Samples), len(x))
	}
	for i, v := range x {
		c := max(-1, min(1, v))
		// Encoding truncates c·32767 (error < 1/32767) and decoding divides
		// by 32768 (relative error 1/32768): |c - y| < 2/32768.
		if d := math.Abs(float64(c - clip.Samples[i])); d >= 2.0/32768 {
			t.Errorf("sample %d: %v came back as %v (|Δ| = %g)", i, v, clip.Samples[i], d)
		}
		if want := float32(PCM16(v)) / 32768; clip.Samples[i] != want {
			t.Errorf("sample %d: decoded %v, want %v", i, clip.Samples[i], want)
		}
	}
	if err := WriteWAV(io.Discard, 10, x); err == nil {
		t.Error("WriteWAV accepted a 10 Hz rate")
	}
}

// A streaming header (sizes 0xFFFFFFFF) followed by PCM decodes to EOF.
func TestWAVHeaderStreaming(t *testing.T) {
	h := WAVHeader(24000, -1)
	if got := binary.LittleEndian.Uint32(h[40:]); got != 0xFFFFFFFF {
		t.Fatalf("streaming data size %#x", got)
	}
	x := []float32{0.5, -0.5, 0.25}
	clip, err := DecodeBytes(append(h, PCM16LE(x)...), DecodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range x {
		if want := float32(PCM16(v)) / 32768; clip.Samples[i] != want {
			t.Errorf("sample %d = %v, want %v", i, clip.Samples[i], want)
		}
	}
	if h := WAVHeader(16000, 10); binary.LittleEndian.Uint32(h[4:]) != 36+20 || binary.LittleEndian.Uint32(h[40:]) != 20 {
		t.Errorf("sized header: RIFF %d, data %d", binary.LittleEndian.Uint32(h[4:]), binary.LittleEndian.Uint32(h[40:]))
	}
}

// fuzzSeeds are valid and nearly valid files for FuzzDecode.
func fuzzSeeds() map[string][]byte {
	s16 := pcm(2, 0, 1000, -1000, 32767, -32768, 5)
	return map[string][]byte{
		"pcm16":        buildWAV(mono16, s16),
		"pcm8":         buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 8000, bits: 8}, []byte{0, 128, 255}),
		"pcm24_stereo": buildWAV(wavSpec{tag: tagPCM, channels: 2, rate: 48000, bits: 24}, pcm(3, 1, -1, 8388607, -8388608)),
		"float32":      buildWAV(wavSpec{tag: tagFloat, channels: 1, rate: 24000, bits: 32}, f32le(0.5, -0.5)),
		"float64":      buildWAV(wavSpec{tag: tagFloat, channels: 2, rate: 22050, bits: 64}, f64le(0.5, -0.5)),
		"extensible":   buildWAV(wavSpec{tag: tagExtensible, sub: tagPCM, channels: 2, rate: 16000, bits: 32, validBits: 24}, pcm(4, 1<<20, -1<<20)),
		"chunks": buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16,
			before: []chunk{{"LIST", []byte("INFOabc")}}, between: []chunk{{"fact", le32(6)}}, after: []chunk{{"JUNK", []byte{1}}}}, s16),
		"streamed":   buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, dataSize: ptr32(0xFFFFFFFF)}, s16),
		"rf64":       buildWAV(wavSpec{magic: "RF64", tag: tagPCM, channels: 1, rate: 16000, bits: 16}, s16),
		"mulaw":      buildWAV(wavSpec{tag: 7, channels: 1, rate: 8000, bits: 8}, []byte{1, 2}),
		"truncated":  buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, dataSize: ptr32(100)}, s16),
		"lying_size": buildWAV(wavSpec{tag: tagPCM, channels: 1, rate: 16000, bits: 16, dataSize: ptr32(0xFFFFFFF0)}, s16),
	}
}

var writeCorpus = flag.Bool("write-fuzz-corpus", false, "rewrite testdata/fuzz/FuzzDecode from fuzzSeeds")

// TestWriteFuzzCorpus regenerates the committed seed corpus when asked to
// (go test -run WriteFuzzCorpus -write-fuzz-corpus); otherwise it checks
// that every seed is in the corpus.
func TestWriteFuzzCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	for name, b := range fuzzSeeds() {
		path := filepath.Join(dir, name)
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if *writeCorpus {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("seed %s missing from the corpus (run with -write-fuzz-corpus): %v", name, err)
		} else if string(got) != body {
			t.Errorf("seed %s differs from the corpus (run with -write-fuzz-corpus)", name)
		}
	}
}

// FuzzDecode: any input gives either a valid clip or one of the package's
// errors, never a panic, and a clip within the limits.
func FuzzDecode(f *testing.F) {
	for _, b := range fuzzSeeds() {
		f.Add(b)
	}
	const limit = 5 * time.Second
	f.Fuzz(func(t *testing.T, b []byte) {
		clip, err := DecodeBytes(b, DecodeOptions{MaxDuration: limit})
		if err != nil {
			for _, e := range []error{ErrNotWAV, ErrUnsupported, ErrMalformed, ErrTruncated, ErrTooLong, ErrEmpty} {
				if errors.Is(err, e) {
					return
				}
			}
			t.Fatalf("error %v is none of the package's", err)
		}
		if clip.SampleRate < MinSampleRate || clip.SampleRate > MaxSampleRate {
			t.Fatalf("rate %d out of bounds", clip.SampleRate)
		}
		if len(clip.Samples) == 0 || len(clip.Samples) > int(limit.Seconds()*float64(clip.SampleRate)) {
			t.Fatalf("%d samples at %d Hz", len(clip.Samples), clip.SampleRate)
		}
		if len(clip.Samples) > len(b) {
			t.Fatalf("%d samples from %d bytes", len(clip.Samples), len(b))
		}
		for i, v := range clip.Samples {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("sample %d is %v", i, v)
			}
		}
	})
}
