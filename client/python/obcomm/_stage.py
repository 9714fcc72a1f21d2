"""Which stage an obcomm optimizer is in, told through Python's logging
(logger "obcomm"): one INFO line on every rank when the stage changes,
with the bytes a node sends per step before and after, and one WARNING
when a run that never left the warm-up is saved or ends."""

import logging
import math
import weakref

log = logging.getLogger("obcomm")


def padded_len(count, nodes):
    """The 1-bit op's padded length: count rounded up to a multiple of
    nodes * lcm(nodes, 8) (obd_codec_padded_len)."""
    unit = nodes * (nodes * 8 // math.gcd(nodes, 8))
    return -(-count // unit) * unit


def onebit_bytes(count, nodes):
    """Payload bytes one node sends in a 1-bit allreduce of count elements
    among `nodes` nodes: its packed signs and scale of every other node's
    chunk (the parameter-server phase), then its share of the allgather
    of the servers' chunks (docs/design.md); frame headers not counted,
    0 on one node (the trainers of a node share memory)."""
    if nodes < 2 or count == 0:
        return 0
    chunk = padded_len(count, nodes) // nodes
    return 2 * (nodes - 1) * (chunk // 8 + 4)


def fp32_bytes(count, nodes):
    """About the bytes one node sends in an fp32 ring allreduce of count
    elements (reduce-scatter and allgather: 2 (nodes - 1) chunks of
    count / nodes floats)."""
    if nodes < 2 or count == 0:
        return 0
    return 2 * (nodes - 1) * -(-count // nodes) * 4


class StageLog:
    """What an optimizer's stage changes and end of run log. The optimizer
    calls update(step, stage, text) after each step (text: the change's
    line, built only on a change) and warmup_note(step) when a state dict
    is taken; at_end runs when the optimizer is closed or collected, or at
    exit. Holds no reference to the optimizer."""

    def __init__(self, name, freeze_arg, freeze):
        self.name = name
        self.freeze_arg = freeze_arg
        self.freeze = freeze
        self.stage = "warmup"
        self.step = 0
        self.noted = False  # the never-compressed warning was given

    def update(self, step, stage, text):
        self.step = step
        if stage != self.stage:
            self.stage = stage
            log.info("%s", text())

    def warmup_note(self, when):
        """The WARNING for a run still in the warm-up, once."""
        if self.noted or self.step == 0 or self.stage != "warmup":
            return
        self.noted = True
        log.warning(
            "%s: %s at step %d, still in the warm-up (%s %d): no step was "
            "compressed; every step so far averaged full-precision "
            "gradients. A run shorter than %s never compresses: set it "
            "below the run's length", self.name, when, self.step,
            self.freeze_arg, self.freeze, self.freeze_arg)

    def at_end(self):
        self.warmup_note("the run ended")


def track(opt, name, freeze_arg, freeze):
    """A StageLog for opt, whose end note is given when opt is collected
    or at exit (or at opt.close(), which calls at_end itself)."""
    s = StageLog(name, freeze_arg, freeze)
    weakref.finalize(opt, s.at_end)
    return s
