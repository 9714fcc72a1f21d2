#!/usr/bin/env python3
"""Does a peer pair gain from several TCP connections on an emulated link?

    tests/bench/tcp_streams.py [--rate 10gbit] [--streams "1 2 4"]
        [--mib 512] [--repeats 3] [--out FILE]

Brings up a 2-node emulated cluster (deploy/netns-cluster.sh up 2 RATE,
daemons included but idle), then for each stream count K and repeat: node 1
listens, node 0 opens K connections, and both nodes send MIB MiB to each
other at once (full duplex, as a ring step does), split evenly over the K
connections, one thread per connection and direction. Reports the payload
rate per direction against the link's payload limit (tbf counts whole
frames: 1448 / 1514 of RATE with MTU 1500), the median over repeats, as a
Markdown table and JSON lines in FILE. The cluster is torn down at the end,
also on failure. Needs root.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
CLUSTER = os.path.join(TOP, "deploy", "netns-cluster.sh")
PORT = 7990
CHUNK = 1 << 20


def rate_bits(rate):
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for u, m in units.items():
        if rate.endswith(u):
            return float(rate[: -len(u)]) * m
    raise SystemExit("tcp_streams: rate %r is not N{kbit,mbit,gbit}" % rate)


def pump(sock, nbytes, results, key):
    """Sends nbytes on sock while a second thread receives as many."""
    buf = bytearray(CHUNK)
    got = [0]

    def rx():
        view = bytearray(CHUNK)
        while got[0] < nbytes:
            n = sock.recv_into(view, min(CHUNK, nbytes - got[0]))
            if n == 0:
                raise RuntimeError("peer closed early")
            got[0] += n

    t = threading.Thread(target=rx)
    t.start()
    sent = 0
    while sent < nbytes:
        n = min(CHUNK, nbytes - sent)
        sock.sendall(memoryview(buf)[:n])
        sent += n
    t.join()
    results[key] = time.monotonic()


def side(role, peer, streams, nbytes):
    """One node's part: K connections, each sending and receiving nbytes/K.
    Prints the seconds from the first connection to the last byte."""
    per = nbytes // streams
    socks = []
    if role == "listen":
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("0.0.0.0", PORT))
        ls.listen(streams)
        print("ready", flush=True)
        for _ in range(streams):
            socks.append(ls.accept()[0])
        ls.close()
    else:
        for _ in range(streams):
            for _ in range(100):
                try:
                    socks.append(socket.create_connection((peer, PORT)))
                    break
                except OSError:
                    time.sleep(0.05)
            else:
                raise SystemExit("tcp_streams: cannot connect to %s" % peer)
    for s in socks:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # Everyone is connected: a one-byte handshake on the first connection
    # starts both sides together.
    if role == "listen":
        socks[0].sendall(b"g")
        socks[0].recv(1)
    else:
        socks[0].recv(1)
        socks[0].sendall(b"g")
    t0 = time.monotonic()
    ends = {}
    ts = [threading.Thread(target=pump, args=(s, per, ends, i))
          for i, s in enumerate(socks)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print("%.6f %d" % (max(ends.values()) - t0, per * streams), flush=True)
    for s in socks:
        s.close()


def run(args):
    limit = rate_bits(args.rate) * 1448 / 1514 / 8  # payload bytes/s
    nbytes = args.mib << 20
    rows = []
    subprocess.run([CLUSTER, "up", "2", args.rate], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        for k in [int(s) for s in args.streams.split()]:
            secs = []
            for _ in range(args.repeats):
                me = [CLUSTER, "exec"]
                srv = subprocess.Popen(
                    me + ["1", sys.executable, __file__, "--side", "listen",
                          "--k", str(k), "--mib", str(args.mib)],
                    stdout=subprocess.PIPE, text=True)
                assert srv.stdout.readline().strip() == "ready"
                cli = subprocess.run(
                    me + ["0", sys.executable, __file__, "--side", "connect",
                          "--peer", "10.77.0.2", "--k", str(k),
                          "--mib", str(args.mib)],
                    stdout=subprocess.PIPE, text=True, check=True,
                    timeout=600)
                out, _ = srv.communicate(timeout=600)
                if srv.returncode != 0:
                    raise SystemExit("tcp_streams: listener failed")
                t_srv = float(out.split()[0])
                t_cli = float(cli.stdout.split()[0])
                secs.append(max(t_srv, t_cli))
            med = statistics.median(secs)
            rate = nbytes / med
            rows.append({"rate": args.rate, "streams": k, "mib": args.mib,
                         "seconds": secs, "median_s": med,
                         "bytes_per_s_each_way": rate,
                         "ratio_to_link": rate / limit})
    finally:
        subprocess.run([CLUSTER, "down"], stdout=subprocess.DEVNULL)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print("| link | connections | MiB each way | median s | Gbit/s each way"
          " | / link payload limit |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print("| %s | %d | %d | %.3f | %.2f | %.2f |"
              % (r["rate"], r["streams"], r["mib"], r["median_s"],
                 r["bytes_per_s_each_way"] * 8 / 1e9, r["ratio_to_link"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", default="10gbit")
    ap.add_argument("--streams", default="1 2 4")
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="/dev/null")
    ap.add_argument("--side", choices=["listen", "connect"])
    ap.add_argument("--peer", default="")
    ap.add_argument("--k", type=int, default=1)
    args = ap.parse_args()
    if args.side:
        side(args.side, args.peer, args.k, args.mib << 20)
    else:
        run(args)


if __name__ == "__main__":
    main()
