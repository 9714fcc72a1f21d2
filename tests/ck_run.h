/* Runs a Check suite the way every test program here does: fork mode,
 * normal output; the exit status says whether anything failed. */
#ifndef CK_RUN_H
#define CK_RUN_H

#include <check.h>
#include <stdlib.h>

static inline int ck_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
