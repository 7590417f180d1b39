"""Reference outputs for package audio's tests, made with the official code.

Run on a CUDA machine with torch/torchaudio 2.11 (as the lfm2-audio-tiny fixtures were):

    python3 gen_torch_ref.py PROCESSOR_PY OUT.safetensors

PROCESSOR_PY is liquid-audio's src/liquid_audio/model/conformer/processor.py (v1.0.0,
commit 251949e), the NeMo AudioToMelSpectrogramPreprocessor that ChatState runs. It is
imported as it is; its only librosa call (librosa.filters.mel) is served by a numpy
re-implementation written below after librosa 0.11.0, as the fixtures' generator did.

TF32 is off, as in the fixtures. Everything runs on CUDA like ChatState.add_audio,
except the tensors named */cpu.
"""

import importlib.util
import json
import os
import sys
import tempfile

import numpy as np
import torch
import torchaudio
from safetensors.torch import save_file
from torchaudio.functional.functional import _get_sinc_resample_kernel

torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False

SHIM = r'''
import numpy as np

def _hz_to_mel(f):
    f = np.asanyarray(f, dtype=np.float64)
    f_sp = 200.0 / 3
    mels = (f - 0.0) / f_sp
    min_log_hz = 1000.0
    min_log_mel = (min_log_hz - 0.0) / f_sp
    logstep = np.log(6.4) / 27.0
    if mels.ndim:
        t = f >= min_log_hz
        mels[t] = min_log_mel + np.log(f[t] / min_log_hz) / logstep
    elif f >= min_log_hz:
        mels = min_log_mel + np.log(f / min_log_hz) / logstep
    return mels

def _mel_to_hz(m):
    m = np.asanyarray(m, dtype=np.float64)
    f_sp = 200.0 / 3
    freqs = 0.0 + f_sp * m
    min_log_hz = 1000.0
    min_log_mel = (min_log_hz - 0.0) / f_sp
    logstep = np.log(6.4) / 27.0
    t = m >= min_log_mel
    freqs[t] = min_log_hz * np.exp(logstep * (m[t] - min_log_mel))
    return freqs

def mel(*, sr, n_fft, n_mels=128, fmin=0.0, fmax=None, htk=False, norm="slaney", dtype=np.float32):
    assert not htk and norm == "slaney"
    if fmax is None:
        fmax = float(sr) / 2
    weights = np.zeros((n_mels, 1 + n_fft // 2), dtype=dtype)
    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    enorm = 2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels])
    weights *= enorm[:, np.newaxis]
    return weights
'''


def load_processor(path):
    shim = tempfile.mkdtemp()
    os.makedirs(os.path.join(shim, "librosa"))
    with open(os.path.join(shim, "librosa", "__init__.py"), "w") as f:
        f.write("from . import filters\n")
    with open(os.path.join(shim, "librosa", "filters.py"), "w") as f:
        f.write(SHIM)
    sys.path.insert(0, shim)
    spec = importlib.util.spec_from_file_location("nemo_processor", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import librosa

    return mod, librosa


def signal(rate, seconds, seed):
    """Tones across the band (some above 8 kHz, to be filtered out) plus noise; float64 -> float32."""
    n = int(rate * seconds)
    t = np.arange(n) / rate
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 2950 * t + 0.3)
    for f in (7400.0, 9000.0, 15000.0):
        if f < rate / 2:
            x += 0.1 * np.sin(2 * np.pi * f * t + 1.0)
    x += 0.05 * np.random.RandomState(seed).standard_normal(n)
    return torch.from_numpy(x.astype(np.float32))


