"""A run's memory ceiling (`LAB_RUN_MEMORY_MB`): a run that outgrows it ends `failed` with the
reason, and its worker lives on. A watchdog thread counts what the run adds to the worker's
resident memory; on CPU runs the address space is capped too, so one huge allocation fails at once
(docs/architecture.md, "Resources")."""

from __future__ import annotations

import errno
import logging
import math
import os
import resource
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

log = logging.getLogger(__name__)

POLL_S = 0.05
RESIGNAL_S = 1.0  # the main thread did not stop (yet): ask again this often
SIGNAL = signal.SIGUSR2  # Celery's worker uses SIGUSR1 (tracebacks); SIGUSR2 only with CELERY_RDBSIG set
ADDRESS_SPACE_FACTOR = 2
MIB = 2**20
# Room in the address space for threads the run starts (transformers loads weights with a pool of up
# to 4): each reserves a stack and, at its first allocation, a malloc arena (glibc: 64 MiB, mapped at
# twice that while it is aligned). Reserved, not used (the watchdog counts what is used): without
# this room a loader thread could not start while the run had added 7 MiB.
ROOM_THREADS = 4
MALLOC_ARENA = 64 * MIB
DEFAULT_STACK = 8 * MIB  # glibc's thread stack where RLIMIT_STACK is unlimited
STATM = "/proc/self/statm"

T = TypeVar("T")


class OverMemoryCeiling(RuntimeError):
    """The run outgrew its ceiling; the message is the run's failure reason."""


class _OverCeiling(BaseException):
    """Raised in the main thread by the watchdog's signal, inside the training call only."""


def _statm_bytes() -> tuple[int, int] | None:
    """(address space, resident) of this process in bytes; None where /proc is missing."""
    try:
        with open(STATM) as f:
            size, resident = f.read().split()[:2]
    except OSError:
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    return int(size) * page, int(resident) * page


def resident_bytes() -> int | None:
    statm = _statm_bytes()
    return None if statm is None else statm[1]


# How C and C++ code words an allocation or a mapping the address-space limit refused: torch's
# allocator ("can't allocate memory"), torch and safetensors mapping a weights file ("unable to
# mmap …: Cannot allocate memory (12)"), the dynamic loader opening an extension module ("failed to
# map segment from shared object"), and Python a thread whose stack it could not map ("can't start
# new thread").
OUT_OF_MEMORY_WORDS = (
    "can't allocate memory",
    "cannot allocate memory",
    "failed to map segment",
    "can't start new thread",
)


def _is_out_of_memory(exc: BaseException) -> bool:
    """An allocation refused under the address-space limit, as Python, torch or the OS report it
    (C code that gets no memory can also return an error without setting one: a SystemError, seen
    importing a model's module in a rollout job)."""
    if isinstance(exc, MemoryError | SystemError):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return True
    if isinstance(exc, RuntimeError | ImportError | OSError):
        text = str(exc).lower()
        return any(words in text for words in OUT_OF_MEMORY_WORDS)
    return False


def thread_room() -> int:
    """Bytes of address space that `ROOM_THREADS` threads reserve: their stacks and malloc arenas,
    and one arena mapped twice over while it is aligned."""
    stack = threading.stack_size() or resource.getrlimit(resource.RLIMIT_STACK)[0]
    if stack == resource.RLIM_INFINITY:
        stack = DEFAULT_STACK
    return ROOM_THREADS * (stack + MALLOC_ARENA) + MALLOC_ARENA


def import_model_libraries() -> None:
    """Import what loading, training and sampling a model imports, before a run's ceiling holds.

    `import transformers` alone imports next to nothing (its modules load lazily): the first job
    of a worker imported some 1,500 modules (accelerate, safetensors, scipy, the model's code…)
    inside its ceiling, ≈130 MiB resident and ≈250 MiB of address space. Those are the worker's,
    not the run's, and an import under the address-space limit fails anywhere (in the import
    system, in an extension module's initialisation), leaving modules half-initialised for every
    later job of the worker. Imported once per process; later calls cost nothing."""
    import transformers.generation.utils  # noqa: F401
    from transformers import (  # noqa: F401
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationMixin,
        LlamaForCausalLM,  # the built-in tiny model's architecture
    )


