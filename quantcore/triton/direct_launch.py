"""A compiled kernel's C launcher called directly, its weight's TMA descriptors encoded once.

In Triton 3.6 a kernel that takes host tensor descriptors is launched through a Python
wrapper (``wrap_handle_tensordesc`` in ``triton/backends/nvidia/driver.py``) that turns
every descriptor into the C launcher's arguments at every call: it encodes a
``CUtensorMap`` (``cuTensorMapEncodeTiled``) and spreads its shape and strides. A layer
passes its weight's descriptors, the same objects every call: :func:`direct_launch`
encodes those once, when the kernel is bound, and generates one function that hands the
C launcher the tuple the wrapper would have built, encoding the others per call — or
passing a per-call descriptor's last encoding again when it encodes the same thing.

It reads what the wrapper keeps in its closure (the C launcher, the descriptor positions
and their metadata) and checks that everything is as docs/triton-launch.md describes; any
difference is a reason, and the caller keeps launching through Triton's launcher.
Imports triton: load it only where a kernel runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["DirectLaunch", "direct_launch"]

#: ``direct(grid, stream, args)``: launches and returns True, or returns False (nothing
#: launched) when a fixed position holds another object than the one encoded.
DirectLaunch = Callable[[tuple[int, int, int], int, tuple[Any, ...]], bool]

#: The C launcher's leading arguments: grid x, y, z, stream, function, cooperative grid,
#: programmatic dependent launch, global and profile scratch, packed metadata, launch
#: metadata, enter hook, exit hook.
BASE_ARGS = 13
_FREE = ("launcher", "tensordesc_indices", "tensordesc_meta")


#: A per-call TMA descriptor, its last encoding kept: the ``CUtensorMap`` that
#: ``make_tensordesc_arg`` fills depends on the descriptor's base address, shape, strides
#: and padding (the element type, box and swizzle are the compiled kernel's metadata, fixed
#: for this function), so a call whose descriptor has all of them equal (the caching
#: allocator hands an eager loop the same block) passes the same encoding; any difference
#: encodes again. Only the address is kept, never the tensor, so the block can come back.
#: The pair is replaced whole: a thread reads one call's key with that call's encoding.
_ENCODE_LAST = (
    "    k{i} = (a{i}.base.data_ptr(), a{i}.base.dtype, a{i}.padding, *a{i}.shape, *a{i}.strides)\n"
    "    h{i} = last{i}[0]\n"
    "    if h{i}[0] == k{i}:\n"
    "        e{i} = h{i}[1]\n"
    "    else:\n"
    "        e{i} = driver.make_tensordesc_arg(a{i}, m{i})\n"
    "        last{i}[0] = (k{i}, e{i})\n"
)


def _driver() -> Any:
    from triton.backends.nvidia import driver

    return driver


def _wrapper_code(driver: Any) -> Any:
    """The code of the closure ``wrap_handle_tensordesc`` returns, or None."""
    wrap = getattr(driver, "wrap_handle_tensordesc", None)
    consts = getattr(getattr(wrap, "__code__", None), "co_consts", ())
    return next((c for c in consts if getattr(c, "co_name", None) == "inner"), None)


def _wrapped(launcher: Any, driver: Any) -> tuple[dict[str, Any], str]:
    """The wrapper's free variables by name, or the reason they cannot be used."""
    if type(launcher) is not getattr(driver, "CudaLauncher", None):
        return {}, f"the launcher is a {type(launcher).__qualname__}, not Triton's CudaLauncher"
    if getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1):
        return {}, "the kernel takes global or profile scratch (Triton's launcher allocates it per call)"
    if getattr(driver, "_BASE_ARGS_FORMAT_LEN", None) != BASE_ARGS:
        return {}, f"the C launcher's leading arguments are not the {BASE_ARGS} this was written for"
    if not _takes_two(getattr(driver, "make_tensordesc_arg", None)):
        return {}, "driver.make_tensordesc_arg does not take (descriptor, metadata), as Triton 3.6's does"
    wrapper = getattr(launcher, "launch", None)
    code = getattr(wrapper, "__code__", None)
    if code is None or code is not _wrapper_code(driver):
        return {}, "the launcher's launch is not wrap_handle_tensordesc's closure (no descriptor argument, or another Triton)"
    free = dict(zip(code.co_freevars, (c.cell_contents for c in getattr(wrapper, "__closure__", None) or ()), strict=False))
    if any(name not in free for name in _FREE):
        return {}, f"wrap_handle_tensordesc's closure holds {sorted(free)}, not {list(_FREE)}"
    return free, ""


