"""A Triton kernel launched for the price of a launch.

``kernel[grid](*args, **constexprs)`` costs tens of microseconds of host time per call in
Triton 3.6: it binds every argument to the signature, specialises each one (dtype and
16-byte alignment of every pointer, ``== 1`` and divisibility by 16 of every integer),
turns the specialisation and the options into a cache key, looks the compiled kernel up,
and builds launch metadata for the profiler hooks. A layer calls the same kernel with the
same constexprs and the same weight tensors every time: only the activation, the output
and the row count change.

:class:`Launch` holds one kernel with its constexprs and options fixed, for arguments of
which only the positions named ``varying`` change between calls. Its first call per
specialisation of those positions goes through ``kernel[grid]`` (which compiles or finds the
binary and launches it) and keeps the ``CompiledKernel`` it returns; later calls compute the
specialisation of the varying positions with Triton's own function (so a binary compiled
for an aligned pointer, or for ``M == 1``, is never run on anything else) and call the
compiled kernel's launcher directly: ``CompiledKernel.run(gx, gy, gz, stream, function,
packed_metadata, launch_metadata, enter_hook, exit_hook, *every_argument)`` — the
launcher takes the constexprs in their positions too and skips them. What Triton checks
per call and this does not: that the fixed positions still specialise alike (the caller
keeps them fixed: they are the weight's tensors and sizes, held with the prepared state)
and that the kernel's global constants did not change (module constants, set at import).

Triton's C launcher turns every pointer argument into an address: an ``int`` it takes as
it is; any other object it asks for ``data_ptr()`` and then asks the CUDA driver whether
that address is device memory (``cuPointerGetAttribute``): about 0.15 µs a tensor on an
H200 host. The positions named ``fixed_pointers`` hold the same tensor at every call (the
weight's): the first call per specialisation still goes through ``kernel[grid]`` with
the tensors (Triton specialises their dtype and alignment, and its launcher checks them
once), and the bound kernel keeps those tensors (as passed: the aliases below where the
owner must not be kept) and their addresses; a later call whose fixed positions hold the
very objects kept hands the launcher the addresses instead. A call with another object
in a fixed position is launched with the arguments as given. The positions named
``own_pointers`` hold tensors the caller allocated itself on the launch's device (its
outputs, its kept scratch): memory the driver query would find on the device every time, so
a bound call hands the launcher their ``data_ptr()`` (read per call: a fresh output has a
new address each time); the first call per specialisation passes them as tensors too.

A kernel that takes host tensor descriptors pays more per call: Triton's launcher encodes
each one (a ``CUtensorMap``) at every launch. The positions named ``fixed_descriptors``
hold the same descriptor object at every call (the weight's): those are encoded once per
compiled kernel and the C launcher is called directly (:mod:`.direct_launch`); the
others are encoded per call as Triton encodes them. A launch whose fixed positions hold
other objects goes through Triton's launcher.

Under Triton's interpreter (``TRITON_INTERPRET=1``; the kernel object is then no
``JITFunction``) every call takes the plain ``kernel[grid](...)`` path. What this relies on
in Triton 3.6 is written down in docs/triton-launch.md.

:func:`launch_state` keeps a dict per object (by identity, dropped with it) in which
launchers keep what they decided for a weight. They key it by a tensor of the weight, not
by the prepared-state object: the custom ops rebuild that object around the same tensors
at every call, and a bucket checks that the tensors it was made for are the ones given.
Nothing in a state may refer to its owner, or the two would live as long as the process:
a bucket remembers the owner by weak reference and binds it, its views and the tensor
descriptors on them over :func:`~.unowned.unowned` aliases of its memory.

Imports triton: import this module where a kernel runs, not at ``import quantcore``.
"""

from __future__ import annotations

import inspect
import logging
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from triton import knobs
from triton.runtime.errors import OutOfResources
from triton.runtime.jit import JITFunction

from .direct_launch import DirectLaunch, direct_launch
from .static_shared import opt_in

__all__ = ["Launch", "launch_state"]

Grid = tuple[int, int, int]

log = logging.getLogger(__name__)

