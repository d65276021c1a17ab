"""Fetches into ``.whl/`` (git-ignored) the wheels ``benchmarks/gpu.sh`` installs on the device
machine: what impala_jax needs beyond that image's JAX (CUDA), flax, optax, chex and orbax.

``python -m benchmarks.gpu_wheels [--python-version 3.12] [--dest .whl]``. The device tool
carries at most 64 MiB of working tree, and envpool's wheel (50 MB) with its assets (60 MB) is
far over that, so both are trimmed to what gpu.sh runs: the Atari and classic-control envs (the
other families' compiled libraries and assets are left out; their registration modules stay, so
``import envpool`` works and only making one of them would fail). Prints the total size.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Missing from the device image (its package list: the device tool's KINDS.md): envpool and
# what it needs, gymnasium, tensorboardX, and rlax's stack for tests/test_vtrace.py. The image
# has matplotlib, pillow, rich, pytest, pytest-timeout, protobuf, cloudpickle, absl-py.
PACKAGES = [
    "envpool==1.2.5",
    "envpool-assets==0.3.0",
    "dm-env",
    "optree",
    "types-protobuf",
    "gymnasium==1.2.2",
    "farama-notifications",
    "tensorboardX",
    "rlax",
    "distrax",
    "tensorflow-probability",
    "dm-tree",
    "gast",
    "decorator",
]
# Families of envs gpu.sh never makes: their compiled libraries and assets stay behind.
DROP = ("mujoco", "vizdoom", "gfootball", "procgen", "jumanji", "pgx", "highway")


def trim(wheel: Path) -> None:
    """Rewrites ``wheel`` without the compiled libraries and assets of the DROP families. Their
    Python files stay, so ``envpool.entry``'s registration imports still work, but their
    ``__init__.py`` (which loads the library) becomes empty."""
    out = wheel.with_suffix(".trim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            parts = item.filename.split("/")
            if len(parts) > 2 and parts[1] in DROP:
                # Assets: the big files go; small ones stay (registrations list some dirs).
                if parts[0] == "envpool_assets" and item.file_size <= 100_000:
                    dst.writestr(item, src.read(item))
                    continue
                if not parts[-1].endswith(".py"):
                    continue
                if parts[-1] == "__init__.py":
                    dst.writestr(item, '"""Left out of this trimmed wheel (gpu_wheels.py)."""\n')
                    continue
            dst.writestr(item, src.read(item))
    out.replace(wheel)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--dest", default=str(REPO / ".whl"))
    args = parser.parse_args(argv)
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    tag = "cp" + args.python_version.replace(".", "")
    platforms = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)] + [
        "manylinux2014_x86_64",
        "manylinux1_x86_64",
        "any",
    ]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", args.python_version, "--implementation", "cp", "--abi", tag]
    cmd += ["--abi", "abi3", "--abi", "none"]
    for p in platforms:
        cmd += ["--platform", p]
    subprocess.run([*cmd, "-d", str(dest), *PACKAGES], check=True)
    for wheel in dest.glob("envpool*.whl"):
        trim(wheel)
    total = sum(w.stat().st_size for w in dest.glob("*.whl"))
    for w in sorted(dest.glob("*.whl")):
        print(f"{w.stat().st_size / 2**20:7.1f} MiB  {w.name}")
    print(f"{total / 2**20:7.1f} MiB in {len(list(dest.glob('*.whl')))} wheels (limit: 64 MiB)")


if __name__ == "__main__":
    main()
