"""One-off GPU probe: which aten attention ops give LSE, take GQA and varlen, and how fast (H200)."""
import json, os, time, traceback
import torch
import torch.nn.functional as F

dev = "cuda"
torch.manual_seed(0)
H, HKV, D = 32, 8, 128
out = {}

def bench(fn, n=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n

def ref_attn(q, k, v, causal):
    # q (Hq, Lq, D), k/v (Hkv, Lk, D) fp32 math, bottom-right causal
    g = q.shape[0] // k.shape[0]
    k = k.repeat_interleave(g, 0).float(); v = v.repeat_interleave(g, 0).float()
    s = q.float() @ k.transpose(-1, -2) / D ** 0.5
    if causal:
        lq, lk = q.shape[1], k.shape[1]
        m = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        s = s.masked_fill(~m, float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)

def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())

# 1. varlen flash: 64 rows of mixed length, causal
lens = torch.randint(200, 400, (64,)).tolist()
T = sum(lens)
cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=dev)
q = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
k = torch.randn(T, HKV, D, device=dev, dtype=torch.bfloat16)
v = torch.randn(T, HKV, D, device=dev, dtype=torch.bfloat16)
flops_causal = sum(4 * H * D * l * (l + 1) / 2 for l in lens)
for name, kk, vv in [("gqa", k, v), ("repeat", k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))]:
    try:
        f = lambda: torch.ops.aten._flash_attention_forward(q, kk, vv, cu, cu, max(lens), max(lens), 0.0, True, False, scale=D ** -0.5)
        r = f()
        o, lse = r[0], r[1]
        # check row 3
        a, b = int(cu[3]), int(cu[4])
        ro, rl = ref_attn(q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1), True)
        ms = bench(f)
        out[f"varlen_flash_causal_{name}"] = {"ms": ms, "tflops": flops_causal / ms / 1e9, "rel_err": rel(o[a:b].transpose(0, 1), ro),
                                              "lse_shape": list(lse.shape), "lse_err": rel(lse[:, a:b] if lse.dim()==2 else lse[0, :, a:b], rl)}
    except Exception as e:
        out[f"varlen_flash_causal_{name}"] = {"error": repr(e)[:300]}

# 2. padded cudnn / flash / sdpa with lse
L = max(lens); B = len(lens)
qp = torch.randn(B, H, L, D, device=dev, dtype=torch.bfloat16)
kp = torch.randn(B, HKV, L, D, device=dev, dtype=torch.bfloat16)
vp = torch.randn(B, HKV, L, D, device=dev, dtype=torch.bfloat16)
flops_pad = B * 4 * H * D * L * (L + 1) / 2
for name, kk, vv in [("gqa", kp, vp), ("repeat", kp.repeat_interleave(4, 1), vp.repeat_interleave(4, 1))]:
    for op in ["cudnn", "flash", "sdpa", "efficient"]:
        try:
            if op == "cudnn":
                f = lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(qp, kk, vv, None, True, 0.0, True, False, scale=D ** -0.5)
            elif op == "flash":
                f = lambda: torch.ops.aten._scaled_dot_product_flash_attention(qp, kk, vv, 0.0, True, False, scale=D ** -0.5)
            elif op == "efficient":
                f = lambda: torch.ops.aten._scaled_dot_product_efficient_attention(qp, kk, vv, None, True, 0.0, True, scale=D ** -0.5)
            else:
                f = lambda: (F.scaled_dot_product_attention(qp, kk, vv, is_causal=True, enable_gqa=kk.shape[1] != H), None)
            r = f()
            o = r[0]
            ro, rl = ref_attn(qp[5], kk[5] if kk.shape[1] == H else kp[5], vv[5] if kk.shape[1] == H else vp[5], True)
            res = {"ms": bench(f), "rel_err": rel(o[5], ro)}
            res["tflops_useful"] = flops_causal / res["ms"] / 1e9
            if op != "sdpa":
                lse = r[1]
                res["lse_shape"] = list(lse.shape)
                res["lse_err"] = rel(lse[5, :, : ro.shape[1]] if lse.dim() == 3 else lse[5], rl)
            out[f"padded_{op}_{name}"] = res
        except Exception as e:
            out[f"padded_{op}_{name}"] = {"error": repr(e)[:300]}

# 3. shared past: 100 suffixes of 50 tokens vs one 2500-token anchor, non-causal
nq, c = 100 * 50, 2500
q2 = torch.randn(1, H, nq, D, device=dev, dtype=torch.bfloat16)
k2 = torch.randn(1, HKV, c, D, device=dev, dtype=torch.bfloat16)
v2 = torch.randn(1, HKV, c, D, device=dev, dtype=torch.bfloat16)
fl = 4 * H * D * nq * c
for name, kk, vv in [("gqa", k2, v2), ("repeat", k2.repeat_interleave(4, 1), v2.repeat_interleave(4, 1))]:
    for op in ["cudnn", "flash", "varlen"]:
        try:
            if op == "cudnn":
                f = lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(q2, kk, vv, None, True, 0.0, False, False, scale=D ** -0.5)
            elif op == "flash":
                f = lambda: torch.ops.aten._scaled_dot_product_flash_attention(q2, kk, vv, 0.0, False, False, scale=D ** -0.5)
            else:
                qv, kv_, vv_ = q2[0].transpose(0, 1).contiguous(), kk[0].transpose(0, 1).contiguous(), vv[0].transpose(0, 1).contiguous()
                cq = torch.tensor([0, nq], dtype=torch.int32, device=dev); ck = torch.tensor([0, c], dtype=torch.int32, device=dev)
                f = lambda: torch.ops.aten._flash_attention_forward(qv, kv_, vv_, cq, ck, nq, c, 0.0, False, False, scale=D ** -0.5)
            r = f()
            res = {"ms": bench(f), "tflops": None}
            res["tflops"] = fl / res["ms"] / 1e9
            res["lse_shape"] = list(r[1].shape)
            out[f"past_{op}_{name}"] = res
        except Exception as e:
            out[f"past_{op}_{name}"] = {"error": repr(e)[:300]}

# 4. compile of a token-wise block with dynamic T
try:
    w = torch.randn(9728, 2560, device=dev, dtype=torch.bfloat16) * 0.02
    def blk(x, g):
        xf = x.float(); xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        y = (xf * g).to(x.dtype)
        return F.silu(y @ w.T) * (y @ w.T)
    cb = torch.compile(blk, dynamic=True)
    g = torch.ones(2560, device=dev)
    t0 = time.time()
    for n in (1000, 3000, 5000, 7777):
        x = torch.randn(n, 2560, device=dev, dtype=torch.bfloat16)
        y = cb(x, g)
    torch.cuda.synchronize()
    out["compile_dynamic"] = {"s_for_4_shapes": time.time() - t0, "err": rel(y, blk(x, g))}
except Exception:
    out["compile_dynamic"] = {"error": traceback.format_exc()[-600:]}

print(json.dumps(out, indent=1))
os.makedirs(os.environ.get("OUT", "."), exist_ok=True)
open(os.path.join(os.environ.get("OUT", "."), "attention_probe.json"), "w").write(json.dumps(out, indent=1))
