"""``indexer.gpu``: where faiss builds (CCRK_INDEX_GPU auto/on/off), and that each way a GPU fails ends on
the CPU with one line saying why and an index equal to a CPU build's.

This machine has no GPU: ``GpuStandIn`` is faiss as a machine with one GPU shows it. Everything is the
real (CPU) faiss except the GPU entry points, which either work (a CPU copy of the index stands for the GPU
one) or raise what a real driver says: a driver too old for the wheel's CUDA runtime (error 35), an
architecture the wheel has no kernels for (error 209, faiss-gpu-cu12 1.14.1 on Hopper), out of memory.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import faiss
import numpy as np
import pytest

from indexer import gpu
from indexer.ann import IndexPlan, build_faiss_index

# What faiss-gpu says, word for word as faiss formats a failed CUDA call (FAISS_ASSERT_FMT in
# CUDA_VERIFY, and StandardGpuResources' allocation error), with the CUDA runtime's own error strings.
DRIVER_TOO_OLD = (
    "Faiss assertion 'err__ == cudaSuccess' failed in int faiss::gpu::getNumDevices() at"
    " /project/faiss/faiss/gpu/utils/DeviceUtils.cu:36; details: CUDA error 35 CUDA driver version is"
    " insufficient for CUDA runtime version"
)
NO_KERNEL = (
    "Faiss assertion 'err__ == cudaSuccess' failed in void faiss::gpu::runL2Norm(...) at"
    " /project/faiss/faiss/gpu/impl/L2Norm.cu:283; details: CUDA error 209 no kernel image is available for"
    " execution on the device"
)
OUT_OF_MEMORY = (
    "Error in virtual void* faiss::gpu::StandardGpuResourcesImpl::allocMemory("
    "const faiss::gpu::AllocRequest&) at /project/faiss/faiss/gpu/StandardGpuResources.cpp:570:"
    " Error: 'err == cudaSuccess' failed:"
    " StandardGpuResources: alloc fail type TemporaryMemoryBuffer dev 0 space Device stream 0x5581c0a0"
    " size 1610612736 bytes (cudaMalloc error out of memory [2])"
)


class _FailingGpuIndex:
    """A GPU index whose memory runs out on the first train or add (a build failing midway)."""

    def __init__(self, index: faiss.Index, error: str) -> None:
        self.index, self.error = index, error
        self.is_trained = index.is_trained

    def getDevice(self) -> int:  # what tells a GPU index apart in indexer.ann._train
        return 0

    def train(self, x: np.ndarray) -> None:
        raise RuntimeError(self.error)

    def add(self, x: np.ndarray) -> None:
        raise RuntimeError(self.error)


class GpuStandIn:
    """faiss with one GPU (``gpus``); each ``*_error`` makes that entry point raise it, ``build_error``
    makes every index after the self-test's fail on its first train or add, ``wrong_answer`` makes the GPU
    copy of an index lose its vectors."""

    def __init__(
        self,
        gpus: int = 1,
        *,
        count_error: str | None = None,
        resources_error: str | None = None,
        to_gpu_error: str | None = None,
        build_error: str | None = None,
        wrong_answer: bool = False,
    ) -> None:
        self.gpus, self.count_error = gpus, count_error
        self.resources_error, self.to_gpu_error = resources_error, to_gpu_error
        self.build_error, self.wrong_answer = build_error, wrong_answer
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(faiss, name)

    def get_num_gpus(self) -> int:
        self.calls.append("get_num_gpus")
        if self.count_error:
            raise RuntimeError(self.count_error)
        return self.gpus

    def StandardGpuResources(self) -> object:
        self.calls.append("StandardGpuResources")
        if self.resources_error:
            raise RuntimeError(self.resources_error)
        return object()

    def index_cpu_to_gpu(self, resources: object, device: int, index: faiss.Index) -> Any:
        self.calls.append("index_cpu_to_gpu")
        if self.to_gpu_error:
            raise RuntimeError(self.to_gpu_error)
        if self.wrong_answer:
            return faiss.IndexFlatIP(index.d)
        if self.build_error and self.calls.count("index_cpu_to_gpu") > 1:
            return _FailingGpuIndex(faiss.clone_index(index), self.build_error)
        return faiss.clone_index(index)

    def index_gpu_to_cpu(self, index: faiss.Index) -> faiss.Index:
        return faiss.clone_index(index)


def vectors(n: int, d: int = 32, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((20, d)).astype(np.float32)
    x = centres[rng.integers(0, 20, n)] + 0.5 * rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# Each failure: the stand-in showing it, and what the decision says it means.
FAILURES: dict[str, tuple[dict[str, str], str]] = {
    "driver too old": (
        {"count_error": DRIVER_TOO_OLD},
        "the NVIDIA driver is older than this faiss build's CUDA runtime: pick the gpu extra from"
        " nvidia-smi's driver version (docs/how-to/deploy.md)",
    ),
    "no kernels (error 209)": (
        {"to_gpu_error": NO_KERNEL},
        "this faiss build has no kernels for the GPU's architecture (faiss-gpu 1.15.1 covers sm_70-sm_90)",
    ),
    "out of memory at start": ({"resources_error": OUT_OF_MEMORY}, "the GPU is out of memory"),
}


def failing(case: str) -> GpuStandIn:
    return GpuStandIn(**FAILURES[case][0])


@pytest.mark.parametrize("case", list(FAILURES))
def test_a_failing_gpu_is_not_used_and_one_line_says_why(case: str, caplog: pytest.LogCaptureFixture) -> None:
    (error,), meaning = FAILURES[case][0].values(), FAILURES[case][1]
    with caplog.at_level(logging.INFO, logger="indexer.gpu"):
        decision = gpu.decide("auto", failing(case))
    assert not decision.use_gpu and decision.device == "cpu"
    assert decision.reason == f"GPU self-test failed: RuntimeError: {error}: {meaning}"
    (record,) = [r for r in caplog.records if r.name == "indexer.gpu"]
    assert record.levelno == logging.INFO
    assert record.getMessage() == f"faiss index builds on the CPU (CCRK_INDEX_GPU=auto): {decision.reason}"


def test_no_gpu_is_said(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="indexer.gpu"):
        decision = gpu.decide("auto", GpuStandIn(gpus=0))
    assert (decision.use_gpu, decision.reason) == (False, "faiss sees no GPU")
    assert [r.getMessage() for r in caplog.records if r.name == "indexer.gpu"] == [decision.message]


@pytest.mark.skipif(hasattr(faiss, "StandardGpuResources"), reason="faiss here is a GPU build")
def test_a_cpu_build_of_faiss_is_said_without_starting_a_probe() -> None:
    decision = gpu.decide("auto", faiss)  # faiss-cpu: no GPU entry points at all
    assert not decision.use_gpu
    assert decision.reason == "this faiss is a CPU build (faiss-cpu: no GPU support)"
    real = gpu.decide("auto")  # the real faiss: decided in this process, no child started for it
    assert real.reason.startswith("this faiss is a CPU build (faiss-cpu: no GPU support)")


def test_a_working_gpu_is_used_after_its_self_test() -> None:
    standin = GpuStandIn(gpus=2)
    decision = gpu.decide("auto", standin)
    assert decision.use_gpu and not decision.warning
    assert decision.reason == "2 GPUs, the one-vector self-test passed on GPU 0"
    assert standin.calls == ["get_num_gpus", "StandardGpuResources", "index_cpu_to_gpu"]


def test_the_self_test_checks_the_answer() -> None:
    decision = gpu.decide("auto", GpuStandIn(wrong_answer=True))
    assert not decision.use_gpu
    assert decision.reason.startswith("GPU self-test failed: RuntimeError: GPU self-test answered id -1")


def test_on_falls_back_with_a_warning_and_off_never_probes(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="indexer.gpu"):
        on = gpu.decide("on", GpuStandIn(to_gpu_error=NO_KERNEL))
        off_standin = GpuStandIn()
        off = gpu.decide("off", off_standin)
    assert not on.use_gpu and on.warning
    assert on.message.startswith("faiss index builds on the CPU (CCRK_INDEX_GPU=on): GPU self-test failed")
    assert (off.use_gpu, off.reason, off_standin.calls) == (False, "switched off", [])
    levels = [r.levelno for r in caplog.records if r.name == "indexer.gpu"]
    assert levels == [logging.WARNING, logging.INFO]


def _answers(index: faiss.Index, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = 4
    return index.search(queries, 10)


PLANS = [IndexPlan("Flat", "exact"), IndexPlan("IVF32,Flat", "ivf", build_params={"nlist": 32})]


@pytest.mark.parametrize("plan", PLANS, ids=[p.factory for p in PLANS])
@pytest.mark.parametrize("case", list(FAILURES))
def test_the_build_ends_on_the_cpu_with_a_cpu_builds_answers(case: str, plan: IndexPlan) -> None:
    embeds, queries = vectors(4000), vectors(50, seed=1)
    want_scores, want_ids = _answers(build_faiss_index(embeds, plan, use_gpu=False)[0], queries)
    index, notes = build_faiss_index(embeds, plan, gpu_faiss=failing(case))
    assert notes["device"] == "cpu" and "gpu_fallback" not in notes  # decided before, not failed midway
    scores, ids = _answers(index, queries)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(scores, want_scores)


@pytest.mark.parametrize("plan", PLANS, ids=[p.factory for p in PLANS])
def test_a_gpu_build_out_of_memory_midway_is_done_again_on_the_cpu(
    plan: IndexPlan, caplog: pytest.LogCaptureFixture
) -> None:
    embeds, queries = vectors(4000), vectors(50, seed=1)
    cpu_index, cpu_notes = build_faiss_index(embeds, plan, use_gpu=False)
    standin = GpuStandIn(build_error=OUT_OF_MEMORY)
    with caplog.at_level(logging.INFO):
        index, notes = build_faiss_index(embeds, plan, gpu_faiss=standin)
    assert standin.calls.count("index_cpu_to_gpu") == 2, "the self-test's, then the build's"
    assert notes == {**cpu_notes, "gpu_fallback": f"RuntimeError: {OUT_OF_MEMORY}"}
    assert notes["device"] == "cpu"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    said = f"RuntimeError: {OUT_OF_MEMORY}: the GPU is out of memory"
    assert warned == [f"GPU index build failed, building on the CPU: {said}"]
    for got, want in zip(_answers(index, queries), _answers(cpu_index, queries), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_working_gpu_builds_the_index_there() -> None:
    embeds, queries = vectors(4000), vectors(50, seed=1)
    plan = PLANS[1]
    index, notes = build_faiss_index(embeds, plan, gpu_faiss=GpuStandIn())
    assert notes["device"] == "gpu" and "gpu_fallback" not in notes
    cpu_index, _ = build_faiss_index(embeds, plan, use_gpu=False)
    for got, want in zip(_answers(index, queries), _answers(cpu_index, queries), strict=True):
        np.testing.assert_array_equal(got, want)


# -- the real faiss is probed in a child process, which a CUDA error may abort -----------------------------


def test_an_aborted_probe_is_a_failed_self_test_not_a_dead_indexer() -> None:
    # What faiss-gpu-cu12 1.14.1 does on Hopper: FAISS_ASSERT prints the CUDA error, then abort().
    child = f"import os, sys; sys.stderr.write({NO_KERNEL!r} + '\\n'); sys.stderr.flush(); os.abort()"
    result = gpu.probe_isolated([sys.executable, "-c", child])
    assert result.error == f"{NO_KERNEL} (the probe process ended: killed by signal 6)"
    assert gpu.explain(result.error).endswith("no kernels for the GPU's architecture (faiss-gpu 1.15.1 covers"
                                              " sm_70-sm_90)")  # fmt: skip


def test_a_probe_that_hangs_is_given_up() -> None:
    result = gpu.probe_isolated([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.5)
    assert result == gpu.Probe(0, "the GPU probe did not finish in 0.5 s")


def test_the_probe_child_runs_the_real_faiss() -> None:
    result = gpu.probe_isolated()
    if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        pytest.skip("a GPU machine: the child's answer depends on the GPU")
    assert result == gpu.Probe(0, None)
