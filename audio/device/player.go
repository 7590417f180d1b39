package device

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ebitengine/oto/v3"
	"github.com/jfreymuth/pulse"
	"github.com/jfreymuth/pulse/proto"

	"github.com/omni-pipe/omni-pipe/audio"
)

// PlayerOptions configure a Player. Zero values take the defaults.
type PlayerOptions struct {
	// SampleRate of the audio written (default 24000, the model's).
	SampleRate int
	// Device is a PulseAudio sink name (see List): the audio goes straight
	// to it. Empty: oto's default output (the PulseAudio server's default
	// sink, or ALSA's default device when no PulseAudio server answers).
	Device string
	// Server is a PulseAudio server string for Device (default:
	// $PULSE_SERVER, then the user's runtime socket). oto reads
	// $PULSE_SERVER itself.
	Server string
	// Prebuffer is the audio held before playing starts (default 100 ms),
	// or for at most that long when less arrives.
	Prebuffer time.Duration
	// Latency is the device's buffer (default 40 ms): audio that still
	// plays after a Flush.
	Latency time.Duration
}

// Player plays mono PCM on the sound card. Write queues and returns at
// once; Flush drops the queue (and what the device has not played yet, as
// far as the backend allows). It is safe for concurrent use.
type Player struct {
	rate    int
	j       *jitter
	out     output
	closeMu sync.Mutex
	closed  bool
}

var _ Sink = (*Player)(nil)

// output is a playback backend that pulls from the jitter buffer.
type output interface {
	// buffered returns the samples pulled but not yet handed to the
	// sound server.
	buffered() int
	// reset drops those samples, and any the server can still drop.
	reset()
	// err reports a failed device.
	err() error
	close() error
}

