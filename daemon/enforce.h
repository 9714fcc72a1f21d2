/* Invariants checked in every build.
 *
 * OBD_ENFORCE(cond, fmt, ...) checks a condition the code relies on (an
 * op's state table, a kernel's arguments that its callers validated). When
 * it is false the daemon is in a state nobody designed: it prints the
 * file, the line, the condition and what it saw (the printf-style rest),
 * as one line on stderr, and aborts, so that the core dump shows the
 * moment it broke. Unlike assert(), NDEBUG (meson's b_ndebug, on in
 * release builds) does not remove it: a release build checks what a debug
 * build checks (Gloo's GLOO_ENFORCE). It is for broken invariants only;
 * anything a client, a peer or a file can cause is an OBD_E_* error. */
#ifndef OBD_ENFORCE_H
#define OBD_ENFORCE_H

#define OBD_ENFORCE(cond, ...)                                        \
    do {                                                              \
        if (__builtin_expect(!(cond), 0))                             \
            obd_enforce_fail(__FILE__, __LINE__, #cond, __VA_ARGS__); \
    } while (0)

/* Prints "obcommd: FILE:LINE: invariant broken: COND: WHAT" to stderr and
 * aborts. */
void obd_enforce_fail(const char *file, int line, const char *cond,
                      const char *fmt, ...)
    __attribute__((noreturn, cold, format(printf, 4, 5)));

#endif
