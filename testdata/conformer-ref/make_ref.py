"""Makes conformer-ref/ref.safetensors: the tiny LFM2-Audio encoder's
intermediate activations (bf16, CUDA) for case2's clip, the encoder and
adapter outputs for short prefixes of it, a float64 run of cases 1 and 2, and
rows of the fp32 relative positional table at d_model 64 and 512.

It replays, op for op, the torch calls that liquid-audio v1.0.0's
ConformerEncoder (dw_striding ConvSubsampling, RelPositionalEncoding,
ConformerLayer) and audio_adapter MLP make on one unpadded clip in eval mode,
in bf16 on CUDA, with TF32 off as in lfm2-audio-tiny's generator. Its final
outputs for case1 and case2 are checked to equal the fixture's encoder_out and
adapter_out exactly before anything is written.

Run from the repository root: python3 testdata/conformer-ref/make_ref.py OUTDIR
"""
import json, math, sys
import torch, torch.nn.functional as F
from safetensors.torch import load_file, save_file

torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
D = 'testdata/lfm2-audio-tiny/'
W = {k: v.cuda() for k, v in load_file(D + 'model.safetensors').items()}
W64 = {k: (v.double() if v.is_floating_point() else v) for k, v in W.items()}
cfg = json.load(open(D + 'config.json'))['encoder']
dm, H = cfg['d_model'], cfg['n_heads']
dk = dm // H

# RelPositionalEncoding.extend_pe at pos_emb_max_len, fp32 on CUDA, then the
# model's cast to bf16.
L = cfg['pos_emb_max_len']


def create_pe(d):
    positions = torch.arange(L - 1, -L, -1, dtype=torch.float32, device='cuda').unsqueeze(1)
    pe = torch.zeros(positions.size(0), d, device='cuda')
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32, device='cuda') * -(math.log(10000.0) / d))
    pe[:, 0::2] = torch.sin(positions * div)
    pe[:, 1::2] = torch.cos(positions * div)
    return pe.unsqueeze(0)


pe32 = create_pe(dm)
PE = {torch.bfloat16: pe32.to(torch.bfloat16), torch.float64: pe32.double()}


