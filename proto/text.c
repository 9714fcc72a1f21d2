#include "text.h"

#include <string.h>

size_t obcomm_utf8_len(const unsigned char *s)
{
    unsigned char c = s[0];
    unsigned char lo = 0x80, hi = 0xbf;
    size_t n;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4;
    else
        return 0;
    /* Overlong forms, surrogates and code points past U+10FFFF. */
    if (c == 0xe0)
        lo = 0xa0;
    else if (c == 0xed)
        hi = 0x9f;
    else if (c == 0xf0)
        lo = 0x90;
    else if (c == 0xf4)
        hi = 0x8f;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return n;
}

size_t obcomm_text_escape(char *dst, size_t cap, const char *src)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)src;
    size_t o = 0;
    while (*p) {
        size_t n = obcomm_utf8_len(p);
        char esc[8];
        size_t k = 0;
        /* C1 controls are two bytes in UTF-8 (C2 80..C2 9F); terminals
         * may take U+009B as CSI, so they are escaped byte by byte. */
        int c1 = n == 2 && p[0] == 0xc2 && p[1] < 0xa0;
        if (n == 1 && *p >= 0x20 && *p < 0x7f && *p != '\\') {
            esc[k++] = (char)*p;
        } else if (n == 1 &&
                   (*p == '\\' || *p == '\n' || *p == '\t' || *p == '\r')) {
            esc[k++] = '\\';
            esc[k++] = *p == '\\'   ? '\\'
                       : *p == '\n' ? 'n'
                       : *p == '\t' ? 't'
                                    : 'r';
        } else if (n <= 1 || c1) {
            /* A control byte, or one byte of invalid UTF-8 (the next one
             * is looked at afresh), or the first byte of a C1 control. */
            esc[k++] = '\\';
            esc[k++] = 'x';
            esc[k++] = hex[*p >> 4];
            esc[k++] = hex[*p & 15];
            n = 1;
        } else {
            if (o + n >= cap)
                break;
            memcpy(dst + o, p, n);
            o += n;
            p += n;
            continue;
        }
        if (o + k >= cap)
            break;
        memcpy(dst + o, esc, k);
        o += k;
        p += n;
    }
    dst[o] = '\0';
    return o;
}
