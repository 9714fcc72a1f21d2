/* Who owns a job across the mesh (docs/security.md, "Jobs across nodes").
 *
 * On each node a job belongs to the uid of its first trainer there (from
 * SO_PEERCRED; job.c refuses trainers of other uids). Every announce of an
 * op carries the sender's owner, and every node compares the owners of
 * all announces of the op before agreeing on it: all nodes see the same
 * announces, so all reach the same verdict, and a job whose ranks belong
 * to different users fails on every rank with OBD_E_DENIED.
 *
 * How owners compare is the config option owner_identity:
 *   uid   the uids must be equal (clusters whose users have one uid
 *         everywhere; no lookup at all);
 *   name  the user names must be equal, each node looking its trainers'
 *         uid up in its own user database (getpwuid_r) when they join:
 *         for clusters whose uids differ between nodes.
 * The announce says which rule its sender uses, so nodes configured
 * differently disagree on every job, visibly, rather than decide
 * differently. Pure logic apart from the user database: no event loop. */
#ifndef OBD_OWNER_H
#define OBD_OWNER_H

#include <stddef.h>
#include <stdint.h>

/* A user name's bytes, with the terminator: longer names are refused. */
#define OBD_USER_NAME 64

struct obd_owner {
    uint32_t uid;
    int by_name;              /* compared by name (owner_identity = name) */
    char name[OBD_USER_NAME]; /* by_name: the user's name; else empty */
};

/* The owner for a trainer of uid `uid` under the rule by_name. With
 * by_name the name is looked up here (the system's user database); a uid
 * without a name, or with a name of OBD_USER_NAME bytes or more, is
 * refused: returns OBD_E_DENIED with the reason in why and leaves *out
 * alone. Returns 0 otherwise. */
int obd_owner_of_uid(uint32_t uid, int by_name, struct obd_owner *out,
                     char *why, size_t whylen);

/* 1 if a and b are the same owner: both by uid and the same uid, or both
 * by name and the same non-empty name. */
int obd_owner_same(const struct obd_owner *a, const struct obd_owner *b);

/* "uid 65534" or "user alice (uid 1000)". */
void obd_owner_text(const struct obd_owner *o, char *buf, size_t len);

/* The owners of nodes 0..n-1 (borrowed): 1 if all are the same. Else 0, and why
 * names every owner with its nodes, in node order ("uid 0 on nodes 0, 2;
 * uid 65534 on node 1"), and says when the nodes use different rules. */
int obd_owner_agree(const struct obd_owner *const *owners, int n, char *why,
                    size_t whylen);

#endif