def encode(mel, keep, W=W):
    """mel: [feat_in, T] (bf16, or float64 with W64). keep(name, tensor)
    records intermediates."""
    pe = PE[mel.dtype]
    p = 'conformer.pre_encode.'
    x = mel.mT.unsqueeze(0).unsqueeze(1)  # [1, 1, T, F]
    C = W[p + 'conv.0.weight'].shape[0]
    x = F.conv2d(x, W[p + 'conv.0.weight'], W[p + 'conv.0.bias'], stride=2, padding=1); keep('sub.0', x)
    x = F.relu(x)
    i = 2
    while p + 'conv.%d.weight' % i in W:
        x = F.conv2d(x, W[p + 'conv.%d.weight' % i], W[p + 'conv.%d.bias' % i], stride=2, padding=1, groups=C); keep('sub.%d' % i, x)
        x = F.conv2d(x, W[p + 'conv.%d.weight' % (i + 1)], W[p + 'conv.%d.bias' % (i + 1)]); keep('sub.%d' % (i + 1), x)
        x = F.relu(x)
        i += 3
    b, c, t, f = x.size()
    x = F.linear(x.transpose(1, 2).reshape(b, t, c * f), W[p + 'out.weight'], W[p + 'out.bias']); keep('sub.out', x)
    T = x.size(1)
    center = pe.size(1) // 2 + 1
    pos = pe[:, center - T:center + T - 1]; keep('pos', pos)
    nomask = torch.zeros(1, 1, T, T, dtype=torch.bool, device='cuda')
    for li in range(cfg['n_layers']):
        q_ = 'conformer.layers.%d.' % li
        ln = lambda n, v: F.layer_norm(v, (dm,), W[q_ + n + '.weight'], W[q_ + n + '.bias'], 1e-5)
        lin = lambda n, v: F.linear(v, W[q_ + n + '.weight'], W.get(q_ + n + '.bias'))
        k_ = lambda n, v: keep('L%d.%s' % (li, n), v)
        res = x
        h = ln('norm_feed_forward1', x); k_('ln1', h)
        h = lin('feed_forward1.linear2', F.silu(lin('feed_forward1.linear1', h))); k_('ff1', h)
        res = res + h * 0.5; k_('res1', res)
        h = ln('norm_self_att', res); k_('ln2', h)
        a = 'self_attn.'
        q = lin(a + 'linear_q', h).view(1, T, H, dk).transpose(1, 2)
        k = lin(a + 'linear_k', h).view(1, T, H, dk).transpose(1, 2)
        v = lin(a + 'linear_v', h).view(1, T, H, dk).transpose(1, 2)
        q = q.transpose(1, 2)
        pp = lin(a + 'linear_pos', pos).view(1, -1, H, dk).transpose(1, 2)
        qu = (q + W[q_ + a + 'pos_bias_u']).transpose(1, 2)
        qv = (q + W[q_ + a + 'pos_bias_v']).transpose(1, 2)
        bd = torch.matmul(qv, pp.transpose(-2, -1))
        bb, hh, ql, pl = bd.size()
        bd = F.pad(bd, pad=(1, 0)).view(bb, hh, pl + 1, ql)[:, :, 1:].view(bb, hh, ql, pl)
        ac = torch.matmul(qu, k.transpose(-2, -1))
        bd = bd[:, :, :, :ac.size(-1)]
        scores = (ac + bd) / math.sqrt(dk)
        attn = torch.softmax(scores.masked_fill(nomask, -10000.0), dim=-1).masked_fill(nomask, 0.0)
        o = torch.matmul(attn, v).transpose(1, 2).reshape(1, T, H * dk)
        o = lin(a + 'linear_out', o); k_('att', o)
        res = res + o; k_('res2', res)
        h = ln('norm_conv', res); k_('ln3', h)
        h = h.transpose(1, 2)
        h = F.conv1d(h, W[q_ + 'conv.pointwise_conv1.weight'], W[q_ + 'conv.pointwise_conv1.bias']); k_('pw1', h)
        h = F.glu(h, dim=1); k_('glu', h)
        kk = W[q_ + 'conv.depthwise_conv.weight'].shape[-1]
        h = F.pad(h, pad=((kk - 1) // 2, (kk - 1) // 2))
        h = F.conv1d(h, W[q_ + 'conv.depthwise_conv.weight'], W[q_ + 'conv.depthwise_conv.bias'], groups=dm); k_('dw', h)
        bn = q_ + 'conv.batch_norm.'
        h = F.batch_norm(h, W[bn + 'running_mean'], W[bn + 'running_var'], W[bn + 'weight'], W[bn + 'bias'], False, 0.1, 1e-5); k_('bn', h)
        h = F.silu(h)
        h = F.conv1d(h, W[q_ + 'conv.pointwise_conv2.weight'], W[q_ + 'conv.pointwise_conv2.bias']); k_('conv', h)
        res = res + h.transpose(1, 2); k_('res3', res)
        h = ln('norm_feed_forward2', res); k_('ln4', h)
        h = lin('feed_forward2.linear2', F.silu(lin('feed_forward2.linear1', h))); k_('ff2', h)
        res = res + h * 0.5; k_('res4', res)
        x = ln('norm_out', res); k_('out', x)
    enc = x[0]
    a = 'audio_adapter.model.'
    y = F.layer_norm(enc, (enc.size(-1),), W[a + '0.weight'], W[a + '0.bias'], 1e-5)
    y = F.linear(F.gelu(F.linear(y, W[a + '1.weight'], W[a + '1.bias'])), W[a + '3.weight'], W[a + '3.bias'])
    return enc, y


POSITIONS = [4999, 4998, 3001, 1234, 777, 100, 51, 25, 3, 2, 1, 0, -1, -2, -25, -100, -2500, -4999]
out = {}
with torch.no_grad():
    for case in ['case1_question_16k', 'case2_tone_noise_24k']:
        cs = load_file(D + case + '.safetensors')
        kept = {}
        enc, ad = encode(cs['mel'].cuda().to(torch.bfloat16), lambda n, t: kept.__setitem__(n, t))
        assert torch.equal(enc.float().cpu(), cs['encoder_out']), case + ' encoder_out differs from the fixture'
        assert torch.equal(ad.float().cpu(), cs['adapter_out']), case + ' adapter_out differs from the fixture'
        if case.startswith('case2'):
            for n, t in kept.items():
                if n.startswith('L1.'):
                    continue
                t = t[0]
                # Conv1d outputs are [C, T]: store them time-major like the rest.
                if n.split('.')[-1] in ('pw1', 'glu', 'dw', 'bn', 'conv'):
                    t = t.mT
                out['case2.' + n] = t.contiguous().to(torch.bfloat16).cpu()
        print(case, 'matches the fixture exactly', flush=True)
        # The same encoder in float64 (weights, activations), fed the bf16 mel
        # and the unrounded fp32 positional table.
        enc, ad = encode(cs['mel'].cuda().double(), lambda *_: None, W=W64)
        out[case[:5] + '.encoder_out_f64'] = enc.contiguous().cpu()
        out[case[:5] + '.adapter_out_f64'] = ad.contiguous().cpu()
    mel2 = load_file(D + 'case2_tone_noise_24k.safetensors')['mel'].cuda().to(torch.bfloat16)
    for n in [1, 2, 5, 8, 9, 16, 17, 40]:
        enc, ad = encode(mel2[:, :n].contiguous(), lambda *_: None)
        out['short%d.encoder_out' % n] = enc.contiguous().cpu()
        out['short%d.adapter_out' % n] = ad.contiguous().cpu()
    rows = torch.tensor([L - 1 - p for p in POSITIONS], device='cuda')
    for d in (64, 512):
        out['pe%d' % d] = create_pe(d)[0, rows].contiguous().cpu()
    out['pe_positions'] = torch.tensor(POSITIONS, dtype=torch.int64)
save_file(out, sys.argv[1] + '/ref.safetensors', metadata={
    'torch': torch.__version__, 'cudnn': str(torch.backends.cudnn.version()), 'gpu': torch.cuda.get_device_name()})
print('wrote', len(out), 'tensors;', torch.__version__, torch.backends.cudnn.version(), torch.cuda.get_device_name())
