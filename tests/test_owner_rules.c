/* Who owns a job, as the nodes compare it (daemon/owner.h), without
 * daemons: owners by uid and by name, the exact text that names every
 * owner with its nodes, nodes that use different rules, an owner without
 * a name, a bounded message, and the user database lookup of
 * owner_identity = name. tests/test_owner.c runs the same rules between
 * real daemons. */
#include <check.h>
#include <string.h>

#include "ck_run.h"
#include "err.h"
#include "owner.h"

static struct obd_owner by_uid(uint32_t uid)
{
    return (struct obd_owner){.uid = uid};
}

static struct obd_owner by_name(uint32_t uid, const char *name)
{
    struct obd_owner o = {.uid = uid, .by_name = 1};
    strcpy(o.name, name);
    return o;
}

/* obd_owner_agree over n owners; returns its result, text in why. */
static int agree(const struct obd_owner *o, int n, char *why, size_t len)
{
    const struct obd_owner *p[8];
    for (int i = 0; i < n; i++)
        p[i] = &o[i];
    return obd_owner_agree(p, n, why, len);
}

START_TEST(same_owners_agree)
{
    char why[256] = "untouched";
    struct obd_owner u[3] = {by_uid(7), by_uid(7), by_uid(7)};
    ck_assert_int_eq(agree(u, 3, why, sizeof(why)), 1);
    ck_assert_str_eq(why, "untouched");
    /* By name only the name counts: uids may differ between nodes. */
    struct obd_owner nm[3] = {by_name(1000, "alice"), by_name(1003, "alice"),
                              by_name(42, "alice")};
    ck_assert_int_eq(agree(nm, 3, why, sizeof(why)), 1);
    ck_assert_int_eq(agree(u, 1, why, sizeof(why)), 1);
    ck_assert_int_eq(agree(u, 0, why, sizeof(why)), 1);
}
END_TEST

START_TEST(different_uids_are_named_with_their_nodes)
{
    char why[256];
    struct obd_owner u[4] = {by_uid(0), by_uid(65534), by_uid(0), by_uid(1000)};
    ck_assert_int_eq(agree(u, 4, why, sizeof(why)), 0);
    ck_assert_str_eq(why,
                     "uid 0 on nodes 0, 2; uid 65534 on node 1; uid 1000 on "
                     "node 3");
    /* By name: the same uid with two names differs, the text names both. */
    struct obd_owner nm[3] = {by_name(1000, "alice"), by_name(1000, "bob"),
                              by_name(1001, "alice")};
    ck_assert_int_eq(agree(nm, 3, why, sizeof(why)), 0);
    ck_assert_str_eq(why, "user alice (uid 1000) on nodes 0, 2; user bob "
                          "(uid 1000) on node 1");
}
END_TEST

START_TEST(an_owner_without_a_name_equals_nobody)
{
    char why[256];
    struct obd_owner nm[3] = {by_name(5, ""), by_name(5, ""), by_name(5, "")};
    ck_assert_int_eq(obd_owner_same(&nm[0], &nm[1]), 0);
    ck_assert_int_eq(agree(nm, 3, why, sizeof(why)), 0);
    ck_assert_str_eq(why, "user (none) (uid 5) on node 0; user (none) (uid 5) "
                          "on node 1; user (none) (uid 5) on node 2");
}
END_TEST

START_TEST(nodes_with_different_rules_never_agree)
{
    char why[256];
    struct obd_owner o[3] = {by_uid(0), by_name(0, "root"), by_uid(0)};
    ck_assert_int_eq(obd_owner_same(&o[0], &o[1]), 0);
    ck_assert_int_eq(agree(o, 3, why, sizeof(why)), 0);
    ck_assert_str_eq(why, "uid 0 on nodes 0, 2; user root (uid 0) on node 1 "
                          "(owner_identity differs between the nodes: uid on "
                          "some, name on others)");
}
END_TEST

START_TEST(the_message_is_bounded)
{
    char why[24];
    memset(why, 'x', sizeof(why));
    struct obd_owner u[8];
    for (int i = 0; i < 8; i++)
        u[i] = by_uid((uint32_t)(4000000000u + (unsigned)i));
    ck_assert_int_eq(agree(u, 8, why, 16), 0);
    ck_assert_str_eq(why, "uid 4000000000 ");
    ck_assert_int_eq(why[16], 'x'); /* nothing past the length given */
}
END_TEST

START_TEST(names_come_from_the_user_database)
{
    char why[256] = "";
    struct obd_owner o = by_uid(9);
    ck_assert_int_eq(obd_owner_of_uid(0, 1, &o, why, sizeof(why)), 0);
    ck_assert_int_eq(o.uid, 0);
    ck_assert_int_eq(o.by_name, 1);
    ck_assert_str_eq(o.name, "root");
    /* By uid nothing is looked up: any uid will do. */
    ck_assert_int_eq(obd_owner_of_uid(3999999999u, 0, &o, why, sizeof(why)), 0);
    ck_assert_int_eq(o.uid, 3999999999u);
    ck_assert_int_eq(o.by_name, 0);
    ck_assert_str_eq(o.name, "");
    /* A uid without a name is refused by name, and *out is left alone. */
    ck_assert_int_eq(obd_owner_of_uid(3999999999u, 1, &o, why, sizeof(why)),
                     OBD_E_DENIED);
    ck_assert_str_eq(why, "uid 3999999999 has no user name here (not in the "
                          "user database), and owner_identity is name");
    ck_assert_int_eq(o.by_name, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("owner_rules");
    TCase *tc = tcase_create("owner_rules");
    tcase_add_test(tc, same_owners_agree);
    tcase_add_test(tc, different_uids_are_named_with_their_nodes);
    tcase_add_test(tc, an_owner_without_a_name_equals_nobody);
    tcase_add_test(tc, nodes_with_different_rules_never_agree);
    tcase_add_test(tc, the_message_is_bounded);
    tcase_add_test(tc, names_come_from_the_user_database);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
