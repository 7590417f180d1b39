"""Write a speech-like question clip: the input of the real-size parity and speed runs.

A gliding harmonic series (8 partials at 1/k amplitude, the fundamental swinging ±30/140 of its
centre at 0.7 Hz), amplitude-modulated at a syllable rate (4, 5 or 6 Hz by seed), plus a little
Gaussian noise, peak-normalised to 0.3 of full scale, 16-bit mono PCM.

Usage: python3 speechlike_wav.py OUT.wav [F0_HZ 140] [SECONDS 4.9] [RATE 16000] [SEED 1]
The defaults are clip A of docs/parity.md; clip B is `210 3.7 24000 2`. Needs numpy.
"""
import sys
import wave

import numpy as np

out = sys.argv[1]
f0c = float(sys.argv[2]) if len(sys.argv) > 2 else 140.0
secs = float(sys.argv[3]) if len(sys.argv) > 3 else 4.9
sr = int(sys.argv[4]) if len(sys.argv) > 4 else 16000
seed = int(sys.argv[5]) if len(sys.argv) > 5 else 1

n = int(secs * sr)
t = np.arange(n) / sr
f0 = f0c + (30 / 140) * f0c * np.sin(2 * np.pi * 0.7 * t)
phase = 2 * np.pi * np.cumsum(f0) / sr
x = sum(np.sin(k * phase) / k for k in range(1, 9))
x *= 0.5 * (1 + np.sin(2 * np.pi * (4.0 + (seed - 1) % 3) * t))
x += 0.02 * np.random.default_rng(seed).standard_normal(n)
pcm = (0.3 * x / np.abs(x).max() * 32767).astype("<i2")
with wave.open(out, "wb") as w:
    w.setnchannels(1)
    w.setsampwidth(2)
    w.setframerate(sr)
    w.writeframes(pcm.tobytes())
