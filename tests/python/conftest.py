import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cluster  # noqa: E402

# The package under test is the source tree's, over the build tree's
# library (cluster.py says where each comes from).
os.environ.setdefault("OBCOMM_LIBRARY", cluster.LIBRARY)
sys.path.insert(0, cluster.PYPATH)


@pytest.fixture
def make_cluster():
    """make_cluster(k, flags=...) starts k daemons; all are stopped at the
    end of the test, whether it passed or not."""
    started = []

    def make(k, flags=(), timeout_ms=20000):
        c = cluster.Cluster(k, flags, timeout_ms)
        started.append(c)
        return c.start()

    yield make
    for c in started:
        c.stop()
