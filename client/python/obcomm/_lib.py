"""libobcomm through ctypes: finding the library and declaring its functions.

The library is found, in this order, at
  1. $OBCOMM_LIBRARY (a path; the build tree's build/client/libobcomm.so.0),
  2. the directory meson installed it to (recorded in _build_config.py at
     install time; for pip, where pkg-config found it at build time),
  3. wherever the dynamic linker finds "libobcomm" (ctypes.util).
ctypes releases the GIL around every call, so a blocking collective does
not stop the interpreter's other threads.
"""

import ctypes
import ctypes.util
import os

c_int, c_size_t, c_uint64, c_void_p = (ctypes.c_int, ctypes.c_size_t,
                                       ctypes.c_uint64, ctypes.c_void_p)


class Options(ctypes.Structure):
    """obcomm_options_t."""
    _fields_ = [("socket_path", ctypes.c_char_p), ("job", ctypes.c_char_p),
                ("local_rank", c_int), ("local_size", c_int),
                ("timeout_ms", c_int)]


class AdamConfig(ctypes.Structure):
    """obcomm_adam_config_t."""
    _fields_ = [("lr", ctypes.c_float), ("beta1", ctypes.c_float),
                ("beta2", ctypes.c_float), ("eps", ctypes.c_float),
                ("weight_decay", ctypes.c_float), ("freeze_step", ctypes.c_long),
                ("bias_correction", c_int)]


class ZoadamConfig(ctypes.Structure):
    """obcomm_zoadam_config_t."""
    _fields_ = [("lr", ctypes.c_float), ("beta1", ctypes.c_float),
                ("beta2", ctypes.c_float), ("eps", ctypes.c_float),
                ("weight_decay", ctypes.c_float),
                ("var_freeze_step", ctypes.c_long),
                ("var_update_scaler", ctypes.c_long),
                ("local_step_scaler", ctypes.c_long),
                ("local_step_clipper", ctypes.c_long)]


class ZoadamState(ctypes.Structure):
    """obcomm_zoadam_state_t."""
    _fields_ = [("step", ctypes.c_long), ("frozen", c_int),
                ("var_interval", ctypes.c_long),
                ("var_counter", ctypes.c_long),
                ("local_interval", ctypes.c_long),
                ("local_counter", ctypes.c_long), ("lrs", ctypes.c_double),
                ("rounds_fp32", ctypes.c_long), ("rounds_1bit", ctypes.c_long)]


