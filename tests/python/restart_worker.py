"""A torchrun worker for test_restart.py: `restart_worker.py OUT_DIR`.

Runs STEPS 1-bit allreduces of key 3 on rank-dependent data in the job of
torchrun's rendezvous id and saves what each step returned to
OUT_DIR/steps.<rank>.<attempt>.pt. The attempt is 0 for the first worker
of an obcomm rank and 1 for the next (a file per rank and attempt says
which have started; TORCHELASTIC_RESTART_COUNT does not: an agent that
restarts its workers because another node's did keeps its count).
On the first attempt the worker of obcomm rank DIES kills itself with
SIGKILL after DIES_AFTER steps; every other worker's next op then fails
(the exception ends it), and torchrun restarts every worker (the
--max-restarts path). On that attempt every other worker's connection to
its daemon outlives the worker, held by a child process in its own
session (as a DataLoader worker or a slow exit would hold it) until the
worker's restarted successor has joined, and LINGER_S more: that node's
run is still leaving while the restarted workers begin the next one.
Without torchrun's variables (a fresh reference job) attempt is "fresh"
and nobody dies."""

import os
import signal
import sys
import time

import torch

import obcomm

STEPS = 5
COUNT = 2001  # odd: the 1-bit chunks do not divide it
DIES = 1
DIES_AFTER = 2
LINGER_S = 0.3
WAIT_S = 15.0  # the child's bound on waiting for the successor


def data(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(COUNT, generator=g)


def main(out_dir):
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    with obcomm.Communicator(timeout_ms=20000) as comm:
        attempt = "fresh"
        if under_torchrun:
            attempt = "0"
            first = os.path.join(out_dir, f"started.{comm.rank}.0")
            try:
                os.close(os.open(first, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                attempt = "1"
                open(os.path.join(out_dir, f"started.{comm.rank}.1"),
                     "w").close()
        if attempt == "0" and comm.rank != DIES and os.fork() == 0:
            # The child holds the connection (inherited), out of reach of
            # torchrun's signals to the worker's process group.
            os.setsid()
            successor = os.path.join(out_dir, f"started.{comm.rank}.1")
            t0 = time.monotonic()
            while (not os.path.exists(successor) and
                   time.monotonic() - t0 < WAIT_S):
                time.sleep(0.05)
            time.sleep(LINGER_S)
            os._exit(0)
        steps = []
        for s in range(STEPS):
            if attempt == "0" and comm.rank == DIES and s == DIES_AFTER:
                os.kill(os.getpid(), signal.SIGKILL)
            t = comm.empty((COUNT,))
            t.copy_(data(comm.rank, s))
            comm.allreduce_1bit(3, t)
            steps.append(t.clone())
        torch.save(steps, os.path.join(out_dir,
                                       f"steps.{comm.rank}.{attempt}.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