class MemoryCeiling:
    """The ceiling of one run: `call` the training function under it."""

    def __init__(self, limit_mb: int, limit_address_space: bool = False):
        self.limit_mb = limit_mb
        self.limit_address_space = limit_address_space
        self.base = 0
        self.peak = 0  # the most the run added, as the watchdog saw it, in bytes
        self.over = False
        self._target: Any = None  # the code object of the training call
        self._stop = threading.Event()

    @property
    def enforced(self) -> str:
        """ "" if the ceiling can be enforced here, else why not."""
        if self.limit_mb <= 0:
            return "LAB_RUN_MEMORY_MB is 0"
        if threading.current_thread() is not threading.main_thread():
            return "the run is not executing in the worker's main thread"
        if _statm_bytes() is None:
            return f"{STATM} is missing (not Linux)"
        return ""

    def reason(self) -> str:
        used = math.ceil(self.peak / MIB)
        return f"memory: used {used:,} MiB > ceiling {self.limit_mb:,} MiB (LAB_RUN_MEMORY_MB)"

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` under the ceiling; raises `OverMemoryCeiling` when the run outgrew it."""
        why_not = self.enforced
        if why_not:
            if self.limit_mb > 0:
                log.warning("the memory ceiling of %s MiB is not enforced: %s", self.limit_mb, why_not)
            return fn(*args, **kwargs)
        self._target = getattr(fn, "__code__", None)
        size, self.base = _statm_bytes()
        previous_handler = signal.signal(SIGNAL, self._on_signal)
        watchdog = threading.Thread(
            target=self._watch, args=(threading.main_thread().ident,), name="memory-ceiling", daemon=True
        )
        watchdog.start()  # before the limit: its own stack and arena are the worker's
        previous_limit = self._limit_address_space(size) if self.limit_address_space else None
        added_mb = 0.0
        try:
            try:
                result = fn(*args, **kwargs)
            finally:
                # The address space back first: handling what the call did (an exception's message,
                # its traceback, the log) allocates too, and under the limit it could fail anywhere.
                if previous_limit is not None:
                    resource.setrlimit(resource.RLIMIT_AS, previous_limit)
                added_mb = self._added_mb()
                self._stop.set()
                watchdog.join()
                signal.signal(SIGNAL, previous_handler)
                log.info(
                    "the run used at most %s MiB above the worker's %s MiB (ceiling %s MiB)",
                    math.ceil(self.peak / MIB),
                    self.base // MIB,
                    self.limit_mb,
                )
        except _OverCeiling:
            raise OverMemoryCeiling(self.reason()) from None
        except Exception as exc:
            if self.over:  # whatever the training call made of the interruption
                raise OverMemoryCeiling(self.reason()) from exc
            if previous_limit is not None and _is_out_of_memory(exc):
                raise OverMemoryCeiling(
                    f"memory: an allocation failed under the ceiling of {self.limit_mb:,} MiB "
                    f"(LAB_RUN_MEMORY_MB; the address space may grow by {ADDRESS_SPACE_FACTOR}× it, "
                    f"plus room for {ROOM_THREADS} threads) "
                    f"with {added_mb:,.0f} MiB used: {type(exc).__name__}: {exc}"
                ) from exc
            raise
        if self.over:  # the signal came as the call returned: still over budget
            raise OverMemoryCeiling(self.reason())
        return result

    def _added_mb(self) -> float:
        return max(0, (resident_bytes() or 0) - self.base) / MIB

    def _limit_address_space(self, size: int) -> tuple[int, int] | None:
        previous = resource.getrlimit(resource.RLIMIT_AS)
        soft = size + ADDRESS_SPACE_FACTOR * self.limit_mb * MIB + thread_room()
        hard = previous[1]
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        if previous[0] != resource.RLIM_INFINITY and previous[0] <= soft:
            return None  # already tighter
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        return previous

    def _watch(self, main_thread: int) -> None:
        limit = self.limit_mb * MIB
        signalled = -math.inf
        while not self._stop.wait(POLL_S):
            added = (resident_bytes() or 0) - self.base
            self.peak = max(self.peak, added)
            if added > limit:
                self.over = True
                if time.monotonic() - signalled >= RESIGNAL_S:
                    signalled = time.monotonic()
                    signal.pthread_kill(main_thread, SIGNAL)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Raise in the main thread only inside the training call, where `call` catches it, and
        not while it imports a module: interrupted there, the module would stay half-initialised
        in `sys.modules` for every later job of the worker (the watchdog asks again soon)."""
        while frame is not None:
            if frame.f_code is self._target:
                raise _OverCeiling
            if frame.f_code.co_filename.startswith("<frozen importlib"):
                return
            frame = frame.f_back