def _takes_two(encode: object) -> bool:
    """Whether ``encode`` is called as ``encode(descriptor, metadata)`` (Triton 3.8's takes a
    third argument: its encoding would raise at the first call)."""
    try:
        params = inspect.signature(encode).parameters.values()  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    return len(required) <= 2 <= len(positional) or any(p.kind is p.VAR_POSITIONAL for p in params)


def direct_launch(kernel: Any, args: Sequence[Any], tail: Sequence[Any],
                  fixed: Sequence[int]) -> tuple[DirectLaunch | None, str]:
    """For compiled ``kernel`` (launched with runtime ``args`` then constexprs ``tail``),
    the direct launch with the descriptors at positions ``fixed`` encoded now, from
    ``args``; or ``(None, reason)`` when its launcher is not as expected."""
    try:
        driver = _driver()
    except ImportError as exc:  # a Triton without the NVIDIA backend
        return None, f"triton.backends.nvidia.driver does not import: {exc}"
    launcher = kernel.run
    free, why = _wrapped(launcher, driver)
    if why:
        return None, why
    raw, meta = free["launcher"], free["tensordesc_meta"]
    try:
        indices = sorted(free["tensordesc_indices"])
        meta = list(meta)
    except TypeError:
        return None, "the wrapper's descriptor positions or metadata are not sequences"
    if not callable(raw):
        return None, f"the wrapped C launcher is a {type(raw).__qualname__}, not callable"
    if len(meta) != len(indices):
        return None, f"{len(indices)} descriptor positions for {len(meta)} metadata entries"
    if indices and not all(isinstance(i, int) and 0 <= i < len(args) for i in indices):
        return None, f"descriptor positions {indices} are not among the {len(args)} runtime arguments"
    missing = [p for p in fixed if p not in indices]
    if missing:
        return None, f"positions {missing} are not tensor descriptors of the compiled kernel (those are {indices})"
    which = {p: k for k, p in enumerate(indices)}
    scope: dict[str, Any] = {
        "driver": driver, "raw": raw, "function": kernel.function, "metadata": kernel.packed_metadata,
        "cooperative": launcher.launch_cooperative_grid, "pdl": launcher.launch_pdl,
    }
    passed: list[str] = []
    encode = ""
    for i in range(len(args)):
        if i in fixed:
            scope[f"f{i}"] = args[i]  # kept alive with the function: its CUtensorMap holds the base's address
            encoded = driver.make_tensordesc_arg(args[i], meta[which[i]])
            for j, value in enumerate(encoded):
                scope[f"e{i}_{j}"] = value
                passed.append(f"e{i}_{j}")
        elif i in which and meta[which[i]] is not None:
            scope[f"m{i}"] = meta[which[i]]
            scope[f"last{i}"] = [((), ())]  # (what was encoded, its encoding) of the last call
            encode += _ENCODE_LAST.format(i=i)
            passed.append(f"*e{i}")
        elif i in which:
            scope[f"m{i}"] = meta[which[i]]
            passed.append(f"*driver.make_tensordesc_arg(a{i}, m{i})")
        else:
            passed.append(f"a{i}")
    for j, value in enumerate(tail):
        scope[f"c{j}"] = value
        passed.append(f"c{j}")
    unpack = ", ".join(f"a{i}" for i in range(len(args)))
    same = " and ".join(f"a{i} is f{i}" for i in sorted(set(fixed))) or "True"
    src = (f"def direct(grid, stream, args):\n"
           f"    {unpack}{',' if len(args) == 1 else ''} = args\n"
           f"    if not ({same}):\n"
           f"        return False\n"
           f"{encode}"
           f"    raw(grid[0], grid[1], grid[2], stream, function, cooperative, pdl, None, None, metadata,\n"
           f"        None, None, None, {', '.join(passed)})\n"
           f"    return True\n")
    exec(src, scope)  # generated from argument positions, as Triton's own launcher is
    return scope["direct"], ""
