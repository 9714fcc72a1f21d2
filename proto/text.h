/* Text from outside (job names, cluster names, messages from peers and
 * clients) made safe for a log line or a terminal, shared by obcommd's log
 * and obcommctl. */
#ifndef OBCOMM_TEXT_H
#define OBCOMM_TEXT_H

#include <stddef.h>

/* Length of the valid UTF-8 sequence at s (1 for ASCII), or 0 when s does
 * not start one: overlong forms, surrogates, code points past U+10FFFF
 * and truncated sequences are invalid. s ends in NUL, which is never a
 * continuation byte, so the checks cannot run past the end. */
size_t obcomm_utf8_len(const unsigned char *s);

/* Copies the NUL-terminated text src into dst (cap bytes, cap >= 1, always
 * terminated) so that it prints as one line and moves no terminal:
 * backslash becomes "\\", newline, tab and carriage return "\n", "\t" and
 * "\r", every other C0 control, DEL, C1 control (U+0080..U+009F) and byte
 * that is not part of valid UTF-8 "\xNN" (one escape per byte, lowercase
 * hex). Printable ASCII and other valid UTF-8 stay as they are. Text that
 * does not fit is cut before the first escape or character that would
 * not fit. Returns the length written. */
size_t obcomm_text_escape(char *dst, size_t cap, const char *src);

#endif
