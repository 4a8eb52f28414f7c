"""Where ``deploy/triton/install.sh`` put tritonserver and its python stub env, and whether it is usable."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from services.tritonlocal.errors import TritonNotInstalled

__all__ = ["DEFAULT_HOME", "HOME_ENV", "TritonInstall"]

HOME_ENV = "SWITCHYARD_TRITON_HOME"
DEFAULT_HOME = Path(__file__).resolve().parents[2] / ".triton"
_INSTALL_HINT = "run `make install` (or deploy/triton/install.sh)"


@dataclass(frozen=True)
class TritonInstall:
    """The layout install.sh creates: the nvidia-pytriton wheel extracted as is, and the stub venv."""

    home: Path

    @classmethod
    def default(cls) -> TritonInstall:
        return cls(Path(os.environ.get(HOME_ENV, DEFAULT_HOME)))

    @property
    def server_root(self) -> Path:
        return self.home / "server" / "pytriton" / "tritonserver"

    @property
    def binary(self) -> Path:
        return self.server_root / "bin" / "tritonserver"

    @property
    def backends(self) -> Path:
        return self.server_root / "backends"

    @property
    def caches(self) -> Path:
        return self.server_root / "caches"

    @property
    def stubenv(self) -> Path:
        return self.home / "stubenv"

    def present(self) -> bool:
        return os.access(self.binary, os.X_OK) and (self.stubenv / "bin" / "python3").exists()

    def base_lib(self) -> Path:
        """The lib dir of the CPython the stub env was made from: it holds the libpython3.11.so the stub links."""
        cfg = self.stubenv / "pyvenv.cfg"
        match = re.search(r"^home\s*=\s*(.+)$", cfg.read_text(), re.MULTILINE) if cfg.is_file() else None
        if match is None:
            raise TritonNotInstalled(f"{cfg} is missing or names no base interpreter; {_INSTALL_HINT}")
        return Path(match.group(1).strip()).parent / "lib"

    def numpy_version(self) -> str | None:
        found = sorted(self.stubenv.glob("lib/python3.*/site-packages/numpy-*.dist-info"))
        return found[0].name.removeprefix("numpy-").removesuffix(".dist-info") if found else None

    def check(self) -> None:
        """Raise ``TritonNotInstalled`` naming what is missing or wrong, and how to fix it."""
        if not os.access(self.binary, os.X_OK):
            raise TritonNotInstalled(f"no local Triton: {self.binary} is missing or not executable; {_INSTALL_HINT}")
        if not (self.stubenv / "bin" / "python3").exists():
            raise TritonNotInstalled(f"no python-backend stub env at {self.stubenv}; {_INSTALL_HINT}")
        numpy = self.numpy_version()
        if numpy is None:
            raise TritonNotInstalled(f"the stub env {self.stubenv} has no numpy; {_INSTALL_HINT}")
        if int(numpy.split(".")[0]) >= 2:
            raise TritonNotInstalled(
                f"the stub env {self.stubenv} has numpy {numpy}: Triton 2.51's python stub needs numpy < 2 "
                f"(under numpy 2 every output comes back mis-sized); `{self.stubenv}/bin/pip install numpy==1.26.4`"
            )
        lib = self.base_lib()
        if not (lib / "libpython3.11.so.1.0").exists():
            raise TritonNotInstalled(f"{lib} has no libpython3.11.so.1.0 for the python stub; {_INSTALL_HINT}")
