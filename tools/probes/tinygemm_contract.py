"""Measure tinygemm's contract on the GPU at hand: which nibble order
``_convert_weight_to_int4pack`` wants and which dequantization ``_weight_int4pack_mm``
applies, plus the shapes and dtypes it accepts. Run: ``python -m
tools.probes.tinygemm_contract``. It prints what it saw; ``backends/aten_cuda/transform.py``
encodes the answer (and docs/aten-int4pack.md states it)."""

from __future__ import annotations

import torch


def _try(fn, *args):
    try:
        return fn(*args), ""
    except Exception as exc:
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"


def main() -> None:
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    gen = torch.Generator().manual_seed(0)
    n, k, gs, m = 256, 1024, 128, 16
    q = torch.randint(0, 16, (n, k), generator=gen)
    s = (torch.rand(k // gs, n, generator=gen) * 0.02 + 0.01).to(torch.bfloat16)
    z = (torch.randn(k // gs, n, generator=gen) * 0.05).to(torch.bfloat16)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    g = torch.arange(k) // gs
    sf, zf = s.float()[g].T, z.float()[g].T  # [N, K]
    formulas = {"(q-8)*s+z": (q - 8) * sf + zf, "q*s+z": q * sf + zf, "(q-z)*s": (q - zf) * sf}
    packs = {
        "even-high": (q[:, 0::2] << 4 | q[:, 1::2]).to(torch.uint8),
        "even-low": (q[:, 1::2] << 4 | q[:, 0::2]).to(torch.uint8),
    }
    sz = torch.stack([s, z], dim=-1).contiguous().to(dev)
    for tiles in (2, 4, 8):
        for pname, packed in packs.items():
            w, err = _try(torch.ops.aten._convert_weight_to_int4pack, packed.to(dev), tiles)
            if w is None:
                print(f"tiles={tiles} {pname}: convert failed {err}")
                continue
            y, err = _try(torch.ops.aten._weight_int4pack_mm, x.to(dev), w, gs, sz)
            if y is None:
                print(f"tiles={tiles} {pname}: mm failed {err}")
                continue
            y = y.float().cpu()
            errs = {f: ((y - x.double() @ ref.double().T).norm() / (x.double() @ ref.double().T).norm()).item()
                    for f, ref in formulas.items()}
            print(f"tiles={tiles} {pname}: packed {tuple(w.shape)} {w.dtype}; rel err " +
                  ", ".join(f"{f} {e:.2e}" for f, e in errs.items()))
    w = torch.ops.aten._convert_weight_to_int4pack(packs["even-high"].to(dev), 8)
    for dt in (torch.float16, torch.float32):
        _, err = _try(torch.ops.aten._weight_int4pack_mm, x.to(dev, dt), w, gs, sz.to(dt))
        print(f"activation {dt}: {err or 'accepted'}")
    for gsz in (16, 32, 256, 512):
        szg = torch.zeros(k // gsz, n, 2, dtype=torch.bfloat16, device=dev)
        _, err = _try(torch.ops.aten._weight_int4pack_mm, x.to(dev), w, gsz, szg)
        print(f"group {gsz}: {err or 'accepted'}")
    for nn_, kk, tiles in ((40, 1024, 8), (24, 1024, 8), (256, 96, 2), (256, 64, 4)):
        qq = torch.randint(0, 256, (nn_, kk // 2), generator=gen, dtype=torch.int32).to(torch.uint8)
        _, err = _try(torch.ops.aten._convert_weight_to_int4pack, qq.to(dev), tiles)
        print(f"convert N={nn_} K={kk} tiles={tiles}: {err or 'accepted'}")


if __name__ == "__main__":
    main()
