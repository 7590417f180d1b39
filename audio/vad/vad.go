// Package vad finds where someone speaks in a stream of audio: an
// energy-based voice-activity detector with hysteresis, an adaptive noise
// floor, minimum speech and silence durations, and pre-roll, so that the
// utterance handed on starts before its first syllable crossed the threshold.
//
// A Detector is a pure state machine fed chunks of any size; it has no clock
// or goroutine of its own. Its time is the number of samples written, so the
// same audio always gives the same events whatever the chunking:
//
//	d, err := vad.New(vad.Config{SampleRate: 16000})
//	for chunk := range mic {
//		for _, ev := range d.Write(chunk) {
//			if ev.Kind == vad.End {
//				reply(ev.Audio) // pre-roll + speech + post-roll
//			}
//		}
//	}
//
// How it decides, every Frame (10 ms):
//
//   - level: the mean power of the last Smooth (30 ms) of audio, in dBFS
//     (full scale ±1 is 0 dBFS; digital silence is clamped to -100 dBFS);
//   - floor: the lowest level of the last FloorWindow (4 s) of FloorSmooth
//     (250 ms) means, never below MinFloorDB; at start-up the window holds
//     one reading of InitialFloorDB, so that speech at the very start of a
//     stream is still heard. Digital silence (a quarter frame or more of
//     exact zeros, as from a muted or starting device) does not count: it
//     says nothing about the room; while the window holds nothing else,
//     the floor is InitialFloorDB;
//   - onset: a level above floor+StartDB starts a candidate; if the level
//     stays at or above floor+StopDB for MinSpeech, speech has started at the
//     candidate's first frame (Start event). A dip below floor+StopDB sooner
//     drops the candidate (a click or a door is not speech);
//   - end: once speaking, MinSilence of levels below floor+StopDB ends the
//     utterance (End event, with its audio). Speech longer than MaxSpeech is
//     cut there (Forced).
//
// SetBoost raises both thresholds, e.g. while a loudspeaker plays.
//
// The floor follows the quietest moments, so it adapts to a room's noise
// within FloorWindow; a steady sound that starts suddenly (a fan) is heard as
// speech at first and becomes the floor after FloorWindow. Energy cannot tell
// a voice from other sounds of the same loudness: music, a TV or the
// assistant's own voice from a loudspeaker are "speech" to it.
package vad

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Config sets a Detector's thresholds. Zero values take the defaults named
// in each field's comment.
type Config struct {
	// SampleRate of the audio in Hz (required, 1000 to 384000).
	SampleRate int
	// Frame is the analysis step (default 10 ms).
	Frame time.Duration
	// Smooth is the span whose mean power is the level (default 30 ms;
	// rounded to whole frames, at least one).
	Smooth time.Duration
	// StartDB: an onset needs a level this many dB above the floor (default 15).
	StartDB float64
	// StopDB: speech goes on while the level is at least this many dB above
	// the floor (default 8; at most StartDB: the gap is the hysteresis).
	StopDB float64
	// MinSpeech is how long a candidate must last to be speech (default 120 ms).
	MinSpeech time.Duration
	// MinSilence is the pause that ends an utterance (default 700 ms).
	MinSilence time.Duration
	// PreRoll is the audio kept before the onset (default 300 ms).
	PreRoll time.Duration
	// PostRoll is the audio kept after the last speech frame (default
	// 200 ms; at most MinSilence).
	PostRoll time.Duration
	// MaxSpeech cuts an utterance that lasts longer (default 30 s).
	MaxSpeech time.Duration
	// FloorWindow is how far back the floor looks for the quietest level
	// (default 4 s).
	FloorWindow time.Duration
	// FloorSmooth is the span whose mean power the floor is taken from
	// (default 250 ms): the quietest moment of a fluctuating noise is well
	// below its usual level, its quarter-second mean is not.
	FloorSmooth time.Duration
	// MinFloorDB is the lowest floor, in dBFS (default -70): below it even
	// a quiet sound is not speech.
	MinFloorDB float64
	// InitialFloorDB is the floor assumed before the stream has shown a
	// quieter level (default -50 dBFS).
	InitialFloorDB float64
}

