"""setuptools' side of pyproject.toml: the version from meson.build (the
one place it is written) and obcomm/_build_config.py, which records it
and where pkg-config finds an installed libobcomm (empty when it finds
none: the package then looks in $OBCOMM_LIBRARY and the linker's path)."""

import os
import re
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(ROOT, "meson.build")) as f:
        m = re.search(r"project\([^)]*?version\s*:\s*'([^']+)'", f.read())
    if m is None:
        raise RuntimeError("meson.build: no version in project()")
    return m.group(1)


def libdir():
    try:
        return subprocess.run(
            ["pkg-config", "--variable=libdir", "obcomm"], check=True,
            capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


class BuildPy(build_py):
    def run(self):
        super().run()
        src = os.path.join(ROOT, "client", "python", "obcomm",
                           "_build_config.py.in")
        with open(src) as f:
            text = f.read()
        text = text.replace("@VERSION@", version()).replace(
            "@LIBDIR@", libdir())
        with open(os.path.join(self.build_lib, "obcomm",
                               "_build_config.py"), "w") as f:
            f.write(text)


# setuptools' own build tree stays out of meson's build/.
setup(version=version(), cmdclass={"build_py": BuildPy},
      options={"build": {"build_base": "build-pip"}})
