"""Bytes that crossed between emulated nodes, measured by the kernel.

On one machine every "node" talks over loopback, so the only honest byte
count that does not trust the communication library is the kernel's own:
tcp_info's bytes_sent of each TCP connection (`ss -tinp`), counted when the
connection's two ends belong to processes of different nodes. It includes
retransmissions and every byte the library wrote (headers, control
messages), and nothing of connections inside a node.

    wire.py PID:NODE [PID:NODE ...]   prints the bytes sent between nodes

Connections must still be open when this runs (bytes of closed ones are
gone): trainers call inter_node_bytes() before destroying their process
group; obcomm's daemons keep their links until they stop.
"""

import re
import subprocess
import sys

_ADDR = re.compile(r"^\S+\s+\S+\s+(\S+):(\d+)\s+(\S+):(\d+)\s+users:(.*)$")
_PID = re.compile(r"pid=(\d+)")
_SENT = re.compile(r"\bbytes_sent:(\d+)")


def connections():
    """[(pid, local addr, peer addr, bytes_sent)] of every established TCP
    connection visible to ss."""
    out = subprocess.run(["ss", "-tinpH", "state", "established"],
                         capture_output=True, text=True, check=True).stdout
    conns, cur = [], None
    for line in out.splitlines():
        m = _ADDR.match(line.strip()) if not line.startswith("\t") else None
        if m:
            pids = _PID.findall(m.group(5))
            cur = [int(pids[0]) if pids else None,
                   (m.group(1), int(m.group(2))),
                   (m.group(3), int(m.group(4))), 0]
            conns.append(cur)
        elif cur is not None:
            s = _SENT.search(line)
            if s:
                cur[3] = int(s.group(1))
    return [tuple(c) for c in conns]


def inter_node_bytes(pid_node):
    """Sum of bytes_sent over connections from a process of pid_node to a
    process of pid_node on another node."""
    conns = connections()
    owner = {local: pid for pid, local, _, _ in conns if pid is not None}
    total = 0
    for pid, _, peer, sent in conns:
        if pid not in pid_node:
            continue
        other = owner.get(peer)
        if other in pid_node and pid_node[other] != pid_node[pid]:
            total += sent
    return total


if __name__ == "__main__":
    pn = {}
    for a in sys.argv[1:]:
        p, n = a.split(":")
        pn[int(p)] = int(n)
    print(inter_node_bytes(pn))
