"""Make a REAL-SIZE LFM2-Audio reference case with the official code, on a GPU.

Builds liquid-audio's LFM2AudioModel at the released LFM2-Audio-1.5B sizes with
seeded random weights (the rules of the tiny fixtures: >=2-D weights N(0,
1/fan_in), biases N(0, 0.05), norm weights 1+N(0, 0.1), embeddings N(0, s)),
casts it to bf16, saves the checkpoint folder as released (config.json,
model.safetensors, the fixture tokenizer, and a random full-size Mimi as
tokenizer-e351c8d8-checkpoint125.safetensors), reloads it with
LFM2AudioModel.from_pretrained, and records one greedy speech-to-speech turn
in the reference-case format of testdata/lfm2-audio-tiny (README there), so
that `omni-pipe parity --model OUT --reference OUT/case_real.safetensors`
compares omni-pipe with the official code at the real shapes (head sizes 64
and 32: flash attention on the GPU).

Usage: python3 real_size_ref.py LIQUID_AUDIO_SRC QUESTION_WAV FIXTURE_DIR OUT_DIR [STEPS]
Needs torch, torchaudio, transformers (5.x), accelerate, einops, safetensors,
numpy. librosa is replaced by a small numpy Slaney mel filterbank below.
"""
import importlib.machinery
import importlib.util
import json
import math
import os
import shutil
import sys
import wave

import numpy as np
import torch

src, question, fixture, out = sys.argv[1:5]
steps = int(sys.argv[5]) if len(sys.argv) > 5 else 40
os.makedirs(out, exist_ok=True)
sys.path.insert(0, src)
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
os.environ.setdefault("NO_TORCH_COMPILE", "1")


