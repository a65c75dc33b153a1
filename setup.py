"""Package discovery for the wheel and the sdist (the metadata lives in pyproject.toml).

Three folders of the repository install under one import path: `laya/` as `laya`, `models/` as
`laya.models` and `export/` as `laya.export`. Every package below them is discovered, and every
file that is not Python source ships as package data, so a new subpackage or data file cannot be
left out of what users install (tests/test_packaging.py checks the built wheel against git).
"""

from __future__ import annotations

import os

from setuptools import find_packages, setup

ROOTS = {"laya": "laya", "laya.models": "models", "laya.export": "export"}
SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".pyc", ".pyo")


def _packages() -> tuple[list[str], dict[str, str]]:
    packages: list[str] = []
    package_dir: dict[str, str] = {}
    for name, folder in ROOTS.items():
        package_dir[name] = folder
        packages.append(name)
        packages += [f"{name}.{sub}" for sub in find_packages(folder)]
    # a nested root (laya.models) must not be found again as a subpackage of laya
    return sorted(set(packages)), package_dir


def _data_files(packages: list[str], package_dir: dict[str, str]) -> dict[str, list[str]]:
    """Every non-Python file, attached to the nearest package above it."""

    def folder_of(package: str) -> str:
        root = max((r for r in ROOTS if package == r or package.startswith(r + ".")), key=len)
        return os.path.join(package_dir[root], *package[len(root):].split(".")[1:])

    owners = {folder_of(p): p for p in packages}
    data: dict[str, list[str]] = {}
    for folder, package in owners.items():
        for here, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and os.path.join(here, d) not in owners)
            for file in files:
                if file.endswith(".py") or file.endswith(SKIP_SUFFIXES):
                    continue
                data.setdefault(package, []).append(os.path.relpath(os.path.join(here, file), folder))
    return data


PACKAGES, PACKAGE_DIR = _packages()
setup(packages=PACKAGES, package_dir=PACKAGE_DIR, package_data=_data_files(PACKAGES, PACKAGE_DIR),
      include_package_data=False)
