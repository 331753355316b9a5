"""The GPU extras of pyproject.toml and deploy/gpu_extra.py, which picks one from the NVIDIA driver's version:
each extra is one faiss build and one onnxruntime build, both CUDA builds, pinned, never beside a CPU one."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, requires
from types import ModuleType

import pytest
from packaging.requirements import Requirement

from tests.deploy.deployment import REPO

CPU_BUILDS = {"faiss-cpu", "onnxruntime"}


def extras() -> dict[str, list[Requirement]]:
    with (REPO / "pyproject.toml").open("rb") as f:
        optional = tomllib.load(f)["project"]["optional-dependencies"]
    return {name: [Requirement(r) for r in optional[name]] for name in ("gpu", "gpu-cuvs")}


def gpu_extra_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_extra", REPO / "deploy" / "gpu_extra.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("extra", ["gpu", "gpu-cuvs"])
def test_each_gpu_extra_is_one_pinned_faiss_and_one_pinned_onnxruntime_gpu(extra: str) -> None:
    reqs = {r.name: r for r in extras()[extra]}
    assert not CPU_BUILDS & set(reqs)
    (faiss,) = [name for name in reqs if name.startswith("faiss")]
    (ort,) = [name for name in reqs if name.startswith("onnxruntime")]
    assert ort == "onnxruntime-gpu"
    assert all(str(r.specifier).startswith("==") for r in reqs.values()), "every CUDA build is pinned"
    assert faiss == {"gpu": "faiss-gpu", "gpu-cuvs": "faiss-gpu-cuvs"}[extra]


def test_the_cuda_12_extra_and_the_cuda_13_extra() -> None:
    by_extra = {extra: {r.name: r for r in reqs} for extra, reqs in extras().items()}
    gpu, cuvs = by_extra["gpu"], by_extra["gpu-cuvs"]
    # faiss-gpu 1.15.1: sm_70-sm_90 (Hopper); 1.14.1's faiss-gpu-cu12 had none for sm_90.
    assert str(gpu["faiss-gpu"].specifier) == "==1.15.1"
    assert str(gpu["onnxruntime-gpu"].specifier) == "==1.26.0", "the last CUDA 12 build"
    assert "nvidia-cudnn-cu12" in gpu and not any(name.endswith("-cu13") for name in gpu)
    assert str(cuvs["faiss-gpu-cuvs"].specifier) == "==1.15.1"
    assert "nvidia-cudnn-cu13" in cuvs and not any(name.endswith("-cu12") for name in cuvs)


def test_the_cuda_13_extra_shares_torchs_cudnn() -> None:
    """make install's torch (CUDA 13) pins its cuDNN: the gpu-cuvs extra pins the same, so installing it
    beside torch (make gpu-check) changes neither."""
    try:
        torch_reqs = [Requirement(r) for r in requires("torch") or []]
    except PackageNotFoundError:
        pytest.skip("torch is not installed here")
    cudnn = [r for r in torch_reqs if r.name == "nvidia-cudnn-cu13"]
    if not cudnn:
        pytest.skip("this torch is not a CUDA 13 build")
    (cuvs_cudnn,) = [r for r in extras()["gpu-cuvs"] if r.name == "nvidia-cudnn-cu13"]
    assert cuvs_cudnn.specifier == cudnn[0].specifier


@pytest.mark.parametrize(
    ("driver", "extra"),
    [("580.159.03", "gpu-cuvs"), ("590.1", "gpu-cuvs"), ("579.99.01", "gpu"), ("535.104.05", "gpu"),
     ("525.60.13", "gpu")],
)  # fmt: skip
def test_the_extra_follows_the_driver(driver: str, extra: str) -> None:
    assert gpu_extra_module().pick(driver) == extra


@pytest.mark.parametrize("driver", ["525.59", "470.256.02"])
def test_a_driver_older_than_cuda_12_gets_no_gpu_extra(driver: str) -> None:
    module = gpu_extra_module()
    with pytest.raises(module.DriverTooOld, match=rf"NVIDIA driver {driver} is older than CUDA 12's minimum"):
        module.pick(driver)


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "deploy" / "gpu_extra.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_script_prints_the_pins_for_pip() -> None:
    pins = {name: [str(r) for r in reqs] for name, reqs in extras().items()}
    named = run_script("gpu")
    assert (named.returncode, named.stdout.splitlines()) == (0, pins["gpu"])
    auto = run_script("auto", "--driver", "580.159.03")
    assert (auto.returncode, auto.stdout.splitlines()) == (0, pins["gpu-cuvs"])
    assert auto.stderr == "gpu_extra: driver 580.159.03: the gpu-cuvs extra\n"
    old = run_script("auto", "--driver", "470.256.02")
    assert (old.returncode, old.stdout) == (3, "")
    assert "no GPU extra runs here" in old.stderr