#: False binds every launch with Triton's own descriptor handling (encoded per call): the
#: switch the host-cost measurement uses to time both ways.
ENCODE_FIXED_DESCRIPTORS_ONCE = True


_constexprs: dict[int, tuple[Any, list[str]]] = {}


def _constexpr_names(fn: Any) -> list[str]:
    """The ``tl.constexpr`` parameters of a ``@triton.jit`` function (compiled or
    interpreted), read once per function."""
    hit = _constexprs.get(id(fn))
    if hit is None or hit[0] is not fn:
        params = inspect.signature(fn.fn).parameters.values()
        hit = _constexprs[id(fn)] = (fn, [p.name for p in params if "constexpr" in str(p.annotation)])
    return hit[1]


class _Cuda:
    """What a launch asks the CUDA runtime and driver, looked up on first use (the CPU build
    of torch lacks the raw queries; tests replace them): the current device, its current
    stream, the guard that makes another device current, and the shared-memory opt-in of
    a compiled kernel before its first launch (:mod:`.static_shared`)."""

    device: Callable[[], int] | None = None
    stream: Callable[[int], int] | None = None
    guard: Callable[[int], Any] = torch.cuda.device
    shared_opt_in: Callable[[Any], object] = staticmethod(lambda kernel: None)

    @classmethod
    def load(cls) -> None:
        cls.device = torch._C._cuda_getDevice  # type: ignore[attr-defined]
        cls.stream = torch._C._cuda_getCurrentRawStream  # type: ignore[attr-defined]
        cls.shared_opt_in = staticmethod(opt_in)


class _Bound:
    """One compiled kernel, ready to launch: ``launch(grid, stream, args)`` calls its
    launcher without hooks (:func:`_launch_function`)."""

    __slots__ = ("fixed_addresses", "function", "kernel", "launch", "metadata", "run")

    def __init__(self, kernel: Any, args: tuple[Any, ...], tail: tuple[Any, ...], *, fixed: Sequence[int] = (),
                 own: Sequence[int] = (), direct: DirectLaunch | None = None) -> None:
        self.kernel = kernel
        self.run = kernel.run  # the launcher (loads the binary on first access)
        self.function = kernel.function
        self.metadata = kernel.packed_metadata
        #: The fixed positions handed to the launcher as addresses (their tensors held).
        self.fixed_addresses = tuple(sorted({i for i in fixed if args[i] is not None}))
        self.launch = _launch_function(self, args, tail, self.fixed_addresses, own, direct)


def _launch_function(bound: _Bound, args: tuple[Any, ...], tail: tuple[Any, ...], kept: Sequence[int],
                     own: Sequence[int], direct: DirectLaunch | None) -> Callable[[Grid, int, tuple[Any, ...]], None]:
    """``launch(grid, stream, args)``: ``bound``'s launcher called with no launch metadata
    or hooks, every argument in its position and then the constexprs ``tail``; the tensors
    this binding call passed at the ``kept`` positions as their addresses when ``args``
    holds those very objects there (else all of them as they are: the launcher then checks
    each), and the tensors at the ``own`` positions as their ``data_ptr()`` on every call;
    through ``direct`` (the fixed descriptors encoded once) when there is one and it takes
    the call. One generated function: no tuple of addresses, no joined argument list."""
    scope: dict[str, Any] = {"run": bound.run, "function": bound.function, "metadata": bound.metadata,
                             "direct": direct, "tail": tail}
    for i in kept:
        scope[f"t{i}"] = args[i]  # held: its address stays valid while this function lives
        scope[f"p{i}"] = args[i].data_ptr()
    for j, value in enumerate(tail):
        scope[f"c{j}"] = value

    def passed(fixed_as_addresses: bool) -> str:
        return "".join(f"p{i}, " if fixed_as_addresses and i in kept else f"a{i}.data_ptr(), " if i in own else f"a{i}, "
                       for i in range(len(args)))

    head = "run(grid[0], grid[1], grid[2], stream, function, metadata, None, None, None, "
    consts = "".join(f"c{j}, " for j in range(len(tail)))

    def call(fixed_as_addresses: bool, indent: str) -> str:
        if direct is None:
            return f"{indent}{head}{passed(fixed_as_addresses)}{consts})\n"
        return (f"{indent}args = ({passed(fixed_as_addresses)})\n"
                f"{indent}if not direct(grid, stream, args):\n"
                f"{indent}    {head}*args, *tail)\n")

    lines = ["def launch(grid, stream, args):\n", f"    ({''.join(f'a{i}, ' for i in range(len(args)))}) = args\n"]
    if kept:
        lines.append(f"    if {' and '.join(f'a{i} is t{i}' for i in kept)}:\n{call(True, ' ' * 8)}        return\n")
    lines.append(call(False, " " * 4))
    exec("".join(lines), scope)  # generated from argument positions, as Triton's own binder is
    return scope["launch"]  # type: ignore[no-any-return]


