"""Package discovery for pyproject.toml's package-dir mapping.

The repository's top-level folders install inside the quantcore namespace
(``backends/aten_cpu`` imports as ``quantcore.backends.aten_cpu``), and
``[tool.setuptools.packages.find]`` cannot put a prefix on what it finds. So the mapping
stays in pyproject.toml and this finds, under each mapped folder, every package (a folder
with ``__init__.py``): adding a built-in backend is its folder plus its entry-point line.
Everything else about the build is in pyproject.toml.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import find_packages, setup
from setuptools.config.pyprojecttoml import load_file

ROOT = Path(__file__).resolve().parent


def package_dirs() -> dict[str, str]:
    return dict(load_file(str(ROOT / "pyproject.toml"))["tool"]["setuptools"]["package-dir"])


def discovered_packages() -> list[str]:
    """``quantcore``, ``quantcore.backends``, ``quantcore.backends.aten_cpu``, …"""
    packages = []
    for package, folder in package_dirs().items():
        packages.append(package)
        packages += [f"{package}.{sub}" for sub in find_packages(str(ROOT / folder))]
    return sorted(packages)


if __name__ == "__main__":
    setup(packages=discovered_packages())