// Defaults.
const (
	DefaultFrame          = 10 * time.Millisecond
	DefaultSmooth         = 30 * time.Millisecond
	DefaultStartDB        = 15
	DefaultStopDB         = 8
	DefaultMinSpeech      = 120 * time.Millisecond
	DefaultMinSilence     = 700 * time.Millisecond
	DefaultPreRoll        = 300 * time.Millisecond
	DefaultPostRoll       = 200 * time.Millisecond
	DefaultMaxSpeech      = 30 * time.Second
	DefaultFloorWindow    = 4 * time.Second
	DefaultFloorSmooth    = 250 * time.Millisecond
	DefaultMinFloorDB     = -70
	DefaultInitialFloorDB = -50
)

// silenceDB is the level of digital silence.
const silenceDB float64 = -100

func (c *Config) defaults() {
	setDur := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	setDur(&c.Frame, DefaultFrame)
	setDur(&c.Smooth, DefaultSmooth)
	setDur(&c.MinSpeech, DefaultMinSpeech)
	setDur(&c.MinSilence, DefaultMinSilence)
	setDur(&c.PreRoll, DefaultPreRoll)
	setDur(&c.PostRoll, DefaultPostRoll)
	setDur(&c.MaxSpeech, DefaultMaxSpeech)
	setDur(&c.FloorWindow, DefaultFloorWindow)
	setDur(&c.FloorSmooth, DefaultFloorSmooth)
	if c.StartDB == 0 {
		c.StartDB = DefaultStartDB
	}
	if c.StopDB == 0 {
		c.StopDB = DefaultStopDB
	}
	if c.MinFloorDB == 0 {
		c.MinFloorDB = DefaultMinFloorDB
	}
	if c.InitialFloorDB == 0 {
		c.InitialFloorDB = DefaultInitialFloorDB
	}
}

// Validate reports the first field that is out of range (after defaults).
func (c Config) Validate() error {
	c.defaults()
	return c.validate()
}

func (c *Config) validate() error {
	switch {
	case c.SampleRate < 1000 || c.SampleRate > 384000:
		return fmt.Errorf("vad: SampleRate %d Hz: want 1000 to 384000", c.SampleRate)
	case c.Frame < time.Millisecond || c.Frame > 100*time.Millisecond:
		return fmt.Errorf("vad: Frame %v: want 1ms to 100ms", c.Frame)
	case c.Smooth < 0 || c.Smooth > time.Second:
		return fmt.Errorf("vad: Smooth %v: want 0 to 1s", c.Smooth)
	case c.FloorSmooth < 0 || c.FloorSmooth > 10*time.Second:
		return fmt.Errorf("vad: FloorSmooth %v: want 0 to 10s", c.FloorSmooth)
	case !(c.StartDB > 0) || c.StartDB > 100:
		return fmt.Errorf("vad: StartDB %g: want above 0 and at most 100", c.StartDB)
	case !(c.StopDB > 0) || c.StopDB > c.StartDB:
		return fmt.Errorf("vad: StopDB %g: want above 0 and at most StartDB (%g)", c.StopDB, c.StartDB)
	case c.MinSpeech < 0 || c.MinSilence < 0 || c.PreRoll < 0 || c.PostRoll < 0 || c.MaxSpeech < 0 || c.FloorWindow < 0:
		return errors.New("vad: durations must not be negative")
	case c.MinSilence < c.Frame:
		return fmt.Errorf("vad: MinSilence %v: want at least one Frame (%v)", c.MinSilence, c.Frame)
	case c.PostRoll > c.MinSilence:
		return fmt.Errorf("vad: PostRoll %v: want at most MinSilence (%v)", c.PostRoll, c.MinSilence)
	case c.MaxSpeech <= c.MinSpeech:
		return fmt.Errorf("vad: MaxSpeech %v: want more than MinSpeech (%v)", c.MaxSpeech, c.MinSpeech)
	case c.PreRoll > time.Minute || c.MaxSpeech > time.Hour || c.FloorWindow > time.Hour:
		return errors.New("vad: PreRoll (≤ 1m), MaxSpeech or FloorWindow (≤ 1h) too long")
	case c.FloorWindow < c.Frame:
		return fmt.Errorf("vad: FloorWindow %v: want at least one Frame (%v)", c.FloorWindow, c.Frame)
	case math.IsNaN(c.MinFloorDB) || c.MinFloorDB < silenceDB || c.MinFloorDB >= 0:
		return fmt.Errorf("vad: MinFloorDB %g: want -100 to below 0 dBFS", c.MinFloorDB)
	case math.IsNaN(c.InitialFloorDB) || c.InitialFloorDB < silenceDB || c.InitialFloorDB >= 0:
		return fmt.Errorf("vad: InitialFloorDB %g: want -100 to below 0 dBFS", c.InitialFloorDB)
	}
	return nil
}

