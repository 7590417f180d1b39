"""Which SDPA kernel runs liquid-audio's attentions, and where does it round? On a GPU.

1. The tiny fixture model (testdata/lfm2-audio-tiny) through the official code: an
   8-step greedy interleaved turn (6 text steps, 2 audio frames) on case3's text prompt,
   once with torch's default SDPA dispatch and once with each backend forced
   (torch.nn.attention.sdpa_kernel); a backend whose backbone states and depthformer
   logits equal the default run's bit for bit is the one the fixtures used.
2. Both attentions at the fixture and at the released sizes (random bf16 q, k, v): the
   default output against each forced backend, and against two float64 emulations of
   the output rounding: fp32 probabilities (softmax, then P·V) and the flash rounding
   point (p = exp(s - m) rounded to bf16 before P·V, the row sum over the fp32 p).

Usage: python3 sdpa_probe.py LIQUID_AUDIO_SRC FIXTURE_DIR
"""
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import refgen_common as rc  # noqa: E402

src, fixture = sys.argv[1:3]
rc.prepare_official(src)
print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name(), flush=True)
rc.stand_in_modules(mel=lambda sr, n_fft, n_mels=128, **_: np.zeros((n_mels, n_fft // 2 + 1), np.float32))  # unused
rc.stand_in_lfm2_cache_annotation()
from liquid_audio.model.lfm2_audio import LFM2AudioModel  # noqa: E402
from liquid_audio.processor import LFM2AudioProcessor  # noqa: E402

BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

# --- 1. the fixture model -------------------------------------------------------
model = LFM2AudioModel.from_pretrained(Path(fixture), device="cuda").eval()
proc = LFM2AudioProcessor.from_pretrained(Path(fixture), device="cuda").eval()
hid, dlog = [], []
model.lfm.register_forward_hook(lambda m, i, o: hid.append(o.last_hidden_state.float().cpu()))
for de in model.depth_embeddings:
    orig = de.get_logits
    de.get_logits = (lambda orig: lambda x: (lambda r: dlog.append(r.float().cpu()) or r)(orig(x)))(orig)


def turn(backend):
    hid.clear(); dlog.clear()
    chat = rc.begin_chat(proc)
    chat.add_text("What is the capital of France?"); chat.end_turn()
    chat.new_turn("assistant")
    with torch.no_grad():
        if backend is None:
            list(model.generate_interleaved(**chat, max_new_tokens=8))
        else:
            with sdpa_kernel([backend]):
                list(model.generate_interleaved(**chat, max_new_tokens=8))
    return torch.cat([h[0] for h in hid]), torch.stack(list(dlog))


base_h, base_l = turn(None)
print(f"fixture model: {base_h.shape[0]} backbone rows, {base_l.shape[0]} depthformer evaluations", flush=True)
for b in BACKENDS:
    try:
        h, l = turn(b)
        print(f"  forced {b.name:20s} backbone rows: {int((h != base_h).sum())} of {h.numel()} values differ from the"
              f" default run; depthformer logits: {int((l != base_l).sum())} of {l.numel()}", flush=True)
    except RuntimeError as e:
        print(f"  forced {b.name:20s} unavailable: {str(e).splitlines()[0][:100]}", flush=True)


# --- 2. the kernels at both sizes --------------------------------------------------
def emulate(q, k, v, causal_offset, flash):
    """float64 replay; causal_offset: query i sees keys j <= i + offset (None: all)."""
    qd, kd, vd = q.double(), k.double(), v.double()
    G = q.shape[1] // k.shape[1]
    kd, vd = kd.repeat_interleave(G, 1), vd.repeat_interleave(G, 1)
    s = (qd @ kd.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal_offset is not None:
        i = torch.arange(q.shape[2], device=q.device)[:, None]
        j = torch.arange(k.shape[2], device=q.device)[None, :]
        s = s.masked_fill(j > i + causal_offset, float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m).float()
    if flash:
        return ((p.to(torch.bfloat16).double() @ vd) / p.double().sum(-1, keepdim=True)).to(torch.bfloat16)
    return ((p / p.sum(-1, keepdim=True)).double() @ vd).to(torch.bfloat16)


g = torch.Generator(device="cuda").manual_seed(1)
cases = [  # name, heads, kv heads, head dim, query rows, keys, is_causal
    ("tiny backbone prefill (d 6)", 4, 2, 6, 93, 93, True),
    ("tiny backbone decode (d 6)", 4, 2, 6, 1, 120, False),
    ("tiny depthformer, 6th code (d 4)", 32, 8, 4, 1, 6, False),
    ("real backbone prefill (d 64)", 32, 8, 64, 100, 100, True),
    ("real backbone decode (d 64)", 32, 8, 64, 1, 120, False),
    ("real depthformer, 6th code (d 32)", 32, 8, 32, 1, 6, False),
]
for name, H, KV, d, nq, nk, causal in cases:
    q = (torch.randn(1, H, nq, d, device="cuda", generator=g) * 2).to(torch.bfloat16)
    k = (torch.randn(1, KV, nk, d, device="cuda", generator=g) * 2).to(torch.bfloat16)
    v = torch.randn(1, KV, nk, d, device="cuda", generator=g).to(torch.bfloat16)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    line = [f"{name}:"]
    for b in BACKENDS:
        try:
            with sdpa_kernel([b]):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            line.append(f"{b.name} {'==' if torch.equal(o, out) else '!='} default")
        except RuntimeError:
            line.append(f"{b.name} unavailable")
    off = 0 if causal else None
    for label, flash in (("fp32-probability emulation", False), ("flash-rounding emulation", True)):
        e = emulate(q, k, v, off, flash)
        line.append(f"{label}: {int((e != out).sum())} of {out.numel()} differ")
    print("  " + "; ".join(line), flush=True)
