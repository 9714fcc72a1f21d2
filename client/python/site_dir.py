"""Prints the directory under PREFIX where this python finds pure packages
(used by meson.build): the default scheme's purelib when it lies under
PREFIX (Debian: /usr/local/lib/python3.X/dist-packages), else the standard
PREFIX/lib/python3.X/site-packages."""
import sys
import sysconfig

base = sys.argv[1].rstrip("/")
p = sysconfig.get_path("purelib", sysconfig.get_default_scheme())
if not p.startswith(base + "/"):
    p = sysconfig.get_path("purelib", "posix_prefix", vars={"base": base})
print(p)
