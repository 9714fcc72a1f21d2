"""Runs one pytest file for meson test: exit 77 (skipped) when pytest or
torch is missing (deploy/venv.sh installs both into .venv), else pytest's
status."""
import sys

try:
    import pytest
    import torch  # noqa: F401
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-rs"] + sys.argv[1:]))