# (name, restype, argtypes)
_FUNCTIONS = [
    ("obcomm_connect", c_int, [ctypes.POINTER(Options), ctypes.POINTER(c_void_p)]),
    ("obcomm_close", None, [c_void_p]),
    ("obcomm_rank", c_int, [c_void_p]),
    ("obcomm_size", c_int, [c_void_p]),
    ("obcomm_alloc", c_int, [c_void_p, c_size_t, ctypes.POINTER(c_void_p)]),
    ("obcomm_free", c_int, [c_void_p, c_void_p]),
    ("obcomm_disown", c_int, [c_void_p, c_void_p, ctypes.POINTER(c_size_t)]),
    ("obcomm_allreduce", c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int]),
    ("obcomm_allreduce_1bit", c_int, [c_void_p, c_uint64, c_void_p, c_size_t]),
    ("obcomm_reset_1bit", c_int, [c_void_p, c_uint64]),
    ("obcomm_save_1bit", c_int, [c_void_p, ctypes.POINTER(c_uint64)]),
    ("obcomm_restore_1bit", c_int, [c_void_p, c_uint64]),
    ("obcomm_1bit_durable", c_int, [c_void_p]),
    ("obcomm_export_1bit", c_int, [c_void_p, c_uint64,
                                   ctypes.POINTER(c_void_p),
                                   ctypes.POINTER(c_size_t)]),
    ("obcomm_restore_1bit_part", c_int, [c_void_p, c_uint64, c_void_p,
                                         c_size_t]),
    ("obcomm_snapshot_1bit", c_int, [c_void_p]),
    ("obcomm_broadcast", c_int, [c_void_p, c_void_p, c_size_t, c_int]),
    ("obcomm_barrier", c_int, [c_void_p]),
    ("obcomm_allgather", c_int, [c_void_p, c_void_p, c_void_p, c_size_t,
                                 c_int]),
    ("obcomm_reduce_scatter", c_int, [c_void_p, c_void_p, c_void_p, c_size_t,
                                      c_int, c_int]),
    # Non-blocking: the last argument receives an obcomm_request_t *, which
    # is tested or waited on, then freed with obcomm_request_free.
    ("obcomm_iallreduce", c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int,
                                  ctypes.POINTER(c_void_p)]),
    ("obcomm_iallreduce_1bit", c_int, [c_void_p, c_uint64, c_void_p, c_size_t,
                                       ctypes.POINTER(c_void_p)]),
    ("obcomm_ibroadcast", c_int, [c_void_p, c_void_p, c_size_t, c_int,
                                  ctypes.POINTER(c_void_p)]),
    ("obcomm_iallgather", c_int, [c_void_p, c_void_p, c_void_p, c_size_t,
                                  c_int, ctypes.POINTER(c_void_p)]),
    ("obcomm_ireduce_scatter", c_int, [c_void_p, c_void_p, c_void_p, c_size_t,
                                       c_int, c_int,
                                       ctypes.POINTER(c_void_p)]),
    ("obcomm_ibarrier", c_int, [c_void_p, ctypes.POINTER(c_void_p)]),
    ("obcomm_test", c_int, [c_void_p, ctypes.POINTER(c_int)]),
    ("obcomm_wait", c_int, [c_void_p]),
    ("obcomm_request_error", ctypes.c_char_p, [c_void_p]),
    ("obcomm_request_free", None, [c_void_p]),
    ("obcomm_fd", c_int, [c_void_p]),
    ("obcomm_last_error", ctypes.c_char_p, [c_void_p]),
    ("obcomm_strerror", ctypes.c_char_p, [c_int]),
    ("obcomm_err_name", ctypes.c_char_p, [c_int]),
    ("obcomm_dtype_name", ctypes.c_char_p, [c_int]),
    ("obcomm_op_name", ctypes.c_char_p, [c_int]),
    ("obcomm_constant", c_int, [ctypes.c_char_p,
                                ctypes.POINTER(ctypes.c_double)]),
    ("obcomm_adam_defaults", AdamConfig, []),
    ("obcomm_adam_create", c_int, [c_void_p, c_uint64, c_size_t,
                                   ctypes.POINTER(AdamConfig),
                                   ctypes.POINTER(c_void_p)]),
    ("obcomm_adam_step", c_int, [c_void_p, c_void_p, c_void_p]),
    ("obcomm_adam_start", c_int, [c_void_p, c_void_p]),
    ("obcomm_adam_finish", c_int, [c_void_p, c_void_p]),
    # Mixed precision and clipping: grads and model of an obcomm dtype
    # (FLOAT32, FLOAT16, BFLOAT16), a float scale each.
    ("obcomm_adam_start_ex", c_int, [c_void_p, c_void_p, c_int,
                                     ctypes.c_float]),
    ("obcomm_adam_start_inplace", c_int, [c_void_p, c_void_p,
                                          ctypes.c_float]),
    ("obcomm_adam_set_threads", c_int, [c_void_p, c_int]),
    ("obcomm_adam_wait", c_int, [c_void_p]),
    ("obcomm_adam_grad_sumsq", c_int, [c_void_p,
                                       ctypes.POINTER(ctypes.c_double)]),
    ("obcomm_adam_finish_ex", c_int, [c_void_p, c_void_p, c_void_p, c_int,
                                      ctypes.c_float]),
    ("obcomm_adam_destroy", None, [c_void_p]),
    ("obcomm_adam_set_lr", None, [c_void_p, ctypes.c_float]),
    ("obcomm_adam_steps", ctypes.c_long, [c_void_p]),
    ("obcomm_adam_set_error_feedback", None, [c_void_p, c_int]),
    ("obcomm_adam_set_mask", c_int, [c_void_p, c_void_p]),
    ("obcomm_adam_set_auto_mask", None, [c_void_p, ctypes.c_float]),
    ("obcomm_adam_masked", c_size_t, [c_void_p]),
    ("obcomm_adam_save", c_int, [c_void_p, ctypes.c_char_p]),
    ("obcomm_adam_load", c_int, [c_void_p, ctypes.c_char_p]),
    ("obcomm_adam_save_ex", c_int, [c_void_p, ctypes.c_char_p,
                                    ctypes.c_uint64]),
    ("obcomm_adam_load_ex", c_int, [c_void_p, ctypes.c_char_p, c_int]),
    ("obcomm_adam_get_state", c_int, [c_void_p, ctypes.POINTER(ctypes.c_long),
                                       ctypes.POINTER(c_void_p),
                                       ctypes.POINTER(c_void_p)]),
    ("obcomm_adam_set_state", c_int, [c_void_p, ctypes.c_long,
                                      ctypes.POINTER(AdamConfig), c_void_p,
                                      c_void_p]),
    # 0/1 Adam (ZeroOneAdam).
    ("obcomm_zoadam_create", c_int, [c_void_p, c_uint64, c_size_t,
                                     ctypes.POINTER(ZoadamConfig),
                                     ctypes.POINTER(c_void_p)]),
    ("obcomm_zoadam_step", c_int, [c_void_p, c_void_p, c_void_p]),
    ("obcomm_zoadam_set_lr", None, [c_void_p, ctypes.c_float]),
    ("obcomm_zoadam_steps", ctypes.c_long, [c_void_p]),
    ("obcomm_zoadam_rounds", None, [c_void_p, ctypes.POINTER(ctypes.c_long),
                                    ctypes.POINTER(ctypes.c_long)]),
    ("obcomm_zoadam_set_auto_mask", None, [c_void_p, ctypes.c_float]),
    ("obcomm_zoadam_masked", c_size_t, [c_void_p]),
    ("obcomm_zoadam_get_state", None, [c_void_p, ctypes.POINTER(ZoadamState),
                                       ctypes.POINTER(c_void_p),
                                       ctypes.POINTER(c_void_p),
                                       ctypes.POINTER(c_void_p),
                                       ctypes.POINTER(c_void_p)]),
    ("obcomm_zoadam_set_state", c_int, [c_void_p, ctypes.POINTER(ZoadamState),
                                        c_void_p, c_void_p, c_void_p,
                                        c_void_p]),
    ("obcomm_zoadam_destroy", None, [c_void_p]),
]



