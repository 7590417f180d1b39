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
scipy. librosa is replaced by a numpy Slaney mel filterbank, as for the fixtures.
"""
import importlib.machinery
import importlib.util
import json
import math
import os
import sys
import wave
from pathlib import Path

import numpy as np
import scipy.signal
import torch

src, question, fixture, out_file = sys.argv[1:5]
steps = 60
sys.path.insert(0, src)
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
os.environ.setdefault("NO_TORCH_COMPILE", "1")


def mel_filters(sr, n_fft, n_mels=128, fmin=0.0, fmax=None, norm="slaney", dtype=np.float32, **_):
    """librosa.filters.mel (Slaney scale and norm), in numpy."""
    fmax = sr / 2 if fmax is None else fmax

    def hz_to_mel(f):
        f = np.asanyarray(f, dtype=np.float64)
        min_log_mel = 1000.0 / (200.0 / 3)
        logstep = np.log(6.4) / 27.0
        return np.where(f >= 1000.0, min_log_mel + np.log(np.maximum(f, 1e-12) / 1000.0) / logstep, f / (200.0 / 3))

    def mel_to_hz(m):
        m = np.asanyarray(m, dtype=np.float64)
        min_log_mel = 1000.0 / (200.0 / 3)
        logstep = np.log(6.4) / 27.0
        return np.where(m >= min_log_mel, 1000.0 * np.exp(logstep * (m - min_log_mel)), m * (200.0 / 3))

    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    weights = np.zeros((n_mels, 1 + n_fft // 2), dtype=np.float64)
    for i in range(n_mels):
        weights[i] = np.maximum(0, np.minimum(-ramps[i] / fdiff[i], ramps[i + 2] / fdiff[i + 1]))
    if norm == "slaney":
        weights *= (2.0 / (mel_f[2: n_mels + 2] - mel_f[:n_mels]))[:, np.newaxis]
    return weights.astype(dtype)


def stub(name):
    m = importlib.util.module_from_spec(importlib.machinery.ModuleSpec(name, None))
    sys.modules[name] = m
    return m


librosa = stub("librosa")
librosa.filters = stub("librosa.filters")
librosa.filters.mel = mel_filters
try:
    import soxr  # noqa: F401
except ImportError:
    stub("soxr")
import transformers.models.lfm2.modeling_lfm2 as ml  # noqa: E402

if not hasattr(ml, "Lfm2HybridConvCache"):
    ml.Lfm2HybridConvCache = object  # annotation only in liquid-audio

import torchaudio  # noqa: E402
from liquid_audio.moshi.models import loaders  # noqa: E402
from liquid_audio.model.lfm2_audio import LFM2AudioModel  # noqa: E402
from liquid_audio.processor import ChatState, LFM2AudioProcessor  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

model = LFM2AudioModel.from_pretrained(Path(fixture), device="cuda").eval()
proc = LFM2AudioProcessor.from_pretrained(Path(fixture), device="cuda").eval()
# The tiny Mimi: get_mimi with the fixture's kwargs (mimi_config.json).
mc = json.load(open(os.path.join(fixture, "mimi_config.json")))
loaders._seanet_kwargs = mc["seanet_kwargs"]
loaders._quantizer_kwargs = mc["quantizer_kwargs"]
loaders._transformer_kwargs = mc["transformer_kwargs"]
proc.__dict__["mimi"] = loaders.get_mimi(os.path.join(fixture, "mimi.safetensors"), device="cuda", num_codebooks=8)
print("attn", model.lfm.config._attn_implementation, flush=True)

with wave.open(question) as w:
    assert w.getframerate() == 16000 and w.getsampwidth() == 2 and w.getnchannels() == 1
    pcm16 = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float64) / 32768
sr = int(sys.argv[5]) if len(sys.argv) > 5 else 8000
pcm = (scipy.signal.resample_poly(pcm16, sr, 16000) if sr != 16000 else pcm16).astype(np.float32)
wav = torch.from_numpy(pcm)[None]

rec = {}
system = "Respond with interleaved text and audio."
chat = ChatState(proc)
chat.new_turn("system"); chat.add_text(system); chat.end_turn()
chat.new_turn("user")
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
rec["prompt_text_ids"] = chat.text[0].cpu()
rec["prompt_modality"] = chat.modality_flag[0].cpu()
rec["prompt_audio_out"] = chat.audio_out.cpu()
rec["prompt_audio_in_lens"] = chat.audio_in_lens.cpu()

hid, enc, ada, dlog = [], [], [], []
model.lfm.register_forward_hook(lambda m, i, o: hid.append(o.last_hidden_state[0].float().cpu()))
model.conformer.register_forward_hook(lambda m, i, o: enc.append(o[0][0].mT.float().cpu()))
model.audio_adapter.register_forward_hook(lambda m, i, o: ada.append(o.float().cpu()))
for i, de in enumerate(model.depth_embeddings):
    orig = de.get_logits
    de.get_logits = (lambda orig: lambda x: dlog.append(orig(x)) or dlog[-1])(orig)

outs = []
with torch.no_grad():
    for t in model.generate_interleaved(**chat, max_new_tokens=steps, text_temperature=None, audio_temperature=None):
        outs.append(t.cpu())
emb = model.lfm.embed_tokens.weight
rec["encoder_out"], rec["adapter_out"] = enc[0], ada[0]
rec["prefill_hidden"] = hid[0]
rows = [hid[0][-1]] + [h[-1] for h in hid[1:]]
n = len(rows)
mod, yl, tok, codes, margins_t, margins_a = [], [], [], [], [], []
ai = 0
tl_idx, tl, al_idx, al = [], [], [], []


def margin(l):
    v = torch.topk(l.float(), 2).values
    return float(v[0] - v[1])


for s in range(n):
    if s < len(outs) and outs[s].numel() > 1:
        mod.append(3); yl.append(1); tok.append(-1); codes.append(outs[s].tolist())
        lg = [dlog[ai * 8 + i] for i in range(8)]
        ai += 1
        margins_t.append(float("nan")); margins_a.append([margin(x) for x in lg])
        if len(al_idx) < 2:
            al_idx.append(s); al.append(torch.stack([x.float().cpu() for x in lg]))
    else:
        logits = torch.nn.functional.linear(rows[s].cuda().to(torch.bfloat16), emb)
        t = int(outs[s].item()) if s < len(outs) else int(logits.argmax())
        assert t == int(logits.argmax()), (s, t)
        mod.append(1); yl.append(1 if s < len(outs) else 0); tok.append(t); codes.append([-1] * 8)
        margins_t.append(margin(logits)); margins_a.append([float("nan")] * 8)
        if s == 0:
            rec["prefill_text_logits"] = logits.float().cpu()
        if len(tl_idx) < 8:
            tl_idx.append(s); tl.append(logits.float().cpu())
rec["step_modality"] = torch.tensor(mod)
rec["step_yielded"] = torch.tensor(yl)
rec["step_text_token"] = torch.tensor(tok)
rec["step_codes"] = torch.tensor(codes)
rec["step_hidden"] = torch.stack(rows)
rec["step_text_margin"] = torch.tensor(margins_t)
rec["step_audio_margin"] = torch.tensor(margins_a)
rec["text_logits_step_idx"] = torch.tensor(tl_idx); rec["text_logits"] = torch.stack(tl)
if al:
    rec["audio_logits_step_idx"] = torch.tensor(al_idx); rec["audio_logits"] = torch.stack(al)

frames = [(s, c) for s, c in enumerate(outs) if c.numel() > 1 and not (c == 2048).any()]
if frames:
    mcodes = torch.stack([c for _, c in frames], 1)  # [8, T]
    ai_of, k = {}, 0
    for s, c in enumerate(outs):
        if c.numel() > 1:
            ai_of[s] = k; k += 1
    rec["mimi_codes"] = mcodes
    rec["mimi_frame_idx"] = torch.tensor([ai_of[s] for s, _ in frames])
    mimi = proc.mimi
    with torch.no_grad():
        rec["wav_mimi_batch"] = mimi.decode(mcodes[None].cuda())[0].float().cpu()
        parts = []
        with mimi.streaming(1):
            for i in range(mcodes.shape[1]):
                parts.append(mimi.decode(mcodes[None, :, i:i + 1].cuda())[0])
        rec["wav_mimi_stream"] = torch.cat(parts, -1).float().cpu()

meta = {"system": system, "turns": json.dumps([{"role": "user", "audio": "input_wav"}]),
        "generation": json.dumps({"mode": "interleaved", "max_new_tokens": steps, "text": "greedy", "audio": "greedy",
                                  "interleaved_n_text": 6, "interleaved_n_audio": 12}),
        "made_by": "testdata/refgen/bandlimited_ref.py"}
save_file({k: v.contiguous() if v.dtype in (torch.int64,) else v.float().contiguous() for k, v in rec.items()},
          out_file, metadata=meta)
print("steps", n, "pattern", "".join("T" if m == 1 else "A" for m in mod), "frames decoded", len(frames),
      "mel frames", rec["mel"].shape[1], flush=True)