def main():
    proc_path, out_path = sys.argv[1], sys.argv[2]
    mod, librosa = load_processor(proc_path)
    dev = "cuda"
    out, meta = {}, {}

    # Windows as NeMo builds them (CPU, float32).
    out["window/hann400"] = torch.hann_window(400, periodic=False)
    out["window/hamming400"] = torch.hamming_window(400, periodic=False)

    # Mel filterbank: the numpy shim (float32) and torchaudio's Slaney bank in float64.
    out["fb/shim"] = torch.from_numpy(librosa.filters.mel(sr=16000, n_fft=512, n_mels=128, fmin=0, fmax=8000, norm="slaney"))
    out["fb/torchaudio_f64"] = torchaudio.functional.melscale_fbanks(
        257, 0.0, 8000.0, 128, 16000, norm="slaney", mel_scale="slaney"
    ).to(torch.float64).T.contiguous()
    out["fb/shim_22050_400_80"] = torch.from_numpy(librosa.filters.mel(sr=22050, n_fft=400, n_mels=80, fmin=0, fmax=11025, norm="slaney"))

    # torch.as_tensor of a Python float: the dtype resample's output length goes through.
    meta["as_tensor_dtype"] = str(torch.as_tensor(32000.666).dtype)

    # Resampling: kernels and outputs.
    pairs = [(24000, 16000), (48000, 16000), (44100, 16000), (22050, 16000), (11025, 16000), (8000, 16000), (32000, 16000), (16000, 24000), (44100, 48000)]
    for i, (a, b) in enumerate(pairs):
        g = np.gcd(a, b)
        key = f"{a}_{b}"
        kc, width = _get_sinc_resample_kernel(a, b, int(g), 6, 0.99, "sinc_interp_hann", None, device=torch.device(dev), dtype=torch.float32)
        kp, _ = _get_sinc_resample_kernel(a, b, int(g), 6, 0.99, "sinc_interp_hann", None, device=torch.device("cpu"), dtype=torch.float32)
        kc, kp = kc[:, 0, :].cpu(), kp[:, 0, :]
        rows = list(range(kc.shape[0])) if kc.shape[0] <= 4 else [0, 1, kc.shape[0] // 2, kc.shape[0] - 1]
        out[f"kernel/{key}/rows"] = torch.tensor(rows, dtype=torch.int64)
        out[f"kernel/{key}/cuda"] = kc[rows].contiguous()
        out[f"kernel/{key}/cpu"] = kp[rows].contiguous()
        x = signal(a, 0.2, 100 + i) + 0  # [L]
        x = x[: len(x) - (i % 3)]  # lengths that are not multiples of orig
        y = torchaudio.functional.resample(x[None].to(dev), a, b)[0].cpu()
        out[f"resample/{key}/input"] = x.contiguous()
        out[f"resample/{key}/cuda"] = y.contiguous()
        out[f"resample/{key}/cpu"] = torchaudio.functional.resample(x[None], a, b)[0].contiguous()
        meta[f"resample/{key}"] = {"width": int(width), "kernel_shape": list(kc.shape), "len_in": len(x), "len_out": len(y)}

    # Streaming-sized input: one long 24 kHz clip (the mic path's rate).
    proc = mod.AudioToMelSpectrogramPreprocessor(
        sample_rate=16000, normalize="per_feature", window_size=0.025, window_stride=0.01, window="hann",
        features=128, n_fft=512, log=True, frame_splicing=1, dither=1e-05, pad_to=0, pad_value=0.0,
    ).eval().to(dev)

    def mel(x16):
        m, n = proc(x16[None].to(dev), torch.tensor([len(x16)], device=dev))
        return m[0].float().cpu().contiguous(), int(n[0])

    rs = np.random.RandomState(7)
    cases = {
        "short320": torch.from_numpy((0.1 * rs.standard_normal(320)).astype(np.float32)),
        "short479": torch.from_numpy((0.1 * rs.standard_normal(479)).astype(np.float32)),
        "silence": torch.zeros(3200),
        "dc_tone": torch.from_numpy((0.25 + 0.5 * np.sin(2 * np.pi * 300 * np.arange(4001) / 16000)).astype(np.float32)),
        "loud_noise": torch.from_numpy(np.clip(0.9 * rs.standard_normal(16000), -1, 1).astype(np.float32)),
        "tone_16k": signal(16000, 1.0, 11),
    }
    for name, x in cases.items():
        m, n = mel(x)
        out[f"mel/{name}/input"] = x.contiguous()
        out[f"mel/{name}/mel_f32"] = m
        meta[f"mel/{name}"] = {"len": len(x), "frames": m.shape[1], "valid": n}

    # End to end: a clip at another rate -> resample (CUDA) -> mel.
    for i, rate in enumerate((44100, 8000)):
        x = signal(rate, 0.75, 200 + i)
        y = torchaudio.functional.resample(x[None].to(dev), rate, 16000)[0]
        m, n = mel(y.cpu())
        out[f"e2e/{rate}/input"] = x.contiguous()
        out[f"e2e/{rate}/wav_16k"] = y.cpu().contiguous()
        out[f"e2e/{rate}/mel_f32"] = m
        meta[f"e2e/{rate}"] = {"len": len(x), "frames": m.shape[1], "valid": n}

    meta["versions"] = {"torch": torch.__version__, "torchaudio": torchaudio.__version__, "numpy": np.__version__}
    meta["gpu"] = torch.cuda.get_device_name(0)
    out = {k: v.contiguous() for k, v in out.items()}
    save_file(out, out_path, metadata={"meta": json.dumps(meta)})
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
