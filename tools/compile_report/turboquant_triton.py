"""The ``turboquant_triton`` kernels for Hopper (sm_90): registers, spill stack, shared
memory and instruction counts. This is how the configurations in
``backends/turboquant_triton/configs.py`` were checked before a GPU ran them: each must
compile for sm_90 without spilling, and the decode kernel's hot loop is counted in
instructions per weight (the body of the longest loop)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantcore.triton.compile_report import (
    backward_loops,
    compile_sm90,
    instructions,
    occupancy_sm90,
    opcode_counts,
    opcodes_in,
    wgmma_waits,
)

__all__ = ["report"]

_GEMV_PTRS = {"x_ptr": "*bf16", "x2_ptr": "*bf16", "idx_ptr": "*i32", "scale_ptr": "*fp32", "rot_ptr": "*bf16",
              "idx2_ptr": "*i32", "scale2_ptr": "*fp32", "rot2_ptr": "*bf16", "cb_ptr": "*fp32", "out_ptr": "*bf16",
              "partial_ptr": "*fp32", "bias_ptr": "*fp32", "ws_ptr": "*fp32", "ticket_ptr": "*i32"}
_MMA_PTRS = {"x_ptr": "*bf16", "idx_ptr": "*i32", "scale_ptr": "*fp32", "rot_ptr": "*bf16", "idx2_ptr": "*i32",
             "scale2_ptr": "*fp32", "rot2_ptr": "*bf16", "cb_ptr": "*fp32", "out_ptr": "*bf16",
             "partial_ptr": "*fp32", "bias_ptr": "*fp32", "ws_ptr": "*fp32", "ticket_ptr": "*i32", "xr_ptr": "*bf16",
             "sync_ptr": "*i32"}
_DEQ_PTRS = {"idx_ptr": "*i32", "scale_ptr": "*fp32", "cb_ptr": "*fp32", "out_ptr": "*bf16"}
_FOLD_PTRS = {"idx1_ptr": "*i32", "s1_ptr": "*fp32", "rot1_ptr": "*bf16", "idx2_ptr": "*i32", "s2_ptr": "*fp32",
              "rot2_ptr": "*bf16", "cb_ptr": "*fp32", "out_ptr": "*bf16"}


def _compile(fn: Any, runtime: dict[str, str], const: dict[str, Any], warps: int, stages: int,
             dump: Path | None = None, maxnreg: int | None = None) -> dict[str, Any]:
    # What the launcher would assume for 16-aligned pointers and strides.
    options = {"num_warps": warps, "num_stages": stages, **({"maxnreg": maxnreg} if maxnreg else {})}
    # (``rotating``, a z-slice count of 1 or 2 at the measured shapes, is not.)
    compiled = compile_sm90(fn, runtime, const, options=options,
                            divisible=[a for a in runtime if a not in ("M", "rotating")])
    if dump is not None:
        dump.write_text(compiled.sass)
    return {"registers": compiled.registers, "spill_stack": compiled.spill_stack, "shared": compiled.shared,
            "blocks_per_sm": occupancy_sm90(compiled.registers, warps, compiled.shared), "sass": compiled.sass}


def _longest_loop(sass: str) -> Any:
    """Opcode counts of the longest loop (the decode kernel's row walk)."""
    ins = instructions(sass)
    loops = backward_loops(ins)
    if not loops:
        return opcode_counts([])
    return opcode_counts(opcodes_in(ins, max(loops, key=lambda span: len(opcodes_in(ins, span)))))


def _loop_and_prologue(sass: str) -> tuple[Any, Any, dict[str, int]]:
    """Opcode counts of the longest loop (the tensor-core kernel's group loop) and of the
    instructions before it, and the loop's wgmma waits by their bound (``wgmma_waits``)."""
    ins = instructions(sass)
    loops = backward_loops(ins)
    if not loops:
        return opcode_counts([]), opcode_counts(i.opcode for i in ins), {}
    span = max(loops, key=lambda s: len(opcodes_in(ins, s)))
    return (opcode_counts(opcodes_in(ins, span)), opcode_counts(i.opcode for i in ins if i.address < span[0]),
            wgmma_waits(ins, span))


#: Opcodes of the tensor-core kernel's group loop counted per weight (``loop_per_weight``).
_MMA_OPCODES = ("LDG", "LDGSTS", "LDS", "LDSM", "STS", "PRMT", "F2FP", "FMUL", "BAR", "HGMMA", "WARPGROUP")


def _mma_rows(cfg: Any, everything: bool, sass_dir: Path | None) -> list[dict[str, Any]]:
    """The tensor-core kernel at ``cfg`` with x rotated outside it, inside it by every
    program, and once by its rotation programs (``rotation``; one pass, with
    ``everything`` also two with their own rotations), its weight operand through shared
    memory and made in its register layout (``register_operand``, ``operand.py``), that
    with the group scale in it (``scaled_operand``). ``loop_wgmma_waits``: the group
    loop's wgmma waits by how many MMA groups each leaves pending (``{"0": 1}``: one wait
    a group for all of its MMAs). ``rotation_loads_in_loop``: global loads (LDG, LDGSTS) in the group loop beyond the
    outside variant's (fewer with two passes: one x tile for both) — not above 0 when Π
    stays where it was loaded before the loop, and 0 for the rotation once, whose group
    loop reads the rotated x as the outside variant's does. ``loop_per_weight``: the
    group loop's instructions (``total``) and some of its opcodes per weight a thread
    multiplies in one pass of it."""
    from quantcore.backends.turboquant_triton import configs, mma

    rows, base_loads = [], {}
    # Two warpgroups on one 64-row tile would both look every row up (twice the lookups):
    # fused.py keeps the shared-memory operand there.
    operands = ((False, False), (True, False), (True, True)) if cfg.block_n >= 16 * cfg.warps else ((False, False),)
    for register, scaled in operands:
        for two in (False, True) if everything else (False,):
            # a tile wider than that never rotates x in its launch (configs.mma_rotation)
            wide = cfg.block_m > configs.ROTATION_MAX_BLOCK_M
            for where in ("outside",) if wide else ("outside", "kernel", "once"):
                rotate = where == "kernel"
                const = dict(N_GROUPS=32, D=128, GPC=cfg.gpc, SPLIT=2, BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m,
                             TWO_PASSES=two, X_COPIES=2 if two else 1, ROTATE=rotate, ROTATE_ONCE=where == "once",
                             REG_OPERAND=register, SCALED=scaled, HAS_PARTIAL=True, HAS_BIAS=True, DOT_FP32=False, INTERPRET=False)
                runtime = {**_MMA_PTRS, "M": "i32", "N": "i32", "stride_idx": "i32", "stride_idx2": "i32",
                           "rotating": "i32"}
                name = f"mma-{cfg.block_n}x{cfg.block_m}-g{cfg.gpc}-w{cfg.warps}-s{cfg.stages}-p{1 + two}"
                name += {"outside": "-out", "kernel": "-in", "once": "-once"}[where] + ("-reg" if register else "") + ("-scaled" if scaled else "")
                res = _compile(mma.mma_kernel, runtime, const, cfg.warps, cfg.stages,
                               sass_dir / f"{name}.sass" if sass_dir else None)
                sass = res.pop("sass")
                loop, before, waits = _loop_and_prologue(sass)
                hist = opcode_counts(i.opcode for i in instructions(sass))
                loads = loop["LDG"] + loop["LDGSTS"]
                weights = cfg.block_n * 128 * (1 + two) / (32 * cfg.warps)
                per_weight = {op: round(loop[op] / weights, 3) for op in _MMA_OPCODES}
                row = {"kernel": "mma",
                       **{k: v for k, v in cfg.__dict__.items()
                          if k not in ("rotate_in_kernel", "rotate_once", "register_operand", "scaled_operand")},
                       "passes": 1 + two, "rotation": where, "rotate_in_kernel": rotate,
                       "register_operand": register, "scaled_operand": scaled, **res, "wgmma": hist["HGMMA"], "mma_sync": hist["HMMA"],
                       "wgmma_in_loop": loop["HGMMA"], "loop_instructions": sum(loop.values()),
                       "loop_wgmma_waits": waits,
                       "loop_per_weight": {"total": round(sum(loop.values()) / weights, 2), **per_weight},
                       "prologue_global_loads": before["LDG"] + before["LDGSTS"]}
                if where == "outside":
                    base_loads[two, register, scaled] = loads
                else:
                    row["rotation_loads_in_loop"] = loads - base_loads[two, register, scaled]
                rows.append(row)
    return rows


def report(*, sass_dir: Path | None = None, everything: bool = False) -> list[dict[str, Any]]:
    """One row per kernel variant: the decode kernel at its default and shipped geometries
    (K = 4096, d = 128; one pass, and two with ``everything``), the tensor-core kernel at
    its M tiles with x rotated outside it, inside it and once by its rotation programs,
    the dequantization kernel and the fold kernel (one and two passes)."""
    from quantcore.backends.turboquant_triton import configs, dequant, fold, gemv
    from quantcore.backends.turboquant_triton.fused import (
        DEQUANT_COLUMNS,
        DEQUANT_ROWS,
        DEQUANT_WARPS,
    )
    from quantcore.probe.card import CardKey
    from quantcore.probe.card_tables import H100_SXM

    rows: list[dict[str, Any]] = []
    h200 = CardKey("sm_90", 132, 227, 4)
    shipped = [*configs.table(H100_SXM).values(), *configs.table(h200).values()]
    gemv_cfgs = {configs.GemvConfig(), configs.gemv_config(None, 4096, 14336, 128, 2, "bfloat16")}
    gemv_cfgs |= {c for c in shipped if isinstance(c, configs.GemvConfig)}
    gemv_cfgs |= set(configs.GEMV_VARIANTS)
    for cfg in sorted(gemv_cfgs, key=str):
        for two in ((False, True) if everything else (False,)):
            if two and cfg.unroll > 1:
                continue  # the two-pass kernels run unrolled once (registers): their own config
            const = dict(N_GROUPS=32, D=128, GPC=cfg.gpc, SPLIT=32 // cfg.gpc, SPLIT_P2=32 // cfg.gpc,
                         ROWS_CTA=14 * cfg.br, BR=cfg.br, TAIL=128, UNROLL=cfg.unroll,
                         TWO_PASSES=two, X_ROTATED=cfg.prerotate, HAS_PARTIAL=True, HAS_BIAS=True, DOT_FP32=False,
                         LOOKUP=configs.LOOKUPS.index(cfg.lookup), PDL=cfg.pdl, INTERPRET=False,
                         HALVES=cfg.halves)
            runtime = {**_GEMV_PTRS, "N": "i32", "stride_idx": "i32", "stride_idx2": "i32"}
            if cfg.prerotate:  # the float32 rows gemv.rotate_kernel writes
                runtime |= {"x_ptr": "*fp32", "x2_ptr": "*fp32"}
            name = f"gemv-{cfg.gpc}-{cfg.br}-{cfg.warps}-{cfg.maxnreg}-r{int(cfg.prerotate)}-{cfg.lookup}-{int(two)}{'-halves' * cfg.halves}"
            dump = sass_dir / f"{name}.sass" if sass_dir else None
            res = _compile(gemv.gemv_kernel, runtime, const, cfg.warps, 1, dump, cfg.maxnreg)
            loop = _longest_loop(res.pop("sass"))
            # weights a thread handles in one pass of the loop body (unrolled steps)
            weights = cfg.unroll * cfg.br * cfg.gpc * 128 * (2 if two else 1) / (32 * cfg.warps)
            rows.append({"kernel": "gemv", "passes": 1 + two, **cfg.__dict__, **res,
                         "loop_instructions_per_weight": round(sum(loop.values()) / weights, 2),
                         "loop_lds_per_weight": round(loop["LDS"] / weights, 2)})
    mma_cfgs = {configs.mma_rule(m, inside) for m in (16, 32, 64) for inside in (False, True)}
    mma_cfgs |= {c for c in shipped if isinstance(c, configs.MmaConfig)}
    geometries = {(c.block_n, c.block_m, c.gpc, c.warps, c.stages): c for c in sorted(mma_cfgs, key=str)}
    for _, cfg in sorted(geometries.items()):  # what the compiler sees (ctas only sizes the grid)
        rows += _mma_rows(cfg, everything, sass_dir)
    gpc = DEQUANT_COLUMNS // 128
    const = dict(N_GROUPS=32, D=128, BLOCK_N=DEQUANT_ROWS, GPC=gpc, PASSES=2, INTERPRET=False)
    runtime = {**_DEQ_PTRS, "N": "i32", "stride_idx": "i32", "stride_out": "i32", "col0": "i32"}
    res = _compile(dequant.dequant_kernel, runtime, const, DEQUANT_WARPS, 1)
    res.pop("sass")
    rows.append({"kernel": "dequant", "block_n": DEQUANT_ROWS, "gpc": gpc, **res})
    runtime = {**_FOLD_PTRS, "N": "i32", "stride_idx": "i32", "stride_out": "i32"}
    for d, passes in ((128, 1), (128, 2), (256, 1)):  # two passes of d = 256 are refused
        cfg = configs.fold_config(d, passes)
        const = dict(N_GROUPS=4096 // d, D=d, BLOCK_N=cfg.block_n, GPP=cfg.groups, ITERS=cfg.groups if not cfg.persistent else 4,
                     PERSISTENT=bool(cfg.persistent),
                     PASSES=passes, SHARED1=True,
                     SHARED2=True, REG_OPERAND=cfg.register_operand, STAGES=cfg.stages, DOT_FP32=False,
                     INTERPRET=False)
        res = _compile(fold.fold_kernel, runtime, const, cfg.warps, 1, None, cfg.maxnreg)
        sass = res.pop("sass")
        rows.append({"kernel": "fold", "d": d, "block_n": cfg.block_n, "warps": cfg.warps, "groups": cfg.groups,
                     "persistent": cfg.persistent,
                     "register_operand": cfg.register_operand, "passes": passes, **res,
                     "wgmma": sum(1 for line in sass.splitlines() if "HGMMA" in line)})
    return rows
