"""Time the official liquid-audio v1.0.0 code at the real LFM2-Audio-1.5B size, on one GPU.

The reference speed measurement for omni-pipe: liquid-audio's LFM2AudioModel at the
released sizes with seeded random weights, built like LFM2AudioModel.from_pretrained
(init_on_device(cuda), whole module .to(bfloat16), attention "sdpa" unless flash_attn is
installed), and a full-size random Mimi (fp32, codebook sums N(0, 1)) decoded frame by
frame inside mimi.streaming(1) exactly as liquid_audio/demo/chat.py does (moshi's
CUDAGraphed wrappers; moshi's lazy torch.compile ON unless --no-compile). PyTorch's
default TF32 settings are left alone.

One turn = ChatState with the system prompt "Respond with interleaved text and audio.",
the question WAV as the user turn, then
generate_interleaved(max_new_tokens=400, text_temperature=None, audio_temperature=1.0,
audio_top_k=4); each audio frame is decoded right after it is yielded. Random weights
would end the schedule early, so wrappers set the logits of <|im_end|> (7) and
<|text_end|> (130) to -inf before text sampling and index 2048 (EOA) to -inf in every
codebook's depthformer logits; the turn is stopped after the --frames'th (81st) audio
frame. torch.cuda.synchronize() + time.perf_counter() at every yield. N warm-up turns,
then M timed turns; medians over the timed turns. Then cheap micro-benchmarks (encode,
backbone prefill, backbone decode step, text head, depthformer frame, Mimi decode per
frame) and, last, a profiler count of CUDA kernels for one backbone step and one
depthformer frame. Every section is guarded: a failure is recorded in "errors" and the
rest still runs; the JSON file is rewritten after every section.

Usage:
  python3 speed_ref.py LIQUID_AUDIO_SRC QUESTION_WAV OUT_JSON [--turns 3] [--warmup 1]
      [--frames 81] [--no-compile] [--no-profile] [--budget-s 200] [--fixture DIR]
LIQUID_AUDIO_SRC is the src/ folder of liquid-audio v1.0.0 (it holds liquid_audio/,
with its vendored moshi). The tokenizer and the non-size config keys come from
testdata/lfm2-audio-tiny (--fixture), the same as real_size_ref.py.
Needs torch, torchaudio, transformers (5.x), accelerate, einops, safetensors, numpy.
librosa (and soxr, sentencepiece if absent) are replaced by stand-ins (refgen_common.py,
in this folder, with what the scripts here share); none of them is on the timed path except
librosa.filters.mel, computed once at construction.
"""
import argparse
import faulthandler
import importlib
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback

T_START = time.perf_counter()

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("src", help="liquid-audio v1.0.0 src/ folder (holds liquid_audio/)")
ap.add_argument("question", help="question WAV (16-bit PCM)")
ap.add_argument("out_json", help="where the JSON results go")
ap.add_argument("--turns", type=int, default=3, help="timed turns")
ap.add_argument("--warmup", type=int, default=1, help="warm-up turns (not in the medians)")
ap.add_argument("--frames", type=int, default=81, help="stop a turn after this many audio frames")
ap.add_argument("--max-new-tokens", type=int, default=400)
ap.add_argument("--no-compile", action="store_true", help="NO_TORCH_COMPILE=1: moshi's lazy torch.compile off")
ap.add_argument("--no-profile", action="store_true", help="skip the profiler kernel counts")
ap.add_argument("--budget-s", type=float, default=200.0,
                help="start no new timed turn or section after this many seconds of script time")
ap.add_argument("--seed", type=int, default=20251201)
ap.add_argument("--fixture", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lfm2-audio-tiny"),
                help="folder with config.json, tokenizer.json, tokenizer_config.json (default testdata/lfm2-audio-tiny)")
args = ap.parse_args()
# If something hangs (a compile, a capture), print every thread's stack well before the runner's limit.
faulthandler.dump_traceback_later(args.budget_s + 60, repeat=False)

# moshi's torch_compile_lazy reads NO_TORCH_COMPILE when its modules are imported.
if args.no_compile:
    os.environ["NO_TORCH_COMPILE"] = "1"
