"""Prints the directory under PREFIX where this python finds pure packages
(used by meson.build). Debian's python has two schemes of its own:
"deb_system" (/usr/lib/python3/dist-packages, where packages of
--prefix=/usr belong) and its default "posix_local"
(/usr/local/lib/python3.X/dist-packages, for --prefix=/usr/local); the
first of them that lies under PREFIX is taken, else the standard
PREFIX/lib/python3.X/site-packages."""
import sys
import sysconfig

base = sys.argv[1].rstrip("/")
schemes = [sysconfig.get_default_scheme()]
if "deb_system" in sysconfig.get_scheme_names():
    schemes.insert(0, "deb_system")
for scheme in schemes:
    p = sysconfig.get_path("purelib", scheme)
    if p.startswith(base + "/"):
        break
else:
    p = sysconfig.get_path("purelib", "posix_prefix", vars={"base": base})
print(p)
