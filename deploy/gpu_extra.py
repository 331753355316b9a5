"""Which GPU extra of pyproject.toml a machine's NVIDIA driver runs, and that extra's pinned requirements.

    python deploy/gpu_extra.py auto        # the extra for this machine's driver (nvidia-smi), its pins
    python deploy/gpu_extra.py gpu         # that extra's pins, whatever the driver
    python deploy/gpu_extra.py auto --driver 535.104.05

Prints the requirements one a line (for ``xargs pip install``) and the chosen extra on stderr; exit 3 when
the driver runs neither (older than CUDA 12's minimum). ``make gpu-check`` uses it. The rule, from the
CUDA runtimes the wheels are built on (docs/how-to/deploy.md):

- driver 580 or newer: CUDA 13 and 12 both run; ``auto`` picks ``gpu-cuvs`` (faiss with CAGRA, CUDA 13),
  which also matches the CUDA 13 torch that ``make install`` puts into every environment (``gpu``'s cuDNN
  for CUDA 12 would overwrite torch's cuDNN files there: both wheels install ``nvidia/cudnn/lib``);
- 525.60 to 579: ``gpu`` (CUDA 12: faiss-gpu 1.15.1, onnxruntime-gpu 1.26.0, cuDNN 9 for CUDA 12);
- older: none (the CPU install, faiss-cpu, is the one that runs).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("gpu", "gpu-cuvs")
CUDA13_DRIVER = (580, 0)  # CUDA 13.x with minor-version compatibility
CUDA12_DRIVER = (525, 60)  # CUDA 12.x with minor-version compatibility (Linux: 525.60.13)


class DriverTooOld(RuntimeError):
    pass


def driver_version() -> str:
    """The first GPU's driver version, as ``nvidia-smi`` reports it (``580.159.03``)."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return out.strip().splitlines()[0].strip()


def _major_minor(version: str) -> tuple[int, int]:
    parts = [int(p) for p in version.split(".")[:2]]
    return parts[0], parts[1] if len(parts) > 1 else 0


def pick(driver: str) -> str:
    """The extra for NVIDIA driver ``driver`` (``auto``'s rule)."""
    version = _major_minor(driver)
    if version >= CUDA13_DRIVER:
        return "gpu-cuvs"
    if version >= CUDA12_DRIVER:
        return "gpu"
    raise DriverTooOld(
        f"NVIDIA driver {driver} is older than CUDA 12's minimum ({CUDA12_DRIVER[0]}.{CUDA12_DRIVER[1]}):"
        " no GPU extra runs here; keep the CPU install (faiss-cpu, onnxruntime)"
    )


def pins(extra: str, pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    with pyproject.open("rb") as f:
        return list(tomllib.load(f)["project"]["optional-dependencies"][extra])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("extra", choices=("auto", *EXTRAS))
    parser.add_argument("--driver", default=None, help="The driver version (default: nvidia-smi's).")
    args = parser.parse_args()
    extra = args.extra
    if extra == "auto":
        driver = args.driver or driver_version()
        try:
            extra = pick(driver)
        except DriverTooOld as exc:
            print(f"gpu_extra: {exc}", file=sys.stderr)
            return 3
        print(f"gpu_extra: driver {driver}: the {extra} extra", file=sys.stderr)
    print("\n".join(pins(extra)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
