"""The Python distribution: `pip install` of pyproject.toml gives the
package with meson.build's version and the supported platform in its
metadata, and `meson install`'s site directory is where the system's
python looks for packages of that prefix."""

import json
import os
import re
import subprocess
import sys

import cluster

SITE_DIR = os.path.join(cluster.ROOT, "client", "python", "site_dir.py")


def meson_version():
    with open(os.path.join(cluster.ROOT, "meson.build")) as f:
        return re.search(r"project\([^)]*?version\s*:\s*'([^']+)'",
                         f.read()).group(1)


def test_pip_install(tmp_path):
    target = tmp_path / "site"
    # No build isolation and no dependencies: nothing is fetched (the
    # venv has setuptools, torch and numpy already).
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "--no-deps", "--no-build-isolation", "--target",
                    str(target), cluster.ROOT], check=True,
                   capture_output=True, cwd=str(tmp_path))
    code = """if True:
        import importlib.metadata as md, json, obcomm, obcomm.torch
        import torch.distributed as dist
        d = md.distribution("obcomm")
        print(json.dumps({"file": obcomm.__file__,
                          "version": obcomm.__version__,
                          "dist_version": d.version,
                          "requires_python": d.metadata["Requires-Python"],
                          "requires": d.requires,
                          "backend": "OBCOMM" in dist.Backend._plugins}))
    """
    env = dict(os.environ, PYTHONPATH=str(target),
               OBCOMM_LIBRARY=cluster.LIBRARY)
    out = subprocess.run([sys.executable, "-c", code], check=True,
                         capture_output=True, text=True, env=env,
                         cwd=str(tmp_path)).stdout
    got = json.loads(out)
    assert got["file"].startswith(str(target)), got
    assert got["version"] == got["dist_version"] == meson_version()
    assert got["requires_python"] == ">=3.11"
    assert sorted(got["requires"]) == ["numpy", "torch>=2.13"]
    assert got["backend"]


def test_source_tree_version():
    import obcomm
    assert obcomm.__version__ == meson_version()


def _system_python(code):
    return subprocess.run(["/usr/bin/python3", "-c", code], check=True,
                          capture_output=True, text=True).stdout


def test_meson_site_dir():
    """--prefix=/usr installs where Debian's python finds its system
    packages (not /usr/local), --prefix=/usr/local where it finds local
    ones, and another prefix under it."""
    path = json.loads(_system_python("import json, sys; "
                                     "print(json.dumps(sys.path))"))
    for prefix in ("/usr", "/usr/local", "/opt/obcomm"):
        d = subprocess.run(["/usr/bin/python3", SITE_DIR, prefix],
                           check=True, capture_output=True,
                           text=True).stdout.strip()
        assert d.startswith(prefix + "/"), (prefix, d)
        if prefix != "/opt/obcomm":
            assert d in path, (prefix, d, path)
        if prefix == "/usr":
            assert not d.startswith("/usr/local/"), d


def _fresh_python(code):
    """code's stdout, run by this interpreter in a new process on the
    source tree's package and the build's library."""
    env = dict(os.environ, PYTHONPATH=cluster.PYPATH,
               OBCOMM_LIBRARY=cluster.LIBRARY)
    return subprocess.run([sys.executable, "-c", code], check=True,
                          capture_output=True, text=True, env=env).stdout


def test_import_without_torch():
    """`import obcomm` works where torch cannot be imported (its error
    codes, enums and constants come from the library); `import
    obcomm.torch` is what needs torch."""
    out = _fresh_python("""if True:
        import json, sys
        sys.modules["torch"] = None  # `import torch` raises ImportError
        import obcomm
        from obcomm import comm, _lib
        try:
            import obcomm.torch
            torch_module = "imported"
        except ImportError as e:
            torch_module = "ImportError"
        print(json.dumps({
            "mismatch": comm.E_MISMATCH, "ops": comm.OPS,
            "dtypes": comm._DTYPE_CODES,
            "threads": _lib.constant("OBCOMM_ADAM_MAX_THREADS"),
            "inflight": _lib.constant("OBCOMM_MAX_INFLIGHT"),
            "strerror": obcomm.strerror(comm.E_TIMEOUT),
            "obcomm.torch": torch_module}))
    """)
    got = json.loads(out)
    assert got == {
        "mismatch": -1001, "ops": {"sum": 0, "avg": 1, "max": 2, "min": 3},
        "dtypes": {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3,
                   "int32": 4, "int64": 5},
        "threads": 64.0, "inflight": 32.0,
        "strerror": "deadline passed before every rank arrived",
        "obcomm.torch": "ImportError"}


def test_obcomm_torch_brings_torch():
    """torch is loaded by `import obcomm.torch` (or by reading
    obcomm.torch), not by `import obcomm`; DTYPES then maps torch's dtypes
    to the library's codes."""
    out = _fresh_python("""if True:
        import json, sys
        import obcomm
        before = "torch" in sys.modules
        opt = obcomm.torch.OneBitAdam
        import torch
        from obcomm.comm import DTYPES
        print(json.dumps({"before": before, "after": "torch" in sys.modules,
                          "dtypes": [[str(d), c] for d, c in DTYPES.items()],
                          "ratio": obcomm.torch.AUTO_MASK_RATIO,
                          "backend": "OBCOMM" in
                          torch.distributed.Backend._plugins}))
    """)
    got = json.loads(out)
    assert got == {
        "before": False, "after": True,
        "dtypes": [["torch.float32", 0], ["torch.float64", 1],
                   ["torch.float16", 2], ["torch.bfloat16", 3],
                   ["torch.int32", 4], ["torch.int64", 5]],
        "ratio": float(__import__("numpy").float32(0.01)),
        "backend": True}