else:
    os.environ.pop("NO_TORCH_COMPILE", None)

R = {"meta": {"made_by": "testdata/refgen/speed_ref.py", "argv": sys.argv[1:]}, "errors": {}, "notes": []}


def log(*a):
    print(*a, flush=True)


def elapsed():
    return time.perf_counter() - T_START


def clean(o):
    """JSON-safe copy: non-finite floats become null (Go's encoding/json rejects NaN)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [clean(v) for v in o]
    if o is None or isinstance(o, (bool, int, str)):
        return o
    return str(o)


def save():
    R["meta"]["script_seconds"] = round(elapsed(), 2)
    tmp = args.out_json + ".tmp"
    try:
        d = os.path.dirname(os.path.abspath(args.out_json))
        os.makedirs(d, exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(clean(R), f, indent=1, allow_nan=False)
        os.replace(tmp, args.out_json)
    except Exception:  # never let the report kill the run
        log("could not write", args.out_json)
        traceback.print_exc()
        sys.stdout.flush()


def fail(section, exc):
    R["errors"][section] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-6000:]
    log(f"!! {section} failed: {type(exc).__name__}: {exc}")
    save()


def ms(x):
    return None if x is None else round(1000.0 * x, 3)


def med(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else None


# --- stand-ins for modules the GPU box lacks (not on the timed path) ---------------
import numpy as np  # noqa: E402


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import refgen_common as rc  # noqa: E402

stubbed = rc.stand_in_modules(keep_installed_librosa=True, sentencepiece=True)
if not any(x.startswith("librosa") for x in stubbed):
    R["notes"].append("librosa installed: the real librosa.filters.mel is used")
R["meta"]["stubbed_modules"] = stubbed

sys.path.insert(0, os.path.abspath(args.src))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

if rc.stand_in_lfm2_cache_annotation():
    stubbed.append("transformers...modeling_lfm2.Lfm2HybridConvCache (annotation only)")

from accelerate import init_on_device  # noqa: E402

import liquid_audio  # noqa: E402
from liquid_audio import moshi  # noqa: E402
import liquid_audio.moshi.utils.compile as mcompile  # noqa: E402
from liquid_audio.model.lfm2_audio import LFM2AudioModel  # noqa: E402
from liquid_audio.processor import LFM2AudioProcessor, PreprocessorConfig  # noqa: E402
from liquid_audio.utils import module_exists  # noqa: E402

SYSTEM = rc.SYSTEM
IM_END, TEXT_END, EOA = 7, 130, 2048


def now():
    torch.cuda.synchronize()
    return time.perf_counter()


def tf32_state():
    s = {}
    for k, f in (("cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32),
                 ("cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
                 ("cuda.matmul.fp32_precision", lambda: torch.backends.cuda.matmul.fp32_precision),
                 ("cudnn.conv.fp32_precision", lambda: torch.backends.cudnn.conv.fp32_precision),
                 ("float32_matmul_precision", torch.get_float32_matmul_precision)):
        try:
            s[k] = f()
        except Exception as e:  # noqa: BLE001
            s[k] = f"n/a ({type(e).__name__})"
    return s


meta = R["meta"]
meta.update({
    "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
    "liquid_audio_src": os.path.abspath(args.src), "liquid_audio_file": liquid_audio.__file__,
    "cpu_count": os.cpu_count(), "host": platform.platform(),
    "flash_attn_installed": module_exists("flash_attn"), "causal_conv1d_installed": module_exists("causal_conv1d"),
    "torch_compile": "off (--no-compile, NO_TORCH_COMPILE=1)" if args.no_compile else "on (moshi lazy torch.compile, demo default)",
    "turns": args.turns, "warmup": args.warmup, "frames": args.frames, "max_new_tokens": args.max_new_tokens,
    "seed": args.seed, "system": SYSTEM,
    "generation": {"fn": "generate_interleaved", "max_new_tokens": args.max_new_tokens, "text_temperature": None,
                   "audio_temperature": 1.0, "audio_top_k": 4},
    "masks": "logits[7]=logits[130]=-inf before text sampling; depthformer logits[2048]=-inf per codebook",
})
for mod in ("torchaudio", "accelerate", "einops", "safetensors", "tokenizers", "triton"):
    try:
        meta[mod] = importlib.import_module(mod).__version__
    except Exception as e:  # noqa: BLE001
        meta[mod] = f"n/a ({type(e).__name__})"
if not torch.cuda.is_available():
    R["errors"]["setup"] = "torch.cuda.is_available() is False"
    save()
    log("no CUDA device")
    sys.exit(1)
meta.update({"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
             "cudnn": torch.backends.cudnn.version(), "tf32": tf32_state()})
save()
log(f"[{elapsed():6.1f}s] imports done: torch {torch.__version__}, transformers {transformers.__version__}, "
    f"{meta['gpu']}, stubs {stubbed}")

# --- the model at the released sizes, built like from_pretrained, random weights ---
dev = torch.device("cuda")
try:
    cfg = rc.released_size_config(args.fixture)  # the same sizes as real_size_ref.py
    meta["config"] = cfg
    conf = rc.audio_config(cfg)
    torch.manual_seed(args.seed)
    t = time.perf_counter()
    with init_on_device(dev, include_buffers=True):  # as LFM2AudioModel.from_pretrained
        model = LFM2AudioModel(conf).to(device=dev, dtype=torch.bfloat16)
    if module_exists("flash_attn"):
        model.lfm.set_attn_implementation("flash_attention_2")
    else:
        model.lfm.set_attn_implementation("sdpa")
    # from_pretrained would now load the checkpoint; we fill seeded random values instead
    # (the rules of real_size_ref.py / the tiny fixtures), on the GPU.
    g = torch.Generator(device=dev).manual_seed(args.seed)

    def rn(shape):
        return torch.randn(shape, generator=g, device=dev, dtype=torch.float32)

    rc.init_audio_model_weights(model, rn)
    model.eval()
    torch.cuda.synchronize()
    meta["model_build_s"] = round(time.perf_counter() - t, 2)
    meta["parameters"] = sum(p.numel() for p in model.parameters())
    meta["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    meta["attn_implementation"] = getattr(model.lfm.config, "_attn_implementation", None)
    meta["lfm_ffn"] = [m.out_features for n, m in model.lfm.named_modules()
                       if n.endswith("layers.0.feed_forward.w1") and hasattr(m, "out_features")]
    log(f"[{elapsed():6.1f}s] model built: {meta['parameters']:,} parameters {meta['param_dtypes']}, "
        f"attention {meta['attn_implementation']}, FFN {meta['lfm_ffn']}")

    proc = LFM2AudioProcessor(text_tokenizer_path=args.fixture,
                              audio_processor_config=PreprocessorConfig(**cfg["preprocessor"]),
                              mimi_weights_path=os.devnull).to(dev).eval()

    t = time.perf_counter()
    mimi = moshi.models.loaders.get_mimi(None, device=dev)
    gm = torch.Generator(device=dev).manual_seed(args.seed + 1)
    with torch.no_grad():
        for name, b in mimi.named_buffers():
            if name.endswith("embedding_sum"):
                b.copy_(torch.randn(b.shape, generator=gm, device=b.device, dtype=torch.float32).to(b.dtype))
            elif name.endswith("_initialized"):
                b.fill_(1)
    for m in mimi.modules():  # drop any cached codebook (embedding_sum / cluster_usage)
        if "_embedding" in m._buffers:
            m._buffers["_embedding"] = None
    mimi.eval()
    torch.cuda.synchronize()
    meta["mimi_build_s"] = round(time.perf_counter() - t, 2)
    meta["mimi_parameters"] = sum(p.numel() for p in mimi.parameters())
    meta["mimi_dtypes"] = sorted({str(p.dtype) for p in mimi.parameters()})

    samples, sr, nch = rc.read_wav(args.question)
    pcm = samples.astype(np.float32)
    if nch > 1:
        pcm = pcm.reshape(-1, nch).mean(1)
    wav = torch.from_numpy(pcm / 32768.0)[None]  # as the demo: int16 / 32768, float32 [1, L]
    meta["question"] = {"path": args.question, "sample_rate": sr, "channels": nch, "samples": int(wav.shape[1])}
    log(f"[{elapsed():6.1f}s] Mimi built ({meta['mimi_parameters']:,} parameters), question {wav.shape[1]} samples at {sr} Hz")
except Exception as e:  # noqa: BLE001
    fail("setup", e)
    sys.exit(1)
save()

# --- the logits masks ---------------------------------------------------------------
try:
    ban_text = torch.tensor([IM_END, TEXT_END], device=dev)
    ban_audio = torch.tensor([EOA], device=dev)
    orig_text = model._sample_text_token

    def masked_text(logits, **kw):
        logits.index_fill_(0, ban_text, float("-inf"))
        return orig_text(logits, **kw)

    model._sample_text_token = masked_text
    for de in model.depth_embeddings:
        def masked_logits(x, _orig=de.get_logits):
            lg = _orig(x)
            lg.index_fill_(0, ban_audio, float("-inf"))
            return lg
        de.get_logits = masked_logits
except Exception as e:  # noqa: BLE001
    fail("masks", e)
    sys.exit(1)

# --- Mimi warm-up as demo/model.py (also triggers moshi's lazy torch.compile) --------
mimi_ok = True


def mimi_warmup():
    with mimi.streaming(1), torch.no_grad():
        for _ in range(5):
            x = torch.randint(2048, (1, 8, 1), device=dev)
            y = mimi.decode(x)
    torch.cuda.synchronize()
    return tuple(y.shape)


t = now()
try:
    shp = mimi_warmup()
    meta["mimi_warmup_s"] = round(now() - t, 2)
    meta["mimi_decode_out_shape"] = shp
    log(f"[{elapsed():6.1f}s] Mimi warm-up (5 streaming decodes, includes the lazy compile) {meta['mimi_warmup_s']} s, out {shp}")
except Exception as e:  # noqa: BLE001
    fail("mimi_warmup", e)
    if not args.no_compile:
        R["notes"].append("Mimi warm-up failed with torch.compile on; retried with moshi's compile disabled "
                          "(moshi.utils.compile._compile_disabled = True): Mimi figures are EAGER")
        meta["torch_compile"] = "FAILED at first call; fell back to eager (see errors.mimi_warmup)"
        mcompile._compile_disabled = True
        try:
            torch._dynamo.reset()
        except Exception:  # noqa: BLE001
            pass
        t = now()
        try:
            meta["mimi_decode_out_shape"] = mimi_warmup()
            meta["mimi_warmup_s"] = round(now() - t, 2)
            log(f"[{elapsed():6.1f}s] Mimi warm-up, eager, {meta['mimi_warmup_s']} s")
        except Exception as e2:  # noqa: BLE001
            fail("mimi_warmup_eager", e2)
            mimi_ok = False
    else:
        mimi_ok = False
if not mimi_ok:
    R["notes"].append("Mimi unusable: turns run WITHOUT the inline decode")
save()


# --- one turn ---------------------------------------------------------------------------
def build_chat():
    chat = rc.begin_chat(proc)
    ta = now()
    chat.add_audio(wav, sr)
    tb = now()
    chat.end_turn()
    chat.new_turn("assistant")
    return chat, tb - ta


def run_turn(seed):
    torch.manual_seed(seed)
    chat, mel_s = build_chat()
    ev = []  # [kind, t_yield, t_after_decode or None]
    toks = []
    chunk_shape = None
    with torch.no_grad(), (mimi.streaming(1) if mimi_ok else torch.no_grad()):
        t0 = now()
        gen = model.generate_interleaved(**chat, max_new_tokens=args.max_new_tokens, text_temperature=None,
                                         audio_temperature=1.0, audio_top_k=4)
        n_audio = 0
        try:
            for tok in gen:
                ty = now() - t0
                toks.append(tok)
                if tok.numel() > 1:
                    n_audio += 1
                    td = None
                    if mimi_ok and not (tok == 2048).any():  # as demo/chat.py
                        wav_chunk = mimi.decode(tok[None, :, None])[0]
                        td = now() - t0
                        chunk_shape = tuple(wav_chunk.shape)
                    ev.append(["A", ty, td])
                    if n_audio >= args.frames:
                        break
                else:
                    ev.append(["T", ty, None])
        finally:
            gen.close()
    t_end = now() - t0
    return summarize(chat, mel_s, ev, toks, chunk_shape, t_end)


def summarize(chat, mel_s, ev, toks, chunk_shape, t_end):
    first = lambda k: next((e for e in ev if e[0] == k), None)  # noqa: E731
    ft, fa = first("T"), first("A")
    audio = [e for e in ev if e[0] == "A"]
    dec = [e[2] - e[1] for e in audio if e[2] is not None]
    frame_in_block, text_in_block = [], []
    for i in range(1, len(ev)):
        prev_done = ev[i - 1][2] if ev[i - 1][2] is not None else ev[i - 1][1]
        if ev[i][0] == "A" and ev[i - 1][0] == "A":
            frame_in_block.append(ev[i][1] - prev_done)
        if ev[i][0] == "T" and ev[i - 1][0] == "T":
            text_in_block.append(ev[i][1] - prev_done)
    last_a = audio[-1] if audio else None
    text_ids = [int(x.item()) for x in toks if x.numel() == 1]
    n_codes_eoa = sum(int((x == 2048).any().item()) for x in toks if x.numel() > 1)
    return {
        "prompt_rows": int(chat.modality_flag.shape[1]),
        "mel_frames": int(chat.audio_in.shape[1]),
        "steps": len(ev),
        "audio_frames": len(audio),
        "pattern": "".join(e[0] for e in ev),
        "frames_with_2048": n_codes_eoa,
        "text_ids": text_ids,
        "wav_chunk_shape": chunk_shape,
        "mel_front_end_ms": ms(mel_s),
        "ttft_text_ms": ms(ft[1]) if ft else None,
        "first_audio_frame_ms": ms(fa[1]) if fa else None,
        "first_pcm_ms": ms(fa[2]) if fa and fa[2] is not None else None,
        "to_last_frame_ms": ms(last_a[2] if last_a and last_a[2] is not None else (last_a[1] if last_a else None)),
        "turn_total_ms": ms(t_end),
        "mimi_decode_1st_ms": ms(dec[0]) if len(dec) > 0 else None,
        "mimi_decode_2nd_ms": ms(dec[1]) if len(dec) > 1 else None,
        "mimi_decode_steady_median_ms": ms(med(dec[2:])),
        "frame_in_block_median_ms": ms(med(frame_in_block)),
        "text_step_in_block_median_ms": ms(med(text_in_block)),
        "events_ms": [[e[0], ms(e[1]), ms(e[2])] for e in ev],
        "mimi_decode_ms": [ms(x) for x in dec],
        "frame_in_block_ms": [ms(x) for x in frame_in_block],
    }


TURN_KEYS = ["mel_front_end_ms", "ttft_text_ms", "first_audio_frame_ms", "first_pcm_ms", "to_last_frame_ms",
             "turn_total_ms", "frame_in_block_median_ms", "text_step_in_block_median_ms", "mimi_decode_1st_ms",
             "mimi_decode_2nd_ms", "mimi_decode_steady_median_ms"]
R["warmup_turns"], R["turns"] = [], []
last_turn_s = 0.0
for i in range(args.warmup + args.turns):
    timed = i >= args.warmup
    if timed and R["turns"] and elapsed() + last_turn_s > args.budget_s:
        R["notes"].append(f"budget: stopped after {len(R['turns'])} timed turns at {elapsed():.0f} s")
        log(f"budget reached: {len(R['turns'])} timed turns")
        break
    ts = time.perf_counter()
    try:
        s = run_turn(args.seed + 1000 + i)
    except Exception as e:  # noqa: BLE001
        fail(f"turn_{i}", e)
        if i == 0:
            log("the first turn failed; skipping the other turns")
            break
        continue
    last_turn_s = time.perf_counter() - ts
    (R["turns"] if timed else R["warmup_turns"]).append(s)
    log(f"[{elapsed():6.1f}s] {'turn' if timed else 'warm-up'} {i}: prompt {s['prompt_rows']} rows, {s['steps']} steps "
        f"({s['audio_frames']} frames), ttft {s['ttft_text_ms']} ms, first audio {s['first_audio_frame_ms']} ms, "
        f"first pcm {s['first_pcm_ms']} ms, frame {s['frame_in_block_median_ms']} ms, "
        f"mimi {s['mimi_decode_steady_median_ms']} ms, {s['audio_frames']} frames at {s['to_last_frame_ms']} ms")
    if timed:
        R["turn_medians"] = {k: med([t[k] for t in R["turns"]]) for k in TURN_KEYS}
        R["turn_lists"] = {k: [t[k] for t in R["turns"]] for k in TURN_KEYS}
    save()
if not R["turns"] and R["warmup_turns"]:
    R["notes"].append("no timed turn finished: turn_medians are over the warm-up turns")
    R["turn_medians"] = {k: med([t[k] for t in R["warmup_turns"]]) for k in TURN_KEYS}
save()

# --- micro-benchmarks -------------------------------------------------------------------
M = R["micro"] = {}


def over_budget(section):
    if elapsed() > args.budget_s:
        R["notes"].append(f"budget: skipped {section} at {elapsed():.0f} s")
        log(f"budget: skipped {section}")
        return True
    return False


chat = None
try:
    chat, _ = build_chat()
    with torch.no_grad():
        enc, pre = [], []
        for r in range(6):
            t = now()
            emb = model._prefill(**chat)
            enc.append(now() - t)
            t = now()
            out = model.lfm(inputs_embeds=emb, use_cache=True)
            pre.append(now() - t)
        M["encode_prefill_fn_ms"] = [ms(x) for x in enc]  # model._prefill: conformer + adapter + assembly
        M["backbone_prefill_ms"] = [ms(x) for x in pre]
        M["encode_median_ms"] = ms(med(enc[1:]))
        M["backbone_prefill_median_ms"] = ms(med(pre[1:]))
        M["prompt_rows"] = int(emb.shape[1])
    log(f"[{elapsed():6.1f}s] encode {M['encode_median_ms']} ms, backbone prefill {M['backbone_prefill_median_ms']} ms "
        f"({M['prompt_rows']} rows)")
except Exception as e:  # noqa: BLE001
    fail("micro_prefill", e)
save()

step_out = None
try:
    if not over_budget("micro_backbone_step"):
        with torch.no_grad():
            emb = model._prefill(**chat)
            out = model.lfm(inputs_embeds=emb, use_cache=True)
            cache, n0 = out.past_key_values, emb.shape[1]
            gcodes = torch.Generator(device=dev).manual_seed(args.seed + 7)
            codes = torch.randint(0, 2048, (60, 8), device=dev, generator=gcodes)
            ins = [model.audio_embedding(c + model.codebook_offsets).sum(0)[None, None, :] for c in codes]
            steps, lens = [], []
            for x in ins:
                lens.append(n0 + len(steps))
                t = now()
                step_out = model.lfm(inputs_embeds=x, past_key_values=cache, use_cache=True)
                steps.append(now() - t)
                cache = step_out.past_key_values
        M["backbone_step_ms"] = [ms(x) for x in steps]
        M["backbone_step_cache_len"] = lens
        M["backbone_step_median_ms"] = ms(med(steps))
        M["backbone_step_cache100_140_median_ms"] = ms(med([s for s, n in zip(steps, lens) if 100 <= n <= 140]))
        log(f"[{elapsed():6.1f}s] backbone step (1 token, cache {lens[0]}..{lens[-1]}) median {M['backbone_step_median_ms']} ms; "
            f"cache 100..140 {M['backbone_step_cache100_140_median_ms']} ms")
except Exception as e:  # noqa: BLE001
    fail("micro_backbone_step", e)
save()

h = None
try:
    if not over_budget("micro_text_head"):
        with torch.no_grad():
            h = (step_out.last_hidden_state if step_out is not None else out.last_hidden_state)[0, -1]
            th = []
            for _ in range(20):
                t = now()
                lg = F.linear(h, model.lfm.embed_tokens.weight)
                lg.argmax(keepdim=True)
                th.append(now() - t)
        M["text_head_argmax_ms"] = [ms(x) for x in th]
        M["text_head_argmax_median_ms"] = ms(med(th[1:]))
        log(f"[{elapsed():6.1f}s] text head F.linear(h, embed_tokens) + argmax {M['text_head_argmax_median_ms']} ms")
except Exception as e:  # noqa: BLE001
    fail("micro_text_head", e)
save()

try:
    if not over_budget("micro_depthformer"):
        with torch.no_grad():
            if h is None:
                h = out.last_hidden_state[0, -1]
            dfr = []
            for _ in range(16):
                t = now()
                fr = model._sample_audio_frame(h, temperature=1.0, top_k=4)
                dfr.append(now() - t)
        M["depthformer_frame_ms"] = [ms(x) for x in dfr]
        M["depthformer_frame_median_ms"] = ms(med(dfr[1:]))
        M["depthformer_frame_codes_example"] = fr.tolist()
        log(f"[{elapsed():6.1f}s] depthformer frame (8 codebooks, top-k 4, masks) {M['depthformer_frame_median_ms']} ms")
except Exception as e:  # noqa: BLE001
    fail("micro_depthformer", e)
save()

try:
    if mimi_ok and not over_budget("micro_mimi"):
        gcodes = torch.Generator(device=dev).manual_seed(args.seed + 8)
        allc = torch.randint(0, 2048, (40, 1, 8, 1), device=dev, generator=gcodes)
        md = []
        with torch.no_grad(), mimi.streaming(1):
            for c in allc:
                t = now()
                mimi.decode(c)
                md.append(now() - t)
        M["mimi_decode_ms"] = [ms(x) for x in md]
        M["mimi_decode_1st_ms"] = ms(md[0])
        M["mimi_decode_2nd_ms"] = ms(md[1])
        M["mimi_decode_steady_median_ms"] = ms(med(md[2:]))
        log(f"[{elapsed():6.1f}s] Mimi streaming decode: 1st {M['mimi_decode_1st_ms']} ms, 2nd (capture) "
            f"{M['mimi_decode_2nd_ms']} ms, steady {M['mimi_decode_steady_median_ms']} ms")
except Exception as e:  # noqa: BLE001
    fail("micro_mimi", e)
save()


# --- CUDA kernels per backbone step / depthformer frame (profiler; last) ---------------
def kernel_stats(fn):
    from torch.profiler import ProfilerActivity, profile
    for rep in range(2):  # the first run pays CUPTI's start-up
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kern = [e for e in evs if not e.name.lower().startswith(("memcpy", "memset"))]
    res = {"device_events": len(evs), "kernels": len(kern),
           "kernel_time_ms": round(sum(e.time_range.elapsed_us() for e in kern) / 1000.0, 4),
           "device_time_ms": round(sum(e.time_range.elapsed_us() for e in evs) / 1000.0, 4)}
    try:  # the same from the raw Kineto events, as a cross-check
        raw = [e for e in prof.profiler.kineto_results.events() if e.device_type() == torch.autograd.DeviceType.CUDA
               and not e.name().lower().startswith(("memcpy", "memset"))]
        res["raw_kernels"] = len(raw)
        res["raw_kernel_time_ms"] = round(sum(e.duration_ns() for e in raw) / 1e6, 4)
    except Exception as e:  # noqa: BLE001
        res["raw"] = f"n/a ({type(e).__name__}: {e})"
    return res


if not args.no_profile:
    try:
        if not over_budget("profile") and chat is not None:
            with torch.no_grad():
                emb = model._prefill(**chat)
                out = model.lfm(inputs_embeds=emb, use_cache=True)
                hh = out.last_hidden_state[0, -1]
                x = model.audio_embedding(torch.zeros(8, dtype=torch.long, device=dev) + model.codebook_offsets).sum(0)[None, None, :]
                st = {"cache": out.past_key_values}

                def one_step():
                    o = model.lfm(inputs_embeds=x, past_key_values=st["cache"], use_cache=True)
                    st["cache"] = o.past_key_values

                M["profile_backbone_step"] = kernel_stats(one_step)
                log(f"[{elapsed():6.1f}s] profile backbone step: {M['profile_backbone_step']}")
                save()
                M["profile_depthformer_frame"] = kernel_stats(
                    lambda: model._sample_audio_frame(hh, temperature=1.0, top_k=4))
                log(f"[{elapsed():6.1f}s] profile depthformer frame: {M['profile_depthformer_frame']}")
    except Exception as e:  # noqa: BLE001
        fail("profile", e)
save()

# --- the table --------------------------------------------------------------------------
TM = R.get("turn_medians", {})
rows = [
    ("mel front end (ChatState.add_audio)", TM.get("mel_front_end_ms")),
    ("encode: model._prefill (conformer + adapter + assembly)", M.get("encode_median_ms")),
    (f"backbone prefill (Lfm2Model over {M.get('prompt_rows')} rows)", M.get("backbone_prefill_median_ms")),
    ("time to first text token (incl. encode + prefill)", TM.get("ttft_text_ms")),
    ("time to first audio frame (codes)", TM.get("first_audio_frame_ms")),
    ("time to first 1920 PCM samples", TM.get("first_pcm_ms")),
    ("backbone step, micro (cache 93..153)", M.get("backbone_step_median_ms")),
    ("plain Lfm2Model decode step, cache 100..140", M.get("backbone_step_cache100_140_median_ms")),
    ("depthformer frame, 8 codebooks (_sample_audio_frame, top-k 4)", M.get("depthformer_frame_median_ms")),
    ("per audio frame in a block, yield to yield minus Mimi decode", TM.get("frame_in_block_median_ms")),
    ("per text step in a block", TM.get("text_step_in_block_median_ms")),
    ("Mimi streaming decode per frame, steady (in turn)", TM.get("mimi_decode_steady_median_ms")),
    ("Mimi streaming decode per frame, steady (micro)", M.get("mimi_decode_steady_median_ms")),
    ("Mimi decode, 1st frame of a turn", TM.get("mimi_decode_1st_ms")),
    ("Mimi decode, 2nd frame of a turn (graph capture)", TM.get("mimi_decode_2nd_ms")),
    (f"time to {args.frames} audio frames (incl. inline decode)", TM.get("to_last_frame_ms")),
    ("text head F.linear + argmax", M.get("text_head_argmax_median_ms")),
]
R["table_ms"] = {k: v for k, v in rows}
save()
log("")
log(f"liquid-audio reference speed, {meta.get('gpu')}, torch {torch.__version__}, compile: {meta['torch_compile']}")
log(f"medians over {len(R['turns'])} timed turns (after {len(R['warmup_turns'])} warm-up); ms")
log("| quantity | ms |")
log("|---|---|")
for k, v in rows:
    log(f"| {k} | {'—' if v is None else f'{v:.2f}'} |")
for key in ("profile_backbone_step", "profile_depthformer_frame"):
    if key in M:
        p = M[key]
        log(f"| {key}: kernels / kernel time ms | {p['kernels']} / {p['kernel_time_ms']:.2f} |")
if R["turns"]:
    log("per turn: ttft " + " / ".join(str(t["ttft_text_ms"]) for t in R["turns"])
        + "; first pcm " + " / ".join(str(t["first_pcm_ms"]) for t in R["turns"])
        + f"; {args.frames} frames " + " / ".join(str(t["to_last_frame_ms"]) for t in R["turns"]))
if R["errors"]:
    log("ERRORS in sections: " + ", ".join(R["errors"]))
log(f"wrote {args.out_json} ({elapsed():.0f} s)")