// Kind is what an Event marks.
type Kind uint8

// Event kinds.
const (
	Start Kind = iota + 1 // speech has begun (at At)
	End                   // speech has ended (at At); Audio holds the utterance
)

func (k Kind) String() string {
	switch k {
	case Start:
		return "start"
	case End:
		return "end"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Event is a change of state.
type Event struct {
	Kind Kind
	// At is a sample offset from the start of the stream: for Start the
	// first sample of the onset frame (pre-roll not included), for End the
	// first sample after the last speech frame (post-roll not included).
	At int64
	// Audio (End only) is the utterance: from At of its Start minus
	// PreRoll (or the oldest sample kept) to At plus PostRoll. It is the
	// caller's to keep.
	Audio []float32
	// AudioStart (End only) is the stream offset of Audio[0].
	AudioStart int64
	// Forced (End only): the utterance was cut by MaxSpeech or Flush, not
	// ended by a pause.
	Forced bool
}

type state uint8

const (
	idle      state = iota
	candidate       // above StartDB, not yet MinSpeech long
	speaking
)

// Detector is an energy voice-activity detector. It is not safe for
// concurrent use.
type Detector struct {
	cfg   Config
	frame int // samples per frame
	// Durations in frames.
	minSpeech, minSilence, maxSpeech, window int
	// Durations in samples.
	preRoll, postRoll int

	boost float64

	// Analysis.
	part    []float32 // samples of the frame being filled
	pos     int64     // samples written
	frameN  int64     // frames analysed
	short   meanRing  // frame powers over Smooth: the level
	long    meanRing  // frame powers over FloorSmooth: the floor's input
	level   float64
	floorQ  []floorEntry // monotonic deque: the window's minimum at the front
	floorDB float64

	// Audio kept: buf[i] is the sample at stream offset bufStart+i.
	buf      []float32
	bufStart int64

	st        state
	candStart int64 // first sample of the onset frame
	candN     int   // frames since the onset
	silenceN  int   // consecutive frames below the stop threshold
	silStart  int64 // first sample of the silence run
}

type floorEntry struct {
	frame int64
	db    float64
}

// New returns a Detector for cfg.
func New(cfg Config) (*Detector, error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	frames := func(d time.Duration) int { // ceil(d / Frame)
		return int((d + cfg.Frame - 1) / cfg.Frame)
	}
	samples := func(d time.Duration) int {
		return int(int64(d) * int64(cfg.SampleRate) / int64(time.Second))
	}
	d := &Detector{
		cfg:        cfg,
		frame:      max(1, samples(cfg.Frame)),
		minSpeech:  max(1, frames(cfg.MinSpeech)),
		minSilence: max(1, frames(cfg.MinSilence)),
		maxSpeech:  frames(cfg.MaxSpeech),
		window:     max(1, frames(cfg.FloorWindow)),
		preRoll:    samples(cfg.PreRoll),
		postRoll:   samples(cfg.PostRoll),
	}
	round := func(x time.Duration) int { return max(1, int((x+cfg.Frame/2)/cfg.Frame)) }
	d.short = meanRing{p: make([]float64, 0, round(cfg.Smooth))}
	d.long = meanRing{p: make([]float64, 0, round(cfg.FloorSmooth))}
	d.part = make([]float32, 0, d.frame)
	d.Reset()
	d.floorQ = append(d.floorQ[:0], floorEntry{frame: 0, db: cfg.InitialFloorDB})
	d.floorDB = max(cfg.InitialFloorDB, cfg.MinFloorDB)
	d.level = silenceDB
	return d, nil
}

// Config returns the configuration in use, defaults filled in.
func (d *Detector) Config() Config { return d.cfg }

// SetBoost raises the start and stop thresholds by db (0 restores them);
// it applies from the next frame.
func (d *Detector) SetBoost(db float64) {
	if math.IsNaN(db) || db < 0 {
		db = 0
	}
	d.boost = db
}

// Speaking reports whether an utterance is in progress (after its Start).
func (d *Detector) Speaking() bool { return d.st == speaking }

// Voiced reports whether the last frame was speech: at or above the stop
// threshold while speaking (not in a pause that may yet end the utterance).
func (d *Detector) Voiced() bool { return d.st == speaking && d.silenceN == 0 }

// Floor returns the noise floor in dBFS.
func (d *Detector) Floor() float64 { return d.floorDB }

// Level returns the last frame's level in dBFS.
func (d *Detector) Level() float64 { return d.level }

// Pos returns the number of samples written.
func (d *Detector) Pos() int64 { return d.pos }

// Reset forgets the utterance in progress, if any, and any candidate; the
// noise floor and the stream position are kept, and so is the pre-roll, so
// that speech starting right after a Reset still gets its first syllable.
func (d *Detector) Reset() {
	d.st = idle
	d.candN, d.silenceN = 0, 0
	d.trim()
}

// Write analyses pcm and returns the events it completes, in order.
func (d *Detector) Write(pcm []float32) []Event {
	var evs []Event
	for len(pcm) > 0 {
		n := min(d.frame-len(d.part), len(pcm))
		d.part = append(d.part, pcm[:n]...)
		d.buf = append(d.buf, pcm[:n]...)
		d.pos += int64(n)
		pcm = pcm[n:]
		if len(d.part) == d.frame {
			if ev, ok := d.step(); ok {
				evs = append(evs, ev)
			}
			d.part = d.part[:0]
		}
	}
	return evs
}

// Flush ends the stream: an utterance in progress ends at the last sample
// written (Forced), a candidate is dropped. The Detector may be written to
// again afterwards.
func (d *Detector) Flush() []Event {
	if d.st != speaking {
		d.Reset()
		return nil
	}
	return []Event{d.cut()}
}

// cut ends the utterance in progress before its pause is long enough: at
// the silence run's start if one has begun, else at the last sample.
func (d *Detector) cut() Event {
	if d.silenceN > 0 {
		return d.end(d.silStart, min(d.silStart+int64(d.postRoll), d.pos), true)
	}
	return d.end(d.pos, d.pos, true)
}

// step analyses the frame in d.part, which ends at d.pos.
func (d *Detector) step() (Event, bool) {
	var p float64
	run, longest := 0, 0 // exact zeros in a row
	for _, x := range d.part {
		v := float64(x)
		if v != v || math.IsInf(v, 0) { // NaN or ±Inf: count as silence
			v = 0
		}
		if v == 0 {
			run++
			longest = max(longest, run)
			continue
		}
		run = 0
		p += v * v
	}
	p /= float64(len(d.part))
	// A quarter frame of exact zeros is a device's digital silence (a
	// microphone's own noise is never that quiet): such a frame, even one
	// half filled by sound, says nothing about the room's noise.
	digital := 4*longest >= len(d.part)
	level := toDB(d.short.add(p))
	d.level = level
	// The floor: the minimum of the slow level over the window (the
	// current frame included).
	f := d.frameN
	for len(d.floorQ) > 0 && d.floorQ[0].frame <= f-int64(d.window) {
		d.floorQ = d.floorQ[1:]
	}
	// Digital silence (a muted or starting device: no microphone is that
	// quiet) says nothing about the room's noise.
	if !digital {
		slow := toDB(d.long.add(p))
		for len(d.floorQ) > 0 && d.floorQ[len(d.floorQ)-1].db >= slow {
			d.floorQ = d.floorQ[:len(d.floorQ)-1]
		}
		d.floorQ = append(d.floorQ, floorEntry{frame: f, db: slow})
	}
	floor := d.cfg.InitialFloorDB
	if len(d.floorQ) > 0 {
		floor = d.floorQ[0].db
	}
	d.floorDB = max(floor, d.cfg.MinFloorDB)
	d.frameN++

	start := d.floorDB + d.cfg.StartDB + d.boost
	stop := d.floorDB + d.cfg.StopDB + d.boost
	frameStart := d.pos - int64(d.frame)
	switch d.st {
	case idle:
		if level > start {
			d.st, d.candStart, d.candN = candidate, frameStart, 1
			if d.candN >= d.minSpeech {
				return d.begin()
			}
		}
		d.trim()
	case candidate:
		if level < stop {
			d.st = idle
			d.trim()
			return Event{}, false
		}
		d.candN++
		if d.candN >= d.minSpeech {
			return d.begin()
		}
	case speaking:
		if level < stop {
			if d.silenceN == 0 {
				d.silStart = frameStart
			}
			d.silenceN++
			if d.silenceN >= d.minSilence {
				return d.end(d.silStart, d.silStart+int64(d.postRoll), false), true
			}
		} else {
			d.silenceN = 0
		}
		// Speech (not a pause that may yet end it) longer than MaxSpeech.
		if d.silenceN == 0 && d.frameN-d.frameOf(d.candStart) >= int64(d.maxSpeech) {
			return d.cut(), true
		}
	}
	return Event{}, false
}

// toDB converts a mean power to dBFS, digital silence to silenceDB.
func toDB(p float64) float64 {
	if p > 1e-10 {
		return 10 * math.Log10(p)
	}
	return silenceDB
}

// meanRing is the running mean of the last cap(p) values.
type meanRing struct {
	p   []float64
	i   int // next slot to overwrite once full
	sum float64
	n   int // values added since the last exact re-sum
}

// add appends v and returns the mean of the values held.
func (r *meanRing) add(v float64) float64 {
	if len(r.p) < cap(r.p) {
		r.p = append(r.p, v)
		r.sum += v
	} else {
		r.sum += v - r.p[r.i]
		r.p[r.i] = v
		r.i = (r.i + 1) % len(r.p)
	}
	if r.n++; r.n >= 64*cap(r.p) || r.sum < 0 {
		// Re-sum now and then: a running sum drifts by cancellation.
		r.n, r.sum = 0, 0
		for _, q := range r.p {
			r.sum += q
		}
	}
	return r.sum / float64(len(r.p))
}

// frameOf returns the index of the frame that starts at sample offset s.
func (d *Detector) frameOf(s int64) int64 { return s / int64(d.frame) }

func (d *Detector) begin() (Event, bool) {
	d.st = speaking
	d.silenceN = 0
	return Event{Kind: Start, At: d.candStart}, true
}

// end closes the utterance: speech ended at at, and the audio is kept up to
// keep (≤ d.pos).
func (d *Detector) end(at, keep int64, forced bool) Event {
	from := max(d.candStart-int64(d.preRoll), d.bufStart)
	audio := append([]float32(nil), d.buf[from-d.bufStart:keep-d.bufStart]...)
	d.st = idle
	d.candN, d.silenceN = 0, 0
	d.trim()
	return Event{Kind: End, At: at, Audio: audio, AudioStart: from, Forced: forced}
}

// trim drops audio that no utterance can need: when idle, only the
// pre-roll before the next possible onset (the current frame's start) is
// kept. It copies rarely: only once the buffer holds twice what it needs.
func (d *Detector) trim() {
	if d.st != idle {
		return
	}
	keep := int64(d.preRoll + d.frame + len(d.part))
	if n := int64(len(d.buf)); n > 2*keep+int64(d.frame) {
		drop := n - keep
		copy(d.buf, d.buf[drop:])
		d.buf = d.buf[:n-drop]
		d.bufStart += drop
	}
}
