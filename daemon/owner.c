#include "owner.h"
#include "err.h"

#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

int obd_owner_of_uid(uint32_t uid, int by_name, struct obd_owner *out,
                     char *why, size_t whylen)
{
    struct obd_owner o = {.uid = uid, .by_name = by_name != 0};
    if (by_name) {
        /* 16 KiB holds any passwd entry of files, LDAP or sssd. */
        char buf[16384];
        struct passwd pw, *res = NULL;
        int rc = getpwuid_r((uid_t)uid, &pw, buf, sizeof(buf), &res);
        if (rc != 0 || res == NULL) {
            snprintf(why, whylen,
                     "uid %u has no user name here (%s), and owner_identity "
                     "is name",
                     (unsigned)uid,
                     rc != 0 ? strerror(rc) : "not in the user database");
            return OBD_E_DENIED;
        }
        if (strlen(pw.pw_name) >= sizeof(o.name) || pw.pw_name[0] == '\0') {
            snprintf(why, whylen,
                     "the user name of uid %u is empty or longer than %d "
                     "bytes, and owner_identity is name",
                     (unsigned)uid, OBD_USER_NAME - 1);
            return OBD_E_DENIED;
        }
        memcpy(o.name, pw.pw_name, strlen(pw.pw_name) + 1);
    }
    *out = o;
    return 0;
}

int obd_owner_same(const struct obd_owner *a, const struct obd_owner *b)
{
    if (a->by_name != b->by_name)
        return 0;
    if (a->by_name)
        return a->name[0] != '\0' && strcmp(a->name, b->name) == 0;
    return a->uid == b->uid;
}

void obd_owner_text(const struct obd_owner *o, char *buf, size_t len)
{
    if (o->by_name)
        snprintf(buf, len, "user %s (uid %u)", o->name[0] ? o->name : "(none)",
                 (unsigned)o->uid);
    else
        snprintf(buf, len, "uid %u", (unsigned)o->uid);
}

/* Appends to buf at *off, never past len. */
static void append(char *buf, size_t len, size_t *off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void append(char *buf, size_t len, size_t *off, const char *fmt, ...)
{
    if (*off >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *off, len - *off, fmt, ap);
    va_end(ap);
    if (k > 0)
        *off += (size_t)k;
}

int obd_owner_agree(const struct obd_owner *const *owners, int n, char *why,
                    size_t whylen)
{
    if (n <= 0)
        return 1;
    int same = 1, rules = 0;
    for (int i = 0; i < n; i++) {
        same &= obd_owner_same(owners[i], owners[0]);
        rules |= owners[i]->by_name ? 2 : 1;
    }
    if (same)
        return 1;
    size_t off = 0;
    if (whylen > 0)
        why[0] = '\0';
    for (int i = 0; i < n; i++) {
        /* Each owner once, at its first node (an owner without a name
         * equals nobody, so it stands alone). */
        int seen = 0, count = 1;
        for (int j = 0; j < i; j++)
            seen |= obd_owner_same(owners[j], owners[i]);
        if (seen)
            continue;
        for (int j = i + 1; j < n; j++)
            count += obd_owner_same(owners[j], owners[i]);
        char who[OBD_USER_NAME + 32];
        obd_owner_text(owners[i], who, sizeof(who));
        append(why, whylen, &off, "%s%s on node%s %d", off ? "; " : "", who,
               count > 1 ? "s" : "", i);
        for (int j = i + 1; j < n; j++)
            if (obd_owner_same(owners[j], owners[i]))
                append(why, whylen, &off, ", %d", j);
    }
    if (rules == 3)
        append(why, whylen, &off,
               " (owner_identity differs between the nodes: uid on some, "
               "name on others)");
    return 0;
}
