"""Runs the shell blocks of README.md and docs/*.md marked runnable, as
written, on a loopback cluster of their own: a fenced ```sh block right
after a line `<!-- runnable -->` is run by bash -eu (a failing command
fails the block; a pipeline's status is its last command's, as in an
interactive shell) from the repository's root, each block in a fresh
network namespace (its own loopback, so its ports are its own) with a
private, empty /tmp. A block
that fails fails the test with its output. Needs unshare(1) and either
root or unprivileged user namespaces; otherwise it is skipped (77).

    check_doc_blocks.py REPO_ROOT
"""

import glob
import os
import subprocess
import sys

MARK = "<!-- runnable -->"
TIMEOUT = 300  # seconds per block


def blocks(path):
    """(line number, text) of each block marked runnable in path."""
    out = []
    with open(path) as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() != MARK:
            i += 1
            continue
        fence = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if fence not in ("```sh", "```bash"):
            sys.exit(f"{path}:{i + 1}: {MARK} must come right before a "
                     f"```sh block, not {fence!r}")
        j = i + 2
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if j == len(lines):
            sys.exit(f"{path}:{i + 2}: the block never closes")
        out.append((i + 3, "\n".join(lines[i + 2:j])))
        i = j + 1
    return out


def isolation():
    """The command prefix that gives a block its own network and /tmp, or
    None when this machine allows neither way."""
    setup = "ip link set lo up && mount -t tmpfs tmpfs /tmp"
    for flags in (["-nm"], ["-rnm"]):
        cmd = ["unshare"] + flags + ["--propagation", "private", "bash",
                                     "-c", setup]
        try:
            if subprocess.run(cmd, capture_output=True,
                              timeout=30).returncode == 0:
                return ["unshare"] + flags + ["--propagation", "private",
                                              "bash", "-c",
                                              setup + " && exec bash -s"]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return None


def main():
    root = os.path.abspath(sys.argv[1])
    files = [os.path.join(root, "README.md")] + sorted(
        glob.glob(os.path.join(root, "docs", "*.md")))
    found = [(p, n, text) for p in files for n, text in blocks(p)]
    if not found:
        sys.exit("no block is marked runnable")
    prefix = isolation()
    if prefix is None:
        print("SKIP: unshare cannot make a network namespace here")
        sys.exit(77)
    failed = 0
    for path, n, text in found:
        where = f"{os.path.relpath(path, root)}:{n}"
        script = "set -eu\n" + text + "\n"
        try:
            r = subprocess.run(prefix, input=script.encode(), cwd=root,
                               capture_output=True, timeout=TIMEOUT)
            ok, out = r.returncode == 0, r.stdout + r.stderr
        except subprocess.TimeoutExpired as e:
            ok, out = False, (e.stdout or b"") + (e.stderr or b"") + \
                f"\n(still running after {TIMEOUT} s)".encode()
        print(f"{'ok  ' if ok else 'FAIL'} {where}")
        if not ok:
            failed += 1
            print(out.decode(errors="replace")[-4000:])
    print(f"{len(found) - failed} of {len(found)} runnable blocks passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