# -- 1-bit LAMB (obcomm_lamb_*, client/lamb.c) ------------------------------

class LambConfig(ctypes.Structure):
    """obcomm_lamb_config_t."""
    _fields_ = [(name, ctypes.c_float) for name in (
        "lr", "beta1", "beta2", "eps", "weight_decay", "max_coeff",
        "min_coeff", "coeff_beta", "factor_max", "factor_min",
        "factor_threshold")] + [("freeze_step", ctypes.c_long)]


class LambState(ctypes.Structure):
    """obcomm_lamb_state_t."""
    _fields_ = [("step", ctypes.c_long), ("stage", c_int),
                ("rounds_fp32", ctypes.c_long), ("rounds_1bit", ctypes.c_long)]


_FUNCTIONS += [
    ("obcomm_lamb_defaults", LambConfig, []),
    ("obcomm_lamb_create", c_int, [c_void_p, c_uint64, c_size_t, c_size_t,
                                   ctypes.POINTER(c_size_t),
                                   ctypes.POINTER(LambConfig),
                                   ctypes.POINTER(c_void_p)]),
    ("obcomm_lamb_step", c_int, [c_void_p, c_void_p, c_void_p]),
    ("obcomm_lamb_set_lr", None, [c_void_p, ctypes.c_float]),
    ("obcomm_lamb_steps", ctypes.c_long, [c_void_p]),
    ("obcomm_lamb_rounds", None, [c_void_p, ctypes.POINTER(ctypes.c_long),
                                  ctypes.POINTER(ctypes.c_long)]),
    ("obcomm_lamb_set_auto_mask", None, [c_void_p, ctypes.c_float]),
    ("obcomm_lamb_masked", c_size_t, [c_void_p]),
    ("obcomm_lamb_destroy", None, [c_void_p]),
    ("obcomm_lamb_save", c_int, [c_void_p, ctypes.c_char_p]),
    ("obcomm_lamb_load", c_int, [c_void_p, ctypes.c_char_p]),
    ("obcomm_lamb_save_ex", c_int, [c_void_p, ctypes.c_char_p, c_uint64]),
    ("obcomm_lamb_load_ex", c_int, [c_void_p, ctypes.c_char_p, c_int]),
    ("obcomm_lamb_get_state", None, [c_void_p, ctypes.POINTER(LambState)] +
     [ctypes.POINTER(c_void_p)] * 6),
    ("obcomm_lamb_set_state", c_int, [c_void_p, ctypes.POINTER(LambState)] +
     [c_void_p] * 6),
]

def _candidates():
    env = os.environ.get("OBCOMM_LIBRARY")
    if env:
        yield env
        return
    try:
        from . import _build_config
        if _build_config.LIBDIR:
            yield os.path.join(_build_config.LIBDIR, "libobcomm.so.0")
    except ImportError:
        pass
    found = ctypes.util.find_library("obcomm")
    if found:
        yield found
    yield "libobcomm.so.0"


def _load():
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        for name, res, args in _FUNCTIONS:
            f = getattr(lib, name)
            f.restype = res
            f.argtypes = args
        return lib, path
    raise ImportError("obcomm: cannot load libobcomm (set OBCOMM_LIBRARY to "
                      "build/client/libobcomm.so.0 or install obcomm): " +
                      "; ".join(errors))


lib, path = _load()


def constant(name):
    """One of obcomm.h's numeric constants ("OBCOMM_ADAM_MAX_THREADS") as
    the loaded library has it (obcomm_constant; a ratio is the float
    widened to a double)."""
    value = ctypes.c_double()
    if lib.obcomm_constant(name.encode(), ctypes.byref(value)) != 0:
        raise ImportError(f"obcomm: {path} has no constant {name}")
    return value.value


def enum(name_of):
    """An enum of obcomm.h read from the loaded library through
    name_of (obcomm_dtype_name, obcomm_op_name): {"bfloat16": 3, ...}, the
    names without "OBCOMM_" in lower case, in the order of their values
    (0 to 63)."""
    out = {}
    for value in range(64):
        name = name_of(value)
        if name is not None:
            out[name.decode()[len("OBCOMM_"):].lower()] = value
    return out

