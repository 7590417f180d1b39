// omni-pipe microphone worklet: takes the capture's first channel at the
// AudioContext's rate, resamples it to 24 kHz (linear interpolation after a
// one-pole low-pass when downsampling) and posts Int16Array chunks of 40 ms
// (960 samples) to the page, which sends them as input_audio_buffer.append.
class MicResampler extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / 24000; // input samples per output sample
    this.pos = 0; // position of the next output sample, in input samples from prev
    this.prev = 0; // the last input sample of the previous block
    this.lp = 0; // low-pass state
    this.alpha = this.step > 1 ? 1 / this.step : 1;
    this.out = new Int16Array(960);
    this.n = 0;
  }
  process(inputs) {
    const ch = inputs[0] && inputs[0][0];
    if (!ch) return true;
    for (let i = 0; i < ch.length; i++) {
      this.lp += this.alpha * (ch[i] - this.lp);
      const x = this.lp;
      // Emit every output sample that falls between prev (at -1) and x (at 0).
      while (this.pos <= 1) {
        const v = this.prev + (x - this.prev) * this.pos;
        const s = Math.max(-1, Math.min(1, v));
        this.out[this.n++] = s < 0 ? s * 32768 : s * 32767;
        if (this.n === this.out.length) {
          this.port.postMessage(this.out.buffer, [this.out.buffer]);
          this.out = new Int16Array(960);
          this.n = 0;
        }
        this.pos += this.step;
      }
      this.pos -= 1;
      this.prev = x;
    }
    return true;
  }
}
registerProcessor("mic-resampler", MicResampler);