# --- stand-ins for modules the GPU box lacks (not on the inference path) ---
def mel_filters(sr, n_fft, n_mels=128, fmin=0.0, fmax=None, norm="slaney", dtype=np.float32, **_):
    """librosa.filters.mel (Slaney scale and norm), in numpy."""
    fmax = sr / 2 if fmax is None else fmax

    def hz_to_mel(f):
        f = np.asanyarray(f, dtype=np.float64)
        mels = f / (200.0 / 3)
        min_log_hz = 1000.0
        min_log_mel = min_log_hz / (200.0 / 3)
        logstep = np.log(6.4) / 27.0
        return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-12) / min_log_hz) / logstep, mels)

    def mel_to_hz(m):
        m = np.asanyarray(m, dtype=np.float64)
        freqs = m * (200.0 / 3)
        min_log_hz = 1000.0
        min_log_mel = min_log_hz / (200.0 / 3)
        logstep = np.log(6.4) / 27.0
        return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), freqs)

    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    weights = np.zeros((n_mels, 1 + n_fft // 2), dtype=np.float64)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    if norm == "slaney":
        enorm = 2.0 / (mel_f[2: n_mels + 2] - mel_f[:n_mels])
        weights *= enorm[:, np.newaxis]
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

from liquid_audio import moshi  # noqa: E402
from liquid_audio.model.lfm2_audio import LFM2AudioModel  # noqa: E402
from liquid_audio.processor import ChatState, LFM2AudioProcessor  # noqa: E402
from safetensors.torch import save_file, load_file  # noqa: E402

# --- the released sizes -----------------------------------------------------
cfg = json.load(open(os.path.join(fixture, "config.json")))
cfg["lfm"].update({
    "block_dim": 2048, "block_ff_dim": 12288, "block_multiple_of": 256, "conv_dim": 2048, "conv_dim_out": 2048,
    "full_attn_idxs": [2, 5, 8, 10, 12, 14], "hidden_size": 2048, "intermediate_size": 12288,
    "num_attention_heads": 32, "num_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "vocab_size": 65536,
})
cfg["encoder"].update({"n_layers": 17, "d_model": 512, "subsampling_conv_channels": 256, "n_heads": 8})
cfg["depthformer"].update({"layers": 6, "dim": 1024})
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(fixture, f), os.path.join(out, f))

# --- random weights, seeded ---------------------------------------------------
torch.manual_seed(20251129)
from liquid_audio.model.lfm2_audio import LFM2AudioConfig, DepthformerConfig  # noqa: E402
from liquid_audio.model.conformer.encoder import ConformerEncoderConfig  # noqa: E402
from transformers import Lfm2Config  # noqa: E402

c2 = dict(cfg)
conf = LFM2AudioConfig(lfm=Lfm2Config(**c2.pop("lfm")), encoder=ConformerEncoderConfig(**c2.pop("encoder")),
                       depthformer=DepthformerConfig(**c2.pop("depthformer")), **c2)
model = LFM2AudioModel(conf)
g = torch.Generator().manual_seed(20251129)
with torch.no_grad():
    for name, p in model.named_parameters():
        if name == "lfm.embed_tokens.weight":
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        elif name == "audio_embedding.embedding.weight":
            p.copy_(torch.randn(p.shape, generator=g) * 0.35)
        elif name.startswith("depth_embeddings.") and name.endswith("embedding.weight"):
            p.copy_(torch.randn(p.shape, generator=g) * 0.25)
        elif "pos_bias" in name:
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        elif p.dim() >= 2:
            fan_in = math.prod(p.shape[1:])
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
        elif name.endswith("bias"):
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        else:
            p.copy_(1 + torch.randn(p.shape, generator=g) * 0.1)
    for name, b in model.named_buffers():
        if name.endswith("running_mean"):
            b.copy_(torch.randn(b.shape, generator=g) * 0.1)
        elif name.endswith("running_var"):
            b.copy_(torch.exp(torch.randn(b.shape, generator=g) * 0.2))
model = model.to(torch.bfloat16)
sd = {k: v.contiguous() for k, v in model.state_dict().items()
      if not (k.startswith("depth_embeddings.") and k.endswith("to_logits.weight"))}
save_file(sd, os.path.join(out, "model.safetensors"))
print("params stored", sum(v.numel() for v in sd.values()), flush=True)
del model

mimi = moshi.models.loaders.get_mimi(None, device="cpu")
gm = torch.Generator().manual_seed(20251130)
with torch.no_grad():
    for name, p in mimi.named_parameters():
        if p.dim() >= 2:
            fan_in = math.prod(p.shape[1:])
            if "convtr" in name:  # ConvTranspose1d [in, out/groups, k], stride k/2: in/groups·k/stride
                fan_in = 2 if "upsample" in name else 2 * p.shape[0]
            p.copy_(torch.randn(p.shape, generator=gm) / math.sqrt(fan_in))
        elif name.endswith("bias"):
            p.copy_(torch.randn(p.shape, generator=gm) * 0.05)
        elif name.endswith(".scale"):
            p.copy_(torch.rand(p.shape, generator=gm) * 0.4 + 0.2)
        else:
            p.copy_(1 + torch.randn(p.shape, generator=gm) * 0.1)
    for name, b in mimi.named_buffers():
        if name.endswith("cluster_usage"):
            b.copy_(torch.rand(b.shape, generator=gm) * 1.5 + 0.5)
        elif name.endswith("embedding_sum"):
            usage = dict(mimi.named_buffers())[name.replace("embedding_sum", "cluster_usage")]
            b.copy_(torch.randn(b.shape, generator=gm) * usage[:, None])
        elif name.endswith("_initialized"):
            b.fill_(1)
save_file({k: v.contiguous() for k, v in mimi.state_dict().items()},
          os.path.join(out, "tokenizer-e351c8d8-checkpoint125.safetensors"))
del mimi

# --- the official load path ---------------------------------------------------
from pathlib import Path  # noqa: E402

model = LFM2AudioModel.from_pretrained(Path(out), device="cuda").eval()
proc = LFM2AudioProcessor.from_pretrained(Path(out), device="cuda").eval()

with wave.open(question) as w:
    sr = w.getframerate()
    pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768
wav = torch.from_numpy(pcm)[None]

rec = {}
system = "Respond with interleaved text and audio."
chat = ChatState(proc)
chat.new_turn("system"); chat.add_text(system); chat.end_turn()
chat.new_turn("user")
with torch.no_grad():
    w16 = wav.cuda()
    mel, _ = proc.audio(w16, torch.tensor([w16.shape[1]], device="cuda"))
rec["input_wav"] = wav.float()
rec["input_sample_rate"] = torch.tensor([sr])
rec["mel_f32"] = mel[0].float().cpu()
rec["mel"] = mel[0].to(torch.bfloat16).float().cpu()
chat.add_audio(wav, sr)
chat.end_turn()
chat.new_turn("assistant")
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
tl_idx, tl = [], []
al_idx, al = [], []


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
    mc = torch.stack([c for _, c in frames], 1)  # [8, T]
    ai_of = {}
    k = 0
    for s, c in enumerate(outs):
        if c.numel() > 1:
            ai_of[s] = k; k += 1
    rec["mimi_codes"] = mc
    rec["mimi_frame_idx"] = torch.tensor([ai_of[s] for s, _ in frames])
    mimi = proc.mimi
    with torch.no_grad():
        rec["wav_mimi_batch"] = mimi.decode(mc[None].cuda())[0].float().cpu()
        parts = []
        with mimi.streaming(1):
            for i in range(mc.shape[1]):
                parts.append(mimi.decode(mc[None, :, i:i + 1].cuda())[0])
        rec["wav_mimi_stream"] = torch.cat(parts, -1).float().cpu()

meta = {"system": system, "turns": json.dumps([{"role": "user", "audio": "input_wav"}]),
        "generation": json.dumps({"mode": "interleaved", "max_new_tokens": steps, "text": "greedy", "audio": "greedy",
                                  "interleaved_n_text": 6, "interleaved_n_audio": 12}),
        "made_by": "testdata/refgen/real_size_ref.py"}
save_file({k: v.contiguous() if v.dtype in (torch.int64,) else v.float().contiguous() for k, v in rec.items()},
          os.path.join(out, "case_real.safetensors"), metadata=meta)
print("steps", n, "pattern", "".join("T" if m == 1 else "A" for m in mod), "frames decoded", len(frames), flush=True)
