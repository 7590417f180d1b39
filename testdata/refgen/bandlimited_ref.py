"""Make a band-limited reference case (8 kHz speech) with the official code, on a GPU.

Loads the tiny fixture model (testdata/lfm2-audio-tiny: config.json, model.safetensors,
the tokenizer, mimi.safetensors built as mimi_config.json says) with liquid-audio
v1.0.0's LFM2AudioModel.from_pretrained, decimates liquid-audio's assets/question.wav
from 16 kHz to 8 kHz in float64 (scipy.signal.resample_poly(x, 1, 2), Kaiser-windowed
FIR; then cast to float32: telephone-band speech, nothing above 4 kHz), and records one
greedy 60-step speech-to-speech turn in the reference-case format of
testdata/lfm2-audio-tiny (README there): ChatState.add_audio resamples the clip to
16 kHz with torchaudio on CUDA (stored as wav_16k), so the mel bins above 4 kHz hold
only the resampler's and the STFT's leakage.

Usage: python3 bandlimited_ref.py LIQUID_AUDIO_SRC QUESTION_WAV FIXTURE_DIR OUT_FILE [RATE]
(RATE 16000 keeps the clip as loaded: case1_question_16k's input, for checking that a
fixture case is reproduced.)
Needs torch, torchaudio, transformers (5.x), accelerate, einops, safetensors, numpy,
scipy. librosa is replaced by a numpy Slaney mel filterbank, as for the fixtures
(refgen_common.py, in this folder, with what the scripts here share).
"""
import json
import os
import sys
from pathlib import Path

import numpy as np
import scipy.signal
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import refgen_common as rc  # noqa: E402

src, question, fixture, out_file = sys.argv[1:5]
steps = 60
rc.prepare_official(src)
rc.stand_in_modules()
rc.stand_in_lfm2_cache_annotation()

import torchaudio  # noqa: E402
from liquid_audio.moshi.models import loaders  # noqa: E402
from liquid_audio.model.lfm2_audio import LFM2AudioModel  # noqa: E402
from liquid_audio.processor import LFM2AudioProcessor  # noqa: E402

model = LFM2AudioModel.from_pretrained(Path(fixture), device="cuda").eval()
proc = LFM2AudioProcessor.from_pretrained(Path(fixture), device="cuda").eval()
# The tiny Mimi: get_mimi with the fixture's kwargs (mimi_config.json).
mc = json.load(open(os.path.join(fixture, "mimi_config.json")))
loaders._seanet_kwargs = mc["seanet_kwargs"]
loaders._quantizer_kwargs = mc["quantizer_kwargs"]
loaders._transformer_kwargs = mc["transformer_kwargs"]
proc.__dict__["mimi"] = loaders.get_mimi(os.path.join(fixture, "mimi.safetensors"), device="cuda", num_codebooks=8)
print("attn", model.lfm.config._attn_implementation, flush=True)

samples, rate, channels = rc.read_wav(question)
assert rate == 16000 and channels == 1
pcm16 = samples.astype(np.float64) / 32768
sr = int(sys.argv[5]) if len(sys.argv) > 5 else 8000
pcm = (scipy.signal.resample_poly(pcm16, sr, 16000) if sr != 16000 else pcm16).astype(np.float32)
wav = torch.from_numpy(pcm)[None]

rec = {}
chat = rc.begin_chat(proc)
with torch.no_grad():
    w16 = torchaudio.functional.resample(wav.cuda(), sr, 16000)  # as ChatState.add_audio (a no-op at 16 kHz)
    mel, _ = proc.audio(w16, torch.tensor([w16.shape[1]], device="cuda"))
rec["input_wav"] = wav.float()
rec["input_sample_rate"] = torch.tensor([sr])
if sr != 16000:
    rec["wav_16k"] = w16.float().cpu()
rec["mel_f32"] = mel[0].float().cpu()
rec["mel"] = mel[0].to(torch.bfloat16).float().cpu()
chat.add_audio(wav, sr)
chat.end_turn()
chat.new_turn("assistant")
assert torch.equal(chat.audio_in.float().cpu(), rec["mel"]), "add_audio's mel differs from the recorded one"
rc.record_prompt(rec, chat)

n, pattern, n_frames = rc.record_greedy_turn(model, proc, chat, rec, steps)
rc.save_case(rec, out_file, steps, "testdata/refgen/bandlimited_ref.py")
print("steps", n, "pattern", pattern, "frames decoded", n_frames, "mel frames", rec["mel"].shape[1], flush=True)
