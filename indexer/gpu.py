"""Whether faiss builds the index on the GPU (``CCRK_INDEX_GPU``: auto, on, off), decided once per process.

The GPU is used when faiss is a GPU build (it has ``StandardGpuResources``), ``faiss.get_num_gpus() > 0``
and a one-vector self-test passes: one vector added to a ``GpuIndexFlatIP`` (through ``index_cpu_to_gpu``,
the path the builds take) and searched, its answer checked. Otherwise the CPU, and one log line says which
and why: faiss sees no GPU; a faiss-cpu build; the self-test failed, with the driver's error (CUDA error 209,
a wheel without kernels for this GPU's architecture; error 35, a driver older than the wheel's CUDA
runtime; out of memory).

``on`` with a GPU that fails is not an error: the build runs on the CPU all the same and the line is a
warning (a build that must not be slow can check the build report's ``device``). ``off`` never touches
CUDA.

The real faiss is probed in a child process: faiss-gpu reports a CUDA error by ``FAISS_ASSERT``, which
aborts the process (error 209 on Hopper with faiss-gpu-cu12 1.14.1, error 35 with too old a driver, from
``get_num_gpus`` itself), so only a child can fail that way and tell. A faiss given as ``faiss_module`` is
probed in this process: tests pass one whose GPU entry points raise what a real driver says.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import numpy as np

log = logging.getLogger(__name__)

GpuMode = Literal["auto", "on", "off"]
PROBE_TIMEOUT_S = 180.0  # CUDA start-up, and a PTX JIT of the kernels on an architecture without SASS
FAISS_DISTRIBUTIONS = ("faiss-cpu", "faiss-gpu", "faiss-gpu-cu12", "faiss-gpu-cuvs")
# What a failing driver says, and what to do about it (matched lower-cased, in this order).
_HINTS = (
    (
        ("error 209", "no kernel image"),
        "this faiss build has no kernels for the GPU's architecture (faiss-gpu 1.15.1 covers sm_70-sm_90)",
    ),
    (
        ("error 35", "driver version is insufficient", "error 803", "unsupported display driver"),
        "the NVIDIA driver is older than this faiss build's CUDA runtime: pick the gpu extra from"
        " nvidia-smi's driver version (docs/how-to/deploy.md)",
    ),
    (("out of memory", "alloc fail", "cudaerrormemoryallocation"), "the GPU is out of memory"),
)


@dataclass(frozen=True)
class GpuDecision:
    """Where faiss builds: ``use_gpu``, and why (``reason``); ``warning``: asked for (``on``) and refused."""

    use_gpu: bool
    reason: str
    mode: GpuMode = "auto"
    warning: bool = False

    @property
    def device(self) -> str:
        return "gpu" if self.use_gpu else "cpu"

    @property
    def message(self) -> str:
        where = "on the GPU" if self.use_gpu else "on the CPU"
        return f"faiss index builds {where} (CCRK_INDEX_GPU={self.mode}): {self.reason}"


@dataclass(frozen=True)
class Probe:
    """What faiss says about the GPUs: how many it sees, and the error of the self-test (None: passed)."""

    gpus: int
    error: str | None = None


def self_test(faiss_module: Any, device: int = 0) -> None:
    """One vector on the GPU, added and searched (a ``GpuIndexFlatIP`` made by ``index_cpu_to_gpu``): raises
    what faiss raises, or RuntimeError when the answer is wrong."""
    vector = np.array([[0.6, 0.8, 0.0, 0.0]], dtype=np.float32)
    cpu = faiss_module.IndexFlatIP(vector.shape[1])
    cpu.add(vector)
    resources = faiss_module.StandardGpuResources()
    index = faiss_module.index_cpu_to_gpu(resources, device, cpu)
    scores, ids = index.search(vector, 1)
    if int(ids[0, 0]) != 0 or abs(float(scores[0, 0]) - 1.0) > 1e-4:
        raise RuntimeError(f"GPU self-test answered id {ids[0, 0]} score {scores[0, 0]:.6f} (want id 0, 1.0)")


def probe(faiss_module: Any) -> Probe:
    """``get_num_gpus`` and the self-test, in this process (a C++ abort of faiss ends it)."""
    try:
        gpus = int(faiss_module.get_num_gpus())
    except Exception as exc:  # a stand-in's, or faiss built to throw: the driver's error
        return Probe(0, first_line(exc))
    if gpus == 0:
        return Probe(0)
    try:
        self_test(faiss_module)
    except Exception as exc:
        return Probe(gpus, first_line(exc))
    return Probe(gpus)


# The child of ``probe_isolated``: the real faiss, probed as ``probe`` does, one JSON line on stdout.
_CHILD = """
import json, sys
sys.path.insert(0, {root!r})
import faiss
from indexer.gpu import probe
result = probe(faiss)
print(json.dumps({{"gpus": result.gpus, "error": result.error}}), flush=True)
"""


def probe_isolated(command: list[str] | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """``probe`` of the real faiss in a child process, which a CUDA error may abort without ending this one.
    ``command``: another child (tests); it must print ``{"gpus": N, "error": ...}`` or fail."""
    root = str(Path(__file__).resolve().parent.parent)
    command = command or [sys.executable, "-c", _CHILD.format(root=root)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return Probe(0, f"the GPU probe did not finish in {timeout_s:g} s")
    except OSError as exc:
        return Probe(0, f"the GPU probe could not start: {exc}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        try:
            answer = json.loads(lines[-1])
            return Probe(int(answer["gpus"]), answer.get("error"))
        except (ValueError, KeyError, TypeError) as exc:  # a child that said something else
            return Probe(0, f"the GPU probe answered {lines[-1][:200]!r}: {exc}")
    said = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    # faiss's assertion names the CUDA error ("... details: CUDA error 209 no kernel image ..."); else the
    # child's last words.
    named = [line for line in said if "cuda error" in line.lower() or "faiss assertion" in line.lower()]
    text = (named or said or ["no output"])[-1]
    how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
    return Probe(0, f"{text[:500]} (the probe process ended: {how})")


def first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0][:500] if lines else ''}".rstrip(": ")


def explain(error: str) -> str:
    """``error`` with what it means, where it is one a driver is known to give."""
    lowered = error.lower()
    for words, meaning in _HINTS:
        if any(word in lowered for word in words):
            return f"{error}: {meaning}"
    return error


def installed_faiss() -> list[str]:
    """The faiss distributions installed here (two means one's files overwrote the other's)."""
    found = []
    for name in FAISS_DISTRIBUTIONS:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return found


def decide(mode: GpuMode = "auto", faiss_module: Any = None) -> GpuDecision:
    """Where faiss builds under ``mode``, logged in one line (a warning when ``on`` is refused).
    ``faiss_module``: probe this one in process instead of the real faiss in a child."""
    if faiss_module is None:
        import faiss as faiss_module_real

        module, isolated = faiss_module_real, True
    else:
        module, isolated = faiss_module, False
    decision = _decide(mode, module, isolated)
    log.log(logging.WARNING if decision.warning else logging.INFO, decision.message)
    return decision


def _decide(mode: GpuMode, module: Any, isolated: bool) -> GpuDecision:
    if mode == "off":
        return GpuDecision(False, "switched off", mode)
    refused = mode == "on"
    if not hasattr(module, "StandardGpuResources"):
        both = installed_faiss() if isolated else []
        extra = f" ({', '.join(both)} installed: uninstall all, then install one)" if len(both) > 1 else ""
        return GpuDecision(
            False, f"this faiss is a CPU build (faiss-cpu: no GPU support){extra}", mode, refused
        )
    result = probe_isolated() if isolated else probe(module)
    if result.error is not None:
        return GpuDecision(False, f"GPU self-test failed: {explain(result.error)}", mode, refused)
    if result.gpus == 0:
        return GpuDecision(False, "faiss sees no GPU", mode, refused)
    plural = "s" if result.gpus > 1 else ""
    return GpuDecision(True, f"{result.gpus} GPU{plural}, the one-vector self-test passed on GPU 0", mode)


_DECIDED: dict[str, GpuDecision] = {}


def index_device(mode: GpuMode) -> GpuDecision:
    """``decide(mode)`` of the real faiss, once per process and mode (the probe starts CUDA in a child)."""
    if mode not in _DECIDED:
        _DECIDED[mode] = decide(mode)
    return _DECIDED[mode]
