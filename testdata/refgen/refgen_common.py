"""What the reference scripts of this folder share (bandlimited_ref.py, real_size_ref.py,
sdpa_probe.py, speed_ref.py): the setup that runs liquid-audio v1.0.0 from its src/ folder,
stand-ins for modules the GPU box lacks, the released LFM2-Audio-1.5B sizes, the seeded
weight rules of the fixtures, WAV reading, and the greedy reference-case recorder.

A script imports it from its own folder:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import refgen_common
Only numpy and the standard library are imported here at load; torch and liquid-audio are
imported inside the functions that need them, so that a script can install the stand-ins
before liquid-audio is imported.
"""
import copy
import importlib
import importlib.machinery
import importlib.util
import json
import math
import os
import sys
import wave

import numpy as np

SYSTEM = "Respond with interleaved text and audio."


def prepare_official(src):
    """Puts liquid-audio's src/ folder first on sys.path and runs the reference in plain fp32
    matmuls: TF32 off, and NO_TORCH_COMPILE=1 (moshi's lazy torch.compile off) unless the
    variable is already set."""
    import torch

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
    """An empty module registered in sys.modules as name."""
    m = importlib.util.module_from_spec(importlib.machinery.ModuleSpec(name, None))
    sys.modules[name] = m
    return m


class SentencePieceProcessor:  # the sentencepiece stand-in's: annotation / unused loader path only
    def __init__(self, *a, **k):
        raise RuntimeError("sentencepiece stand-in")


def stand_in_modules(mel=mel_filters, keep_installed_librosa=False, sentencepiece=False):
    """Registers stand-ins for modules liquid-audio imports but does not use on the inference path.

    librosa: a module whose librosa.filters.mel is mel (the only librosa function the reference
    calls), always, or only when librosa does not import if keep_installed_librosa. soxr: an
    empty module when it does not import. sentencepiece (if asked): a module whose
    SentencePieceProcessor raises, when it does not import. Returns what was stood in, in words.
    """
    stubbed = []
    installed = False
    if keep_installed_librosa:
        try:
            importlib.import_module("librosa")
            installed = True
        except ImportError:
            pass
    if not installed:
        lib = stub("librosa")
        lib.filters = stub("librosa.filters")
        lib.filters.mel = mel
        stubbed.append("librosa (librosa.filters.mel in numpy)")
    try:
        importlib.import_module("soxr")
    except ImportError:
        stub("soxr")
        stubbed.append("soxr")
    if sentencepiece:
        try:
            importlib.import_module("sentencepiece")
        except ImportError:
            sp = stub("sentencepiece")
            sp.SentencePieceProcessor = SentencePieceProcessor
            stubbed.append("sentencepiece")
    return stubbed


def stand_in_lfm2_cache_annotation():
    """transformers 5.x has no Lfm2HybridConvCache, which liquid-audio names only in an
    annotation: sets it to object. Reports whether it had to."""
    import transformers.models.lfm2.modeling_lfm2 as ml

    if hasattr(ml, "Lfm2HybridConvCache"):
        return False
    ml.Lfm2HybridConvCache = object  # annotation only in liquid-audio
    return True


# --- the released sizes and the seeded weights --------------------------------
def released_size_config(fixture):
    """FIXTURE/config.json (the tiny fixtures' config) with the LFM2-Audio-1.5B sizes."""
    cfg = json.load(open(os.path.join(fixture, "config.json")))
    cfg["lfm"].update({
        "block_dim": 2048, "block_ff_dim": 12288, "block_multiple_of": 256, "conv_dim": 2048, "conv_dim_out": 2048,
        "full_attn_idxs": [2, 5, 8, 10, 12, 14], "hidden_size": 2048, "intermediate_size": 12288,
        "num_attention_heads": 32, "num_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "vocab_size": 65536,
    })
    cfg["encoder"].update({"n_layers": 17, "d_model": 512, "subsampling_conv_channels": 256, "n_heads": 8})
    cfg["depthformer"].update({"layers": 6, "dim": 1024})
    return cfg


def audio_config(cfg):
    """liquid-audio's LFM2AudioConfig of a config.json dictionary (cfg is left as it is)."""
    from liquid_audio.model.conformer.encoder import ConformerEncoderConfig
    from liquid_audio.model.lfm2_audio import DepthformerConfig, LFM2AudioConfig
    from transformers import Lfm2Config

    c2 = copy.deepcopy(cfg)
    return LFM2AudioConfig(lfm=Lfm2Config(**c2.pop("lfm")), encoder=ConformerEncoderConfig(**c2.pop("encoder")),
                           depthformer=DepthformerConfig(**c2.pop("depthformer")), **c2)