// OpenPlayer opens the sound output.
//
// Without Device it uses oto, which allows one output context per process:
// a second Player must use the same SampleRate (it shares the context).
func OpenPlayer(opts PlayerOptions) (*Player, error) {
	if opts.SampleRate == 0 {
		opts.SampleRate = 24000
	}
	if opts.Prebuffer == 0 {
		opts.Prebuffer = 100 * time.Millisecond
	}
	if opts.Latency == 0 {
		opts.Latency = 40 * time.Millisecond
	}
	switch {
	case opts.SampleRate < 8000 || opts.SampleRate > 192000:
		return nil, fmt.Errorf("device: player sample rate %d Hz: want 8000 to 192000", opts.SampleRate)
	case opts.Prebuffer < 0 || opts.Latency < 5*time.Millisecond || opts.Latency > 2*time.Second:
		return nil, fmt.Errorf("device: player prebuffer %v / latency %v: want a prebuffer ≥ 0 and a latency of 5ms to 2s", opts.Prebuffer, opts.Latency)
	}
	p := &Player{rate: opts.SampleRate, j: newJitter(samples(opts.Prebuffer, opts.SampleRate), opts.Prebuffer)}
	var err error
	if opts.Device != "" {
		p.out, err = newPulseOutput(p.j, opts)
	} else {
		p.out, err = newOtoOutput(p.j, opts)
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

// SampleRate returns the rate the player plays at.
func (p *Player) SampleRate() int { return p.rate }

// Write queues pcm (copied) for playing.
func (p *Player) Write(pcm []float32) error {
	p.closeMu.Lock()
	closed := p.closed
	p.closeMu.Unlock()
	if closed {
		return errors.New("play: the player is closed")
	}
	if err := p.out.err(); err != nil {
		return fmt.Errorf("play: %w", err)
	}
	p.j.write(pcm)
	return nil
}

// Flush drops the queued audio at once; at most the device's Latency of it
// still sounds.
func (p *Player) Flush() {
	p.j.flush()
	p.out.reset()
}

// Queued returns the audio written and not yet handed to the sound server.
func (p *Player) Queued() time.Duration {
	return duration(int64(p.j.queued()+p.out.buffered()), p.rate)
}

// Played returns the audio handed to the sound server so far (flushed
// audio excluded). The server plays it within Latency.
func (p *Player) Played() time.Duration {
	_, pulled, _ := p.j.counts()
	return duration(pulled-int64(p.out.buffered()), p.rate)
}

// Dropped returns the audio that flushes discarded before it played.
func (p *Player) Dropped() time.Duration {
	_, _, dropped := p.j.counts()
	return duration(dropped, p.rate)
}

// Close stops playing; queued audio is dropped.
func (p *Player) Close() error {
	p.closeMu.Lock()
	defer p.closeMu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.j.flush()
	return p.out.close()
}

// The oto backend. oto has one context per process, made on first use.
var otoShared struct {
	sync.Mutex
	ctx  *oto.Context
	rate int
	err  error
}

func otoContext(rate int, latency time.Duration) (*oto.Context, error) {
	otoShared.Lock()
	defer otoShared.Unlock()
	if otoShared.ctx == nil && otoShared.err == nil {
		ctx, ready, err := oto.NewContext(&oto.NewContextOptions{
			SampleRate: rate, ChannelCount: 1, Format: oto.FormatSignedInt16LE,
			BufferSize: latency, ApplicationName: "omni-pipe",
		})
		if err == nil {
			<-ready
			err = ctx.Err()
		}
		if err != nil {
			otoShared.err = noServer("open the sound output", err)
		} else {
			otoShared.ctx, otoShared.rate = ctx, rate
		}
	}
	if otoShared.err != nil {
		return nil, otoShared.err
	}
	if otoShared.rate != rate {
		return nil, fmt.Errorf("device: the sound output is open at %d Hz; oto allows one rate per process (asked %d Hz)", otoShared.rate, rate)
	}
	return otoShared.ctx, nil
}

type otoOutput struct {
	ctx *oto.Context
	p   *oto.Player
}

// otoReader feeds oto: 16-bit little-endian PCM from the jitter buffer,
// rounded as audio.PCM16 does for WAV files. It returns no bytes while the
// buffer holds (oto then polls again a millisecond later).
type otoReader struct {
	j   *jitter
	buf []float32
}

func (r *otoReader) Read(b []byte) (int, error) {
	n := len(b) / 2
	if cap(r.buf) < n {
		r.buf = make([]float32, n)
	}
	got := r.j.read(r.buf[:n])
	for i, v := range r.buf[:got] {
		s := audio.PCM16(v)
		b[2*i], b[2*i+1] = byte(s), byte(uint16(s)>>8)
	}
	return 2 * got, nil
}

func newOtoOutput(j *jitter, opts PlayerOptions) (*otoOutput, error) {
	ctx, err := otoContext(opts.SampleRate, opts.Latency)
	if err != nil {
		return nil, err
	}
	p := ctx.NewPlayer(&otoReader{j: j})
	// oto's own buffer defaults to 0.5 s, which a Flush could not reach.
	p.SetBufferSize(2 * samples(opts.Latency, opts.SampleRate))
	p.Play()
	return &otoOutput{ctx: ctx, p: p}, nil
}

func (o *otoOutput) buffered() int { return o.p.BufferedSize() / 2 }

func (o *otoOutput) reset() {
	o.p.Reset() // drops oto's buffer and stops reading
	o.p.Play()
}

func (o *otoOutput) err() error {
	if err := o.ctx.Err(); err != nil {
		return err
	}
	return o.p.Err()
}

func (o *otoOutput) close() error { return o.p.Close() }

// The PulseAudio backend, for a named sink.
type pulseOutput struct {
	c *pulse.Client
	s *pulse.PlaybackStream
}

func newPulseOutput(j *jitter, opts PlayerOptions) (*pulseOutput, error) {
	c, err := pulse.NewClient(pulse.ClientApplicationName("omni-pipe"), pulse.ClientServerString(opts.Server))
	if err != nil {
		return nil, noServer("connect to PulseAudio", err)
	}
	sink, err := c.SinkByID(opts.Device)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("output device %q: %w (omni-pipe mic --list-devices shows the sinks)", opts.Device, err)
	}
	// The server asks for audio as it plays; a silent gap is zeros.
	read := func(buf []float32) (int, error) {
		n := j.read(buf)
		clear(buf[n:])
		return len(buf), nil
	}
	s, err := c.NewPlayback(pulse.Float32Reader(read), pulse.PlaybackMono, pulse.PlaybackSampleRate(opts.SampleRate),
		pulse.PlaybackLatency(opts.Latency.Seconds()), pulse.PlaybackSink(sink), pulse.PlaybackMediaName("omni-pipe"))
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("play on %q: %w", opts.Device, err)
	}
	s.Start()
	if err := s.Error(); err != nil {
		s.Close()
		c.Close()
		return nil, fmt.Errorf("play on %q: %w", opts.Device, err)
	}
	return &pulseOutput{c: c, s: s}, nil
}

func (o *pulseOutput) buffered() int { return 0 }

func (o *pulseOutput) reset() {
	// Drop what the server holds too; an error only means less is dropped.
	_ = o.c.RawRequest(&proto.FlushPlaybackStream{StreamIndex: o.s.StreamIndex()}, nil)
}

func (o *pulseOutput) err() error {
	if o.s.Closed() {
		return errors.New("the PulseAudio playback stream was closed (server gone?)")
	}
	return nil
}

func (o *pulseOutput) close() error {
	o.s.Close()
	o.c.Close()
	return nil
}