def _key_function(fn: JITFunction, varying: Sequence[int], backend: Any) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """``key(args)``: Triton's specialisation of the varying positions, as its binder makes
    it (the same native function, the same flags per parameter)."""
    from triton._C.libtriton import native_specialize_impl

    terms = []
    for i in varying:
        p = fn.params[i]
        terms.append(f"spec(backend, args[{i}], {bool(p.is_const)}, {not p.do_not_specialize}, "
                     f"{not p.do_not_specialize_on_alignment})")
    src = f"def key(args):\n    return ({', '.join(terms)}{',' if terms else ''})\n"
    scope: dict[str, Any] = {"spec": native_specialize_impl, "backend": backend}
    exec(src, scope)  # generated from parameter positions, as Triton's own binder is
    return scope["key"]  # type: ignore[no-any-return]


class Launch:
    """``fn`` with ``constexprs`` and ``options`` (``num_warps``, ``num_stages``, …) fixed,
    launched on ``device`` with the runtime arguments in their order; only the positions in
    ``varying`` may specialise differently from call to call (module docstring).

    ``fixed_descriptors``: positions of tensor descriptors that are the same object at every
    call, encoded once per compiled kernel. ``fixed_pointers``: positions of tensors (or
    None) that are the same object at every call, handed to the launcher as addresses.
    ``own_pointers``: positions of tensors the caller allocates itself on this launch's
    device (its outputs and scratch: their dtype fixed, fresh or kept allocations aligned
    alike), handed to the launcher as addresses read at every call, which spares its driver
    query of each (module docstring).

    ``launch(grid, *args)`` with a 3-tuple grid. ``bound`` says how many compiled kernels
    it holds (one per specialisation of the varying positions); ``fallback`` why it takes
    the plain path on every call (the interpreter, or a disagreement with Triton's binder);
    ``descriptor_fallback`` why its last bound kernel encodes the fixed descriptors at every
    call through Triton's launcher (empty when they are encoded once, or none are fixed)."""

    __slots__ = ("_bound", "_fn", "_index", "_key", "_kwargs", "_tail", "descriptor_fallback", "device", "fallback",
                 "fixed_descriptors", "fixed_pointers", "n_args", "own_pointers", "varying")

    def __init__(
        self, fn: Any, *, constexprs: Mapping[str, Any], options: Mapping[str, Any] | None = None,
        varying: Sequence[int] = (), fixed_descriptors: Sequence[int] = (), fixed_pointers: Sequence[int] = (),
        own_pointers: Sequence[int] = (), device: torch.device,
    ) -> None:
        names = list(fn.arg_names)
        consts = _constexpr_names(fn)
        self.n_args = len(names) - len(consts)
        if names[self.n_args:] != consts:
            raise TypeError(f"{fn.__name__}: constexpr parameters must come last, got {names}")
        unknown = sorted(set(constexprs) - set(consts))
        missing = [n for n in consts if n not in constexprs]
        if unknown or missing:
            raise TypeError(f"{fn.__name__}: constexprs {unknown} unknown, {missing} missing")
        if any(not 0 <= i < self.n_args for i in varying):
            raise TypeError(f"{fn.__name__}: varying positions {list(varying)} outside its {self.n_args} arguments")
        if any(not 0 <= i < self.n_args or i in varying for i in fixed_descriptors):
            raise TypeError(f"{fn.__name__}: fixed descriptor positions {list(fixed_descriptors)} must be among its "
                            f"{self.n_args} arguments and not varying {list(varying)}")
        if any(not 0 <= i < self.n_args or i in varying or i in fixed_descriptors for i in fixed_pointers):
            raise TypeError(f"{fn.__name__}: fixed pointer positions {list(fixed_pointers)} must be among its "
                            f"{self.n_args} arguments, not varying {list(varying)} nor fixed descriptors "
                            f"{list(fixed_descriptors)}")
        if any(not 0 <= i < self.n_args or i in varying or i in fixed_descriptors or i in fixed_pointers
               for i in own_pointers):
            raise TypeError(f"{fn.__name__}: own pointer positions {list(own_pointers)} must be among its "
                            f"{self.n_args} arguments, not varying {list(varying)}, fixed descriptors "
                            f"{list(fixed_descriptors)} nor fixed pointers {list(fixed_pointers)}")
        self._fn = fn
        self._kwargs = {**constexprs, **(options or {})}
        self._tail = tuple(constexprs[n] for n in consts)
        self.varying = tuple(varying)
        self.fixed_descriptors = tuple(fixed_descriptors)
        self.fixed_pointers = tuple(fixed_pointers)
        self.own_pointers = tuple(own_pointers)
        self.descriptor_fallback = ""
        self.device = device
        self._index = device.index if device.index is not None else 0
        self._bound: dict[Any, _Bound] = {}
        self._key: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None
        if not isinstance(fn, JITFunction):
            self.fallback = "Triton's interpreter"
        elif device.type != "cuda":  # another backend's runtime (triton-ascend): its own launch path
            self.fallback = f"not a CUDA device ({device.type})"
        else:
            self.fallback = ""
        if not self.fallback and _Cuda.device is None:
            _Cuda.load()

    @property
    def bound(self) -> int:
        return len(self._bound)

    def __call__(self, grid: Grid, *args: Any) -> None:
        if self.fallback:
            self._fn.run(*args, grid=grid, warmup=False, **self._kwargs)
            return
        index = self._index
        if _Cuda.device() != index:  # type: ignore[misc]
            with _Cuda.guard(index):
                self._launch(grid, args, _Cuda.stream(index))  # type: ignore[misc]
            return
        self._launch(grid, args, _Cuda.stream(index))  # type: ignore[misc]

    def on(self, stream: int, grid: Grid, *args: Any) -> None:
        """``self(grid, *args)`` on ``stream``: the current stream of this launch's device
        (its raw handle), read by a caller that keys scratch of its own by it, so that a
        call asks for it once. Under the plain path Triton reads it itself. (The body is
        ``__call__``'s, not shared through a helper: one Python frame less a launch.)"""
        if self.fallback:
            self._fn.run(*args, grid=grid, warmup=False, **self._kwargs)
            return
        index = self._index
        if _Cuda.device() != index:  # type: ignore[misc]
            with _Cuda.guard(index):
                self._launch(grid, args, stream)
            return
        self._launch(grid, args, stream)

    def _launch(self, grid: Grid, args: tuple[Any, ...], stream: int) -> None:
        key = self._key(args) if self._key is not None else None
        bound = self._bound.get(key)
        if bound is None:
            self._first(grid, args, self._index)
            return
        # A profiler may register a hook at any time (a HookChain's list, or a plain
        # function set in its place): looked up per call, inline (a launch's hot path).
        runtime = knobs.runtime
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        if getattr(enter, "calls", enter) or getattr(leave, "calls", leave):
            meta = bound.kernel.launch_metadata(grid, stream, *args, *self._tail)
            bound.run(grid[0], grid[1], grid[2], stream, bound.function, bound.metadata, meta, enter, leave,
                      *args, *self._tail)
            return
        bound.launch(grid, stream, args)

    def _first(self, grid: Grid, args: tuple[Any, ...], index: int) -> None:
        """Launch through ``kernel[grid]`` and keep the compiled kernel it ran."""
        if len(args) != self.n_args:
            raise TypeError(f"{self._fn.__name__}: {self.n_args} runtime arguments expected, got {len(args)}")
        for i in self.fixed_pointers:
            if args[i] is not None and not isinstance(args[i], torch.Tensor):
                raise TypeError(f"{self._fn.__name__}: fixed pointer position {i} ({self._fn.arg_names[i]}) "
                                f"expects a tensor or None, got a {type(args[i]).__qualname__}")
        for i in self.own_pointers:
            if not isinstance(args[i], torch.Tensor):
                raise TypeError(f"{self._fn.__name__}: own pointer position {i} ({self._fn.arg_names[i]}) "
                                f"expects a tensor, got a {type(args[i]).__qualname__}")
        while True:
            try:
                kernel = self._compile_and_run(grid, args)
                break
            except OutOfResources as exc:
                # A tile planned for a card with more shared memory than this one (a table's
                # or the rule's): the same arithmetic with a shallower software pipeline.
                stages = self._kwargs.get("num_stages")
                if not isinstance(stages, int) or stages <= 1:
                    raise
                log.info("%s: %s; compiling with num_stages=%d", self._fn.__name__, exc, stages - 1)
                self._kwargs["num_stages"] = stages - 1
        caches = self._fn.device_caches[index]
        if self._key is None:
            self._key = _key_function(self._fn, self.varying, caches[3])
        key = self._key(args)
        _, spec, _ = caches[4](*args, **self._kwargs)  # Triton's binder: what it compiled for
        if tuple(spec[i] for i in self.varying) != key:
            self.fallback = f"the specialisation of {self.varying} disagrees with Triton's binder: {key} vs {spec}"
            return
        self._bound[key] = _Bound(kernel, args, self._tail, fixed=self.fixed_pointers, own=self.own_pointers,
                                  direct=self._direct(kernel, args))

    def _compile_and_run(self, grid: Grid, args: tuple[Any, ...]) -> Any:
        """The compiled kernel, after its first launch through ``kernel[grid]``."""
        # Compiled and loaded first, so that a kernel with a static table of its own may be
        # allowed the shared memory it needs (static_shared.py) before it launches.
        kernel = self._fn.run(*args, grid=grid, warmup=True, **self._kwargs)
        if hasattr(kernel, "result"):  # compiled asynchronously
            kernel = kernel.result()
        _Cuda.shared_opt_in(kernel)
        self._fn.run(*args, grid=grid, warmup=False, **self._kwargs)
        return kernel

    def _direct(self, kernel: Any, args: tuple[Any, ...]) -> DirectLaunch | None:
        """The direct launch of ``kernel`` with this call's fixed descriptors encoded, or
        None (the reason in ``descriptor_fallback``)."""
        if not self.fixed_descriptors:
            return None
        if not ENCODE_FIXED_DESCRIPTORS_ONCE:
            self.descriptor_fallback = "switched off (ENCODE_FIXED_DESCRIPTORS_ONCE)"
            return None
        try:
            direct, self.descriptor_fallback = direct_launch(kernel, args, self._tail, self.fixed_descriptors)
        except Exception as exc:  # Triton's launcher, unlike what direct_launch checks: launch through it
            direct, self.descriptor_fallback = None, f"reading the launcher failed: {type(exc).__name__}: {exc}"
        return direct


_states: dict[int, tuple[weakref.ref[Any], dict[Any, Any]]] = {}
#: Re-entrant: a state's weakref callback may run (garbage collection) while this thread holds it.
_states_lock = threading.RLock()


def launch_state(owner: Any) -> dict[Any, Any]:
    """A dict kept for ``owner`` (a weight's tensor) while it lives, keyed by its identity:
    another object — a copy, a tensor moved to another device — gets its own. What the
    dict holds must not refer to ``owner`` (module docstring), else neither is ever freed."""
    hit = _states.get(id(owner))
    if hit is not None and hit[0]() is owner:
        return hit[1]
    with _states_lock:
        key = id(owner)
        state: dict[Any, Any] = {}

        # The table and the lock are bound here: at interpreter exit the module's globals
        # may be gone before the last tensors are.
        def drop(ref: weakref.ref[Any], key: int = key, states: dict[Any, Any] = _states,
                 lock: Any = _states_lock) -> None:
            with lock:
                if states.get(key, (None,))[0] is ref:
                    del states[key]

        _states[key] = (weakref.ref(owner, drop), state)
        return state
