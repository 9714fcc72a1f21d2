/* The ready queue (daemon/runq.h) on a real loop, turn by turn: an item
 * runs on a later turn, never inside the call that posted it, and once
 * however often it was posted meanwhile; what a run posts waits for the
 * next turn; a cancelled item does not run; the idle handle keeps the
 * loop turning only while something is queued; close drains the queue,
 * what the runs post meanwhile included, and ignores later posts. Every
 * test ends with the loop closed and empty. */
#include <check.h>

#include "ck_run.h"
#include <stddef.h>
#include <uv.h>

#include "runq.h"

struct item {
    struct obd_ready r; /* first: the run recovers the item by a cast */
    struct obd_runq *q;
    int runs;
    int last_turn;     /* the turn of the latest run */
    struct item *post; /* posted by this item's run, if not NULL */
    int repost;        /* times the run posts the item itself again */
};

static int turn;

static void item_run(struct obd_ready *r)
{
    struct item *it = (struct item *)r;
    it->runs++;
    it->last_turn = turn;
    if (it->post != NULL)
        obd_runq_post(it->q, &it->post->r);
    if (it->repost > 0) {
        it->repost--;
        obd_runq_post(it->q, &it->r);
    }
}

static void item_init(struct item *it, struct obd_runq *q)
{
    *it = (struct item){.q = q};
    it->r.run = item_run;
}

/* One turn of the loop; returns whether it still has active handles. */
static int one_turn(uv_loop_t *loop)
{
    turn++;
    return uv_run(loop, UV_RUN_NOWAIT);
}

static uv_loop_t loop;
static struct obd_runq q;

static void setup(void)
{
    turn = 0;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    obd_runq_init(&q, &loop);
}

/* Close, let the close callback run, and find the loop empty. */
static void teardown(void)
{
    obd_runq_close(&q);
    ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}

START_TEST(posted_item_runs_once_on_a_later_turn)
{
    struct item a;
    item_init(&a, &q);
    obd_runq_post(&q, &a.r);
    obd_runq_post(&q, &a.r);
    ck_assert_int_eq(a.runs, 0); /* not from inside post */
    ck_assert_int_eq(uv_loop_alive(&loop), 1);
    one_turn(&loop);
    ck_assert_int_eq(a.runs, 1);
    ck_assert_int_eq(a.r.queued, 0);
    /* Nothing queued: the idle handle stopped, the loop would block. */
    ck_assert_int_eq(one_turn(&loop), 0);
    ck_assert_int_eq(a.runs, 1);
}
END_TEST

START_TEST(what_a_run_posts_waits_for_the_next_turn)
{
    struct item a, b;
    item_init(&a, &q);
    item_init(&b, &q);
    a.post = &b;
    a.repost = 1;
    obd_runq_post(&q, &a.r);
    one_turn(&loop);
    ck_assert_int_eq(a.runs, 1);
    ck_assert_int_eq(b.runs, 0);
    one_turn(&loop);
    ck_assert_int_eq(a.runs, 2);
    ck_assert_int_eq(b.runs, 1);
    ck_assert_int_eq(a.last_turn, 2);
    ck_assert_int_eq(b.last_turn, 2);
    /* a's second run posted b again: one more turn. */
    ck_assert_int_eq(one_turn(&loop), 0);
    ck_assert_int_eq(a.runs, 2);
    ck_assert_int_eq(b.runs, 2);
}
END_TEST

START_TEST(cancelled_item_does_not_run)
{
    struct item a, b, c;
    item_init(&a, &q);
    item_init(&b, &q);
    item_init(&c, &q);
    obd_runq_cancel(&q, &a.r); /* not queued: nothing happens */
    obd_runq_post(&q, &a.r);
    obd_runq_post(&q, &b.r);
    obd_runq_post(&q, &c.r);
    obd_runq_cancel(&q, &b.r); /* from the middle */
    obd_runq_cancel(&q, &c.r); /* the tail */
    ck_assert_int_eq(b.r.queued, 0);
    one_turn(&loop);
    ck_assert_int_eq(a.runs, 1);
    ck_assert_int_eq(b.runs, 0);
    ck_assert_int_eq(c.runs, 0);
    /* The tail was fixed: a post after the cancels still runs. */
    obd_runq_post(&q, &c.r);
    one_turn(&loop);
    ck_assert_int_eq(c.runs, 1);
}
END_TEST

/* Close runs what is queued and, turn after turn within the call, what
 * those runs post, until the queue is empty; a post after close is
 * ignored; close again does nothing. */
START_TEST(close_drains_the_queue_and_ignores_later_posts)
{
    struct item a, b, c, d;
    item_init(&a, &q);
    item_init(&b, &q);
    item_init(&c, &q);
    item_init(&d, &q);
    a.post = &b;
    b.post = &c;
    a.repost = 1;
    obd_runq_post(&q, &a.r);
    obd_runq_close(&q);
    ck_assert_int_eq(a.runs, 2);
    ck_assert_int_eq(b.runs, 2);
    ck_assert_int_eq(c.runs, 2); /* each run of b posted c */
    obd_runq_post(&q, &d.r);
    ck_assert_int_eq(d.r.queued, 0);
    obd_runq_close(&q);
    ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    ck_assert_int_eq(d.runs, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("runq");
    TCase *tc = tcase_create("runq");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, posted_item_runs_once_on_a_later_turn);
    tcase_add_test(tc, what_a_run_posts_waits_for_the_next_turn);
    tcase_add_test(tc, cancelled_item_does_not_run);
    tcase_add_test(tc, close_drains_the_queue_and_ignores_later_posts);
    suite_add_tcase(s, tc);
    return ck_run(s);
}
