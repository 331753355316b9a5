"""``model.runtime.is_out_of_memory``: which errors say that memory ran out (host or GPU), told apart by
class name, module and message with the runtimes' real exception classes, never by importing them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from model.runtime import EncoderError, is_out_of_memory
from store.errors import IndexFormatError


def _ort(name: str, message: str) -> Exception:
    """An ONNX Runtime exception (``onnxruntime.capi.onnxruntime_pybind11_state.<name>``), as its Python
    session raises them."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    return getattr(ort_state, name)(message)


# What ONNX Runtime's CUDA provider says when the GPU is full (its BFC arena, cudaMalloc, cuDNN, cuBLAS).
ORT_BFC = (
    "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running Conv node."
    " Name:'/visual/patch_embed/Conv' Status Message: /onnxruntime_src/onnxruntime/core/framework/"
    "bfc_arena.cc:376 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, onnxruntime::Stream*,"
    " bool, onnxruntime::WaitNotificationFn) Failed to allocate memory for requested buffer of size 939524096"
)
ORT_CUDA = (
    "[ONNXRuntimeError] : 1 : FAIL : CUDA failure 2: out of memory ; GPU=0 ; hostname=ccrk-api-0 ;"
    " file=/onnxruntime_src/onnxruntime/core/providers/cuda/cuda_allocator.cc ; line=47 ;"
    " expr=cudaMalloc((void**)&p, size);"
)
ORT_CUDNN = "[ONNXRuntimeError] : 1 : FAIL : CUDNN failure 2: CUDNN_STATUS_ALLOC_FAILED ; GPU=0"
ORT_CUBLAS = "[ONNXRuntimeError] : 1 : FAIL : CUBLAS failure 3: CUBLAS_STATUS_ALLOC_FAILED ; GPU=0"


def test_memory_errors_and_torchs_out_of_memory_error_are_out_of_memory() -> None:
    torch = pytest.importorskip("torch")

    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(MemoryError("std::bad_alloc"))
    # Instantiable on a machine without a GPU; a RuntimeError subclass, recognised by class, whatever it says.
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(torch.cuda.OutOfMemoryError())

    class Wrapped(torch.cuda.OutOfMemoryError):  # a subclass: found along the MRO
        pass

    assert is_out_of_memory(Wrapped("the fusion graph's batch"))
    # torch's CUDA errors other than its OutOfMemoryError (a RuntimeError of module torch): by message.
    assert is_out_of_memory(torch.AcceleratorError("CUDA error: out of memory"))
    assert not is_out_of_memory(
        torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    )


def test_torchs_cpu_allocator_running_out_is_out_of_memory() -> None:
    """A real one: more bytes than any address space holds, refused at once (a plain RuntimeError)."""
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError) as raised:
        torch.empty(2**62, dtype=torch.uint8)
    assert type(raised.value) is RuntimeError and is_out_of_memory(raised.value)


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(("RuntimeException", ORT_BFC), id="ort-bfc-arena"),
        pytest.param(("Fail", ORT_CUDA), id="ort-cuda-malloc"),
        pytest.param(("Fail", ORT_CUDNN), id="ort-cudnn"),
        pytest.param(("Fail", ORT_CUBLAS), id="ort-cublas"),
    ],
)
def test_onnx_runtime_allocation_failures_are_out_of_memory(exc: tuple[str, str]) -> None:
    pytest.importorskip("onnxruntime")
    error = _ort(*exc)
    assert not isinstance(error, RuntimeError | MemoryError)  # plain Exception subclasses: by module
    assert is_out_of_memory(error)


@pytest.mark.parametrize(
    "message",
    [
        "CUDA out of memory. Tried to allocate 20.00 MiB",  # torch before OutOfMemoryError existed
        "CUDA error: out of memory",
        "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to"
        " allocate 81920000000 bytes. Error code 12 (Cannot allocate memory)",
        # faiss-gpu
        "Error: 'err == cudaSuccess' failed: StandardGpuResources: alloc fail type TemporaryMemoryBuffer"
        " dev 0 space Device stream 0x5 size 1610612736 bytes (cudaMalloc error out of memory [2])",
        "CUDA error cudaErrorMemoryAllocation:out of memory",
    ],
)
def test_runtime_errors_saying_memory_ran_out_are_out_of_memory(message: str) -> None:
    assert is_out_of_memory(RuntimeError(message))


def test_a_class_named_out_of_memory_error_counts_only_from_torch() -> None:
    """By name and module, so a process without torch never imports it to check."""
    torch_like = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch.cuda"})
    other = type("OutOfMemoryError", (RuntimeError,), {"__module__": "someone.else"})
    assert is_out_of_memory(torch_like())
    assert not is_out_of_memory(other())


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("CUDA error: unspecified launch failure"),
        EncoderError("the model directory has no tokenizer.json"),
        ValueError("out of memory"),  # about its input, not this process: a data error stays one
        KeyError("out of memory"),
        OSError(12, "Cannot allocate memory"),  # ENOMEM from open/mmap: an OSError, handled as one
        IndexError("list index out of range"),
        # The project's own errors keep their meaning whatever they quote: the store's data error for a
        # faiss read that failed (a version's files), an encoder's refusal.
        IndexFormatError("cannot read index files of /srv/idx/shop/v1: cudaMalloc error out of memory"),
        EncoderError("the int8 graphs ran out of memory in `ccrk export int8-cost`"),
    ],
    ids=repr,
)
def test_other_errors_are_not_out_of_memory(exc: Exception) -> None:
    assert not is_out_of_memory(exc)


def test_an_onnx_runtime_error_that_is_not_about_memory_is_not_out_of_memory() -> None:
    pytest.importorskip("onnxruntime")
    assert not is_out_of_memory(
        _ort(
            "RuntimeException",
            "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running Conv"
            " node. Status Message: CUDNN failure 8: CUDNN_STATUS_EXECUTION_FAILED ; GPU=0",
        )
    )
    assert not is_out_of_memory(_ort("InvalidArgument", "Got invalid dimensions for input: pixel_values"))


def test_checking_imports_neither_torch_nor_onnxruntime() -> None:
    code = (
        "import sys\n"
        "from model.runtime import is_out_of_memory\n"
        "assert not is_out_of_memory(RuntimeError('CUDA error: unspecified launch failure'))\n"
        "assert is_out_of_memory(RuntimeError('CUDA error: out of memory'))\n"
        "print(sorted(m for m in ('torch', 'onnxruntime') if m in sys.modules))\n"
    )
    repo = Path(__file__).resolve().parents[3]  # `python -c` puts its working directory on the path
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo
    )
    assert result.stdout.strip() == "[]"