def init_audio_model_weights(model, randn):
    """Fills an LFM2AudioModel with the fixtures' seeded random values, in named_parameters
    then named_buffers order, one randn(shape) (float32 normal samples) per tensor: embeddings
    N(0, s) (s_text 0.5, s_audio 0.35, s_depth 0.25), conformer pos_bias N(0, 0.1), >=2-D
    weights N(0, 1/fan_in), biases N(0, 0.05), other 1-D weights 1+N(0, 0.1), batch-norm
    running means N(0, 0.1) and variances exp(N(0, 0.2))."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "lfm.embed_tokens.weight":
                p.copy_(randn(p.shape) * 0.5)
            elif name == "audio_embedding.embedding.weight":
                p.copy_(randn(p.shape) * 0.35)
            elif name.startswith("depth_embeddings.") and name.endswith("embedding.weight"):
                p.copy_(randn(p.shape) * 0.25)
            elif "pos_bias" in name:
                p.copy_(randn(p.shape) * 0.1)
            elif p.dim() >= 2:
                p.copy_(randn(p.shape) / math.sqrt(math.prod(p.shape[1:])))
            elif name.endswith("bias"):
                p.copy_(randn(p.shape) * 0.05)
            else:
                p.copy_(1 + randn(p.shape) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(randn(b.shape) * 0.1)
            elif name.endswith("running_var"):
                b.copy_(torch.exp(randn(b.shape) * 0.2))


# --- input ---------------------------------------------------------------------
def read_wav(path):
    """A 16-bit PCM WAV file's samples as int16 (little-endian, channels interleaved when more
    than one), with its sample rate and channel count; another sample width is a ValueError."""
    with wave.open(path) as w:
        sr, nch, sw = w.getframerate(), w.getnchannels(), w.getsampwidth()
        raw = w.readframes(w.getnframes())
    if sw != 2:
        raise ValueError(f"{path}: {8 * sw}-bit samples, want 16-bit PCM")
    return np.frombuffer(raw, dtype="<i2"), sr, nch


# --- a greedy reference case (the format of testdata/lfm2-audio-tiny) -------------
def begin_chat(proc):
    """A ChatState with the system turn (SYSTEM) and the user turn begun."""
    from liquid_audio.processor import ChatState

    chat = ChatState(proc)
    chat.new_turn("system")
    chat.add_text(SYSTEM)
    chat.end_turn()
    chat.new_turn("user")
    return chat


def record_prompt(rec, chat):
    """Stores the prompt of a chat ended with the assistant turn begun."""
    rec["prompt_text_ids"] = chat.text[0].cpu()
    rec["prompt_modality"] = chat.modality_flag[0].cpu()
    rec["prompt_audio_out"] = chat.audio_out.cpu()
    rec["prompt_audio_in_lens"] = chat.audio_in_lens.cpu()


def _margin(logits):
    """The top logit minus the second."""
    import torch

    v = torch.topk(logits.float(), 2).values
    return float(v[0] - v[1])


def record_greedy_turn(model, proc, chat, rec, steps):
    """Runs steps of greedy generate_interleaved on the GPU and stores what the reference case
    holds: encoder and adapter outputs, every step's backbone row, modality, token or codes and
    top-2 margin, the first 8 text logits and first 2 audio frames' logits, and the audio frames
    (no EOA code) decoded by proc.mimi at once and streamed frame by frame. Returns the number
    of steps, their pattern (T text, A audio) and the number of frames decoded."""
    import torch

    hid, enc, ada, dlog = [], [], [], []
    model.lfm.register_forward_hook(lambda m, i, o: hid.append(o.last_hidden_state[0].float().cpu()))
    model.conformer.register_forward_hook(lambda m, i, o: enc.append(o[0][0].mT.float().cpu()))
    model.audio_adapter.register_forward_hook(lambda m, i, o: ada.append(o.float().cpu()))
    for i, de in enumerate(model.depth_embeddings):
        orig = de.get_logits
        de.get_logits = (lambda orig: lambda x: dlog.append(orig(x)) or dlog[-1])(orig)

    outs = []
    with torch.no_grad():
        for t in model.generate_interleaved(**chat, max_new_tokens=steps, text_temperature=None,
                                            audio_temperature=None):
            outs.append(t.cpu())
    emb = model.lfm.embed_tokens.weight
    rec["encoder_out"], rec["adapter_out"] = enc[0], ada[0]
    rec["prefill_hidden"] = hid[0]
    rows = [hid[0][-1]] + [h[-1] for h in hid[1:]]
    n = len(rows)
    mod, yl, tok, codes, margins_t, margins_a = [], [], [], [], [], []
    ai = 0
    tl_idx, tl, al_idx, al = [], [], [], []
    for s in range(n):
        if s < len(outs) and outs[s].numel() > 1:
            mod.append(3); yl.append(1); tok.append(-1); codes.append(outs[s].tolist())
            lg = [dlog[ai * 8 + i] for i in range(8)]
            ai += 1
            margins_t.append(float("nan")); margins_a.append([_margin(x) for x in lg])
            if len(al_idx) < 2:
                al_idx.append(s); al.append(torch.stack([x.float().cpu() for x in lg]))
        else:
            logits = torch.nn.functional.linear(rows[s].cuda().to(torch.bfloat16), emb)
            t = int(outs[s].item()) if s < len(outs) else int(logits.argmax())
            assert t == int(logits.argmax()), (s, t)
            mod.append(1); yl.append(1 if s < len(outs) else 0); tok.append(t); codes.append([-1] * 8)
            margins_t.append(_margin(logits)); margins_a.append([float("nan")] * 8)
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
    return n, "".join("T" if m == 1 else "A" for m in mod), len(frames)


def save_case(rec, path, steps, made_by):
    """Writes a reference case of one greedy speech-to-speech turn: int64 tensors as they are,
    the rest as float32, with the metadata of the format."""
    import torch
    from safetensors.torch import save_file

    meta = {"system": SYSTEM, "turns": json.dumps([{"role": "user", "audio": "input_wav"}]),
            "generation": json.dumps({"mode": "interleaved", "max_new_tokens": steps, "text": "greedy",
                                      "audio": "greedy", "interleaved_n_text": 6, "interleaved_n_audio": 12}),
            "made_by": made_by}
    save_file({k: v.contiguous() if v.dtype in (torch.int64,) else v.float().contiguous() for k, v in rec.items()},
              path, metadata=meta)
