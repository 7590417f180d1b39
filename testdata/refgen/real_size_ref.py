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
numpy. librosa is replaced by a small numpy Slaney mel filterbank (refgen_common.py, in
this folder, with what the scripts here share).
"""
import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import refgen_common as rc  # noqa: E402

src, question, fixture, out = sys.argv[1:5]
steps = int(sys.argv[5]) if len(sys.argv) > 5 else 40
os.makedirs(out, exist_ok=True)
rc.prepare_official(src)
rc.stand_in_modules()
rc.stand_in_lfm2_cache_annotation()

import torchaudio  # noqa: E402
from liquid_audio import moshi  # noqa: E402
from liquid_audio.model.lfm2_audio import LFM2AudioModel  # noqa: E402
from liquid_audio.processor import LFM2AudioProcessor  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

# --- the released sizes -----------------------------------------------------
cfg = rc.released_size_config(fixture)
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(fixture, f), os.path.join(out, f))

# --- random weights, seeded ---------------------------------------------------
torch.manual_seed(20251129)
conf = rc.audio_config(cfg)
model = LFM2AudioModel(conf)
g = torch.Generator().manual_seed(20251129)
rc.init_audio_model_weights(model, lambda shape: torch.randn(shape, generator=g))
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
model = LFM2AudioModel.from_pretrained(Path(out), device="cuda").eval()
proc = LFM2AudioProcessor.from_pretrained(Path(out), device="cuda").eval()

pcm16, sr, _ = rc.read_wav(question)
pcm = pcm16.astype(np.float32) / 32768
wav = torch.from_numpy(pcm)[None]

rec = {}
chat = rc.begin_chat(proc)
with torch.no_grad():
    # As ChatState.add_audio: resampled to 16 kHz first (a no-op at 16 kHz).
    w16 = torchaudio.functional.resample(wav.cuda(), sr, 16000) if sr != 16000 else wav.cuda()
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
rc.save_case(rec, os.path.join(out, "case_real.safetensors"), steps, "testdata/refgen/real_size_ref.py")
print("steps", n, "pattern", pattern, "frames decoded", n_frames, flush=True)
