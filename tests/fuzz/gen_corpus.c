/* Writes the seed corpora of the fuzz targets: valid frames, messages,
 * configs and snapshots made by the daemon's own encoders, plus the edge
 * cases next to each bound. Run it from the source tree after changing a
 * format:
 *
 *     build/tests/fuzz/fuzz_gen_corpus tests/fuzz/corpus
 *
 * Files are named after what they hold; inputs that once crashed a target
 * are added by hand as crash-<what> and are never regenerated. */
#include "fuzz.h"

#include <errno.h>
#include <lz4frame.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <obcomm.h>

#include "config.h"
#include "efstate.h"
#include "frame.h"
#include "ops.h"
#include "wire.h"

static const char *root;

static void put(const char *target, const char *name, const void *data,
                size_t len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", root, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(EXIT_FAILURE);
    }
    snprintf(path, sizeof(path), "%s/%s/%s", root, target, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(EXIT_FAILURE);
    }
}

/* A growable byte string. */
struct bytes {
    uint8_t buf[1 << 16];
    size_t len;
};

static void add(struct bytes *b, const void *p, size_t len)
{
    if (b->len + len > sizeof(b->buf)) {
        fprintf(stderr, "seed too large\n");
        exit(EXIT_FAILURE);
    }
    memcpy(b->buf + b->len, p, len);
    b->len += len;
}

static void add_msg(struct bytes *b, const ProtobufCMessage *m)
{
    uint8_t tmp[8192];
    size_t len = protobuf_c_message_get_packed_size(m);
    if (len > sizeof(tmp))
        exit(EXIT_FAILURE);
    protobuf_c_message_pack(m, tmp);
    add(b, tmp, len);
}

/* ---- peer messages and frames ---- */

static void hello_msg(Obcomm__PeerMsg *msg, Obcomm__Hello *h, char *cluster)
{
    obcomm__hello__init(h);
    obcomm__peer_msg__init(msg);
    h->proto_version = OBCOMM_PROTO_VERSION;
    h->cluster = cluster;
    h->rank = 1;
    h->world_size = 2;
    h->world_fingerprint = FUZZ_EF_FINGERPRINT;
    msg->body_case = OBCOMM__PEER_MSG__BODY_HELLO;
    msg->hello = h;
}

static void announce_msg(Obcomm__PeerMsg *msg, Obcomm__OpAnnounce *a, char *job,
                         int status, char *message)
{
    obcomm__op_announce__init(a);
    obcomm__peer_msg__init(msg);
    a->job = job;
    a->seq = 7;
    a->node_rank = 1;
    a->local_size = 2;
    a->kind = OBCOMM_KIND_ALLREDUCE;
    a->dtype = OBCOMM_FLOAT32;
    a->redop = OBCOMM_SUM;
    a->count = 1000;
    a->key = 0;
    a->status = status;
    a->message = message;
    a->owner_uid = 1000;
    a->owner_by_name = 1;
    a->owner_name = "alice";
    msg->body_case = OBCOMM__PEER_MSG__BODY_ANNOUNCE;
    msg->announce = a;
}

static void add_frame(struct bytes *b, int type, uint32_t len)
{
    struct obd_frame f = {.version = OBCOMM_PROTO_VERSION,
                          .type = (uint8_t)type,
                          .job = obd_frame_job_id("train"),
                          .epoch = 1,
                          .seq = 7,
                          .fingerprint = UINT64_C(0x1122334455667788),
                          .step = 1,
                          .segment = 0,
                          .len = len};
    uint8_t hdr[OBD_FRAME_HDR];
    obd_frame_encode(&f, hdr);
    add(b, hdr, sizeof(hdr));
}

static void add_ctrl(struct bytes *b, const ProtobufCMessage *m)
{
    add_frame(b, OBD_FRAME_CTRL,
              (uint32_t)protobuf_c_message_get_packed_size(m));
    add_msg(b, m);
}

static void gen_peer(void)
{
    static struct bytes b;
    Obcomm__PeerMsg msg;
    Obcomm__Hello h;
    Obcomm__Refuse r;
    Obcomm__OpAnnounce a;
    char long_text[300];
    memset(long_text, 'x', sizeof(long_text) - 1);
    long_text[sizeof(long_text) - 1] = '\0';

    hello_msg(&msg, &h, "obcomm");
    b.len = 0;
    add_msg(&b, &msg.base);
    put("peer_msg", "hello", b.buf, b.len);
    /* The same Hello followed by an unknown varint field 99. */
    add(&b, "\x98\x06\x01", 3);
    put("peer_msg", "hello-unknown-field", b.buf, b.len);

    hello_msg(&msg, &h, long_text);
    b.len = 0;
    add_msg(&b, &msg.base);
    put("peer_msg", "hello-long-cluster", b.buf, b.len);

    obcomm__refuse__init(&r);
    obcomm__peer_msg__init(&msg);
    r.reason = "cluster 'a' here (rank 0), 'b' at the peer (rank 1)";
    msg.body_case = OBCOMM__PEER_MSG__BODY_REFUSE;
    msg.refuse = &r;
    b.len = 0;
    add_msg(&b, &msg.base);
    put("peer_msg", "refuse", b.buf, b.len);

    announce_msg(&msg, &a, "train", 0, "");
    b.len = 0;
    add_msg(&b, &msg.base);
    put("peer_msg", "announce", b.buf, b.len);
    /* Two members of the oneof: the last one wins. */
    hello_msg(&msg, &h, "obcomm");
    add_msg(&b, &msg.base);
    put("peer_msg", "announce-then-hello", b.buf, b.len);

    announce_msg(&msg, &a, "train", OBCOMM_E_TIMEOUT, long_text);
    b.len = 0;
    add_msg(&b, &msg.base);
    put("peer_msg", "announce-failed-long-message", b.buf, b.len);

    announce_msg(&msg, &a, long_text, 0, "");
    b.len = 0;
    add_msg(&b, &msg.base);
    put("peer_msg", "announce-long-job", b.buf, b.len);

    /* An owner name longer than any the daemon holds (owner.h). */
    announce_msg(&msg, &a, "train", 0, "");
    a.owner_name = long_text;
    b.len = 0;
    add_msg(&b, &msg.base);
    put("peer_msg", "announce-long-owner-name", b.buf, b.len);

    put("peer_msg", "empty", "", 0);
    /* Field 1 (Hello) as a length-delimited field longer than the input. */
    put("peer_msg", "hello-overlong", "\x0a\x7f\x08\x01", 4);

    /* Frames: a handshake and op as one stream, then each bound. */
    hello_msg(&msg, &h, "obcomm");
    b.len = 0;
    add_ctrl(&b, &msg.base);
    put("frame", "ctrl-hello", b.buf, b.len);
    announce_msg(&msg, &a, "train", 0, "");
    add_ctrl(&b, &msg.base);
    uint8_t seg[256];
    for (size_t i = 0; i < sizeof(seg); i++)
        seg[i] = (uint8_t)i;
    add_frame(&b, OBD_FRAME_DATA, sizeof(seg));
    add(&b, seg, sizeof(seg));
    add_frame(&b, OBD_FRAME_DATA, 0);
    put("frame", "stream-hello-announce-data", b.buf, b.len);

    static const struct {
        const char *name;
        int type;
        uint32_t len;
        int at;      /* byte to overwrite, -1: none */
        uint8_t val; /* with this */
    } edges[] = {
        {"data-at-bound", OBD_FRAME_DATA, 8192, -1, 0},
        {"data-over-bound", OBD_FRAME_DATA, 8193, -1, 0},
        {"ctrl-at-bound", OBD_FRAME_CTRL, OBCOMM_WIRE_MAX, -1, 0},
        {"ctrl-over-bound", OBD_FRAME_CTRL, OBCOMM_WIRE_MAX + 1, -1, 0},
        {"ctrl-empty", OBD_FRAME_CTRL, 0, -1, 0},
        {"bad-magic", OBD_FRAME_DATA, 4, 0, 'X'},
        {"bad-version", OBD_FRAME_DATA, 4, 4, 2},
        {"bad-type", OBD_FRAME_DATA, 4, 5, 3},
        {"reserved-6", OBD_FRAME_DATA, 4, 6, 1},
        {"reserved-47", OBD_FRAME_DATA, 4, 47, 0x80},
    };
    for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++) {
        b.len = 0;
        add_frame(&b, edges[i].type, edges[i].len);
        if (edges[i].at >= 0)
            b.buf[edges[i].at] = edges[i].val;
        add(&b, "\x08\x01\x12\x00", 4);
        put("frame", edges[i].name, b.buf, b.len);
    }
    b.len = 0;
    add_frame(&b, OBD_FRAME_DATA, 0);
    put("frame", "truncated-header", b.buf, OBD_FRAME_HDR - 1);
}

/* ---- client messages ---- */

static void add_prefixed(struct bytes *b, const Obcomm__ClientMsg *m)
{
    uint32_t len = (uint32_t)protobuf_c_message_get_packed_size(&m->base);
    uint8_t p[4] = {(uint8_t)len, (uint8_t)(len >> 8), (uint8_t)(len >> 16),
                    (uint8_t)(len >> 24)};
    add(b, p, sizeof(p));
    add_msg(b, &m->base);
}

static Obcomm__ClientMsg submit_msg(Obcomm__Submit *s, uint64_t seq,
                                    uint32_t kind, uint32_t dtype,
                                    uint32_t redop, uint64_t count)
{
    Obcomm__ClientMsg m = OBCOMM__CLIENT_MSG__INIT;
    obcomm__submit__init(s);
    s->seq = seq;
    s->kind = kind;
    s->dtype = dtype;
    s->redop = redop;
    s->count = count;
    s->key = kind == OBCOMM_KIND_ALLREDUCE_1BIT ? 3 : 0;
    s->root = kind == OBCOMM_KIND_BROADCAST ? 1 : 0;
    s->buffer_id = 1;
    s->offset = 64;
    m.body_case = OBCOMM__CLIENT_MSG__BODY_SUBMIT;
    m.submit = s;
    return m;
}

static void gen_client(void)
{
    static struct bytes b, session;
    Obcomm__ClientMsg m = OBCOMM__CLIENT_MSG__INIT;
    Obcomm__Join j = OBCOMM__JOIN__INIT;
    Obcomm__RegisterBuffer r = OBCOMM__REGISTER_BUFFER__INIT;
    Obcomm__ReleaseBuffer rel = OBCOMM__RELEASE_BUFFER__INIT;
    Obcomm__StatusRequest st = OBCOMM__STATUS_REQUEST__INIT;
    Obcomm__Submit s;

    j.proto_version = OBCOMM_PROTO_VERSION;
    j.job = "train";
    j.local_rank = 0;
    j.local_size = 2;
    j.timeout_ms = 5000;
    m.body_case = OBCOMM__CLIENT_MSG__BODY_JOIN;
    m.join = &j;
    b.len = 0;
    add_prefixed(&b, &m);
    put("client_msg", "join", b.buf, b.len);
    add_prefixed(&session, &m);

    r.id = 1;
    r.bytes = 1 << 20;
    m.body_case = OBCOMM__CLIENT_MSG__BODY_REGISTER;
    m.register_ = &r;
    b.len = 0;
    add_prefixed(&b, &m);
    put("client_msg", "register", b.buf, b.len);
    add_prefixed(&session, &m);

    static const struct {
        const char *name;
        uint32_t kind, dtype, redop;
        uint64_t count;
    } subs[] = {
        {"submit-allreduce", OBCOMM_KIND_ALLREDUCE, OBCOMM_FLOAT32, OBCOMM_SUM,
         1000},
        {"submit-allreduce-bf16-avg", OBCOMM_KIND_ALLREDUCE, OBCOMM_BFLOAT16,
         OBCOMM_AVG, 4097},
        {"submit-broadcast", OBCOMM_KIND_BROADCAST, 0, 0, 4096},
        {"submit-1bit", OBCOMM_KIND_ALLREDUCE_1BIT, 0, 0, 65536},
        {"submit-reset-1bit", OBCOMM_KIND_RESET_1BIT, 0, 0, 0},
        {"submit-barrier", OBCOMM_KIND_BARRIER, 0, 0, 0},
        {"submit-snapshot", OBCOMM_KIND_SNAPSHOT_1BIT, 0, 0, 0},
        {"submit-bad-dtype", OBCOMM_KIND_ALLREDUCE, 99, OBCOMM_SUM, 10},
        {"submit-bad-kind", 77, OBCOMM_FLOAT32, OBCOMM_SUM, 10},
        {"submit-count-overflow", OBCOMM_KIND_ALLREDUCE, OBCOMM_FLOAT64,
         OBCOMM_MAX, UINT64_MAX / 4},
    };
    for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
        m = submit_msg(&s, i, subs[i].kind, subs[i].dtype, subs[i].redop,
                       subs[i].count);
        b.len = 0;
        add_prefixed(&b, &m);
        put("client_msg", subs[i].name, b.buf, b.len);
        if (i < 3)
            add_prefixed(&session, &m);
    }

    rel.id = 1;
    m = (Obcomm__ClientMsg)OBCOMM__CLIENT_MSG__INIT;
    m.body_case = OBCOMM__CLIENT_MSG__BODY_RELEASE;
    m.release = &rel;
    b.len = 0;
    add_prefixed(&b, &m);
    put("client_msg", "release", b.buf, b.len);
    add_prefixed(&session, &m);

    m.body_case = OBCOMM__CLIENT_MSG__BODY_STATUS;
    m.status = &st;
    b.len = 0;
    add_prefixed(&b, &m);
    put("client_msg", "status", b.buf, b.len);
    add_prefixed(&session, &m);
    put("client_msg", "session", session.buf, session.len);

    put("client_msg", "prefix-zero", "\0\0\0\0\x2a\x00", 6);
    put("client_msg", "prefix-over-bound", "\x01\x00\x04\x00\x2a\x00", 6);
    put("client_msg", "prefix-longer-than-input", "\x10\x00\x00\x00\x2a\x00",
        6);
    put("client_msg", "empty-msg", "\x02\x00\x00\x00\x08\x00", 6);
}

/* ---- configs ---- */

static void put_text(const char *name, const char *text)
{
    put("config", name, text, strlen(text));
}

static void gen_config(void)
{
    struct obd_config cfg;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    obd_config_defaults(&cfg);
    obd_config_print(&cfg, f);
    fclose(f);
    put("config", "defaults", text, len);
    free(text);

    f = open_memstream(&text, &len);
    obd_config_print_help(f, 1, &cfg);
    fclose(f);
    put("config", "example", text, len);
    free(text);

    put_text("three-nodes",
             "# a three-node cluster\n"
             "cluster = lab\n"
             "rank = 2\n"
             "peers = 10.0.0.1:7000, 10.0.0.2:7000 ,10.0.0.3:7001\n"
             "listen = 0.0.0.0:7001\n"
             "socket = /run/obcomm/obcommd.sock\n"
             "timeout_ms = 0x7530   # hex is accepted\n"
             "segment_bytes = 65536\n"
             "threads = 2\n"
             "log_level = debug\n"
             "state_dir = /var/lib/obcomm\n");
    put_text("crlf", "cluster = a\r\nrank = 0\r\n\r\n");
    put_text("no-final-newline", "max_jobs = 1024");
    put_text("unknown-option", "colour = blue\n");
    put_text("no-equals", "cluster\n");
    put_text("bad-int", "rank = 1x\n");
    put_text("int-out-of-range", "segment_bytes = 8191\n");
    put_text("int-overflow", "max_buffer_bytes = 99999999999999999999\n");
    put_text("negative", "rank = -1\n");
    put_text("rank-without-peers", "rank = 1\n");
    put_text("rank-beyond-peers", "rank = 2\npeers = a:1,b:2\n");
    put_text("duplicate-peer", "peers = a:1,a:1\n");
    put_text("peer-bad-port", "peers = a:1,b:65536\n");
    put_text("peer-empty-host", "peers = :1\n");
    put_text("peers-empty-items", "peers = ,,a:1,,\n");
    put_text("listen-bad", "peers = a:1\nlisten = nowhere\n");
    put_text("bad-log-level", "log_level = loud\n");
    put_text("empty-cluster", "cluster =\n");
    put_text("cluster-at-bound",
             "cluster = "
             "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
             "\n");
    put_text("cluster-over-bound",
             "cluster = "
             "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
             "\n");
    put_text("value-with-equals", "cluster = a=b\n");

    /* 257 nodes, one more than OBD_MAX_NODES. */
    static char many[8192];
    size_t n = (size_t)snprintf(many, sizeof(many), "peers = ");
    for (int i = 0; i <= OBD_MAX_NODES; i++)
        n += (size_t)snprintf(many + n, sizeof(many) - n, "%sh:%d",
                              i ? "," : "", i + 1);
    snprintf(many + n, sizeof(many) - n, "\n");
    put_text("peers-too-many", many);

    /* A line one byte longer than the reader's buffer. */
    static char line[8300];
    memset(line, ' ', sizeof(line) - 2);
    memcpy(line, "cluster = x", 11);
    line[sizeof(line) - 2] = '\n';
    line[sizeof(line) - 1] = '\0';
    put_text("line-too-long", line);
}

/* ---- snapshots ---- */

static uint8_t *slurp(const char *path, size_t *len)
{
    static uint8_t buf[1 << 20];
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        exit(EXIT_FAILURE);
    *len = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    return buf;
}

/* A snapshot file as written by obd_ef_write; returned in a static buffer. */
static uint8_t *snapshot(const char *job, uint64_t count, uint64_t fp,
                         size_t *len)
{
    struct obd_ef *ef = obd_ef_new(job, 5, count, FUZZ_EF_NODES);
    struct obd_ef_world w = {FUZZ_EF_NODES, FUZZ_EF_RANK, fp};
    const struct obd_ef_set set = {1, 2};
    for (size_t i = 0; i < ef->padded; i++)
        ef->werr[i] = i < count ? (float)((i * 37) % 101) / 64.0f - 0.75f : 0;
    for (size_t i = 0; i < ef->padded / FUZZ_EF_NODES; i++)
        ef->serr[i] = (float)((i * 11) % 13) / 16.0f;
    char path[] = "/tmp/obd-fuzz-seed-XXXXXX";
    int fd = mkstemp(path);
    char why[256];
    if (fd < 0 || obd_ef_write(path, ef, &w, &set, NULL, why, sizeof(why)) != 0)
        exit(EXIT_FAILURE);
    close(fd);
    uint8_t *buf = slurp(path, len);
    unlink(path);
    obd_ef_free(ef);
    return buf;
}

/* Mode 0 of fuzz_efstate: the file as it is. */
static void put_file(const char *name, const uint8_t *file, size_t len)
{
    static uint8_t buf[(1 << 20) + 1];
    buf[0] = 0;
    memcpy(buf + 1, file, len);
    put("efstate", name, buf, len + 1);
}

/* Mode 1: the decompressed content, into buf[1..]; returns its length. */
static size_t content(const uint8_t *file, size_t len, uint8_t *buf, size_t cap)
{
    LZ4F_dctx *d;
    LZ4F_createDecompressionContext(&d, LZ4F_VERSION);
    size_t src = len, dst = cap - 1;
    size_t rc = LZ4F_decompress(d, buf + 1, &dst, file, &src, NULL);
    LZ4F_freeDecompressionContext(d);
    if (rc != 0 || src != len)
        exit(EXIT_FAILURE);
    buf[0] = 1;
    return dst + 1;
}

/* content as one LZ4 frame, with both checksums or none; returns its
 * length. */
static size_t frame_of(const uint8_t *content, size_t len, int checksums,
                       uint8_t *out, size_t cap)
{
    LZ4F_preferences_t prefs;
    memset(&prefs, 0, sizeof(prefs));
    if (checksums) {
        prefs.frameInfo.contentChecksumFlag = LZ4F_contentChecksumEnabled;
        prefs.frameInfo.blockChecksumFlag = LZ4F_blockChecksumEnabled;
    }
    size_t n = LZ4F_compressFrame(out, cap, content, len, &prefs);
    if (LZ4F_isError(n))
        exit(EXIT_FAILURE);
    return n;
}

static void gen_efstate(void)
{
    static uint8_t c[1 << 20];
    size_t len, clen;
    uint8_t *file = snapshot("train", 100, FUZZ_EF_FINGERPRINT, &len);
    put_file("file-100", file, len);
    put_file("file-100-truncated", file, len / 2);
    file[len / 2] ^= 0x40;
    put_file("file-100-bit-flipped", file, len);
    file = snapshot("train", 100, FUZZ_EF_FINGERPRINT, &len);
    clen = content(file, len, c, sizeof(c));
    put("efstate", "content-100", c, clen);
    put("efstate", "content-100-short", c, clen - 4);
    memcpy(c + clen, "\0\0\0\0", 4);
    put("efstate", "content-100-long", c, clen + 4);
    put("efstate", "content-header-only", c, 1 + 136);

    /* Header fields (after the mode byte): magic 8, version 4, order 4,
     * nodes 4, rank 4, fingerprint 8, key 8, count 8, padded 8, job 64,
     * run 8, set 8. */
    static const struct {
        const char *name;
        size_t at;
        uint64_t val;
        size_t size;
    } edits[] = {
        {"content-bad-version", 9, 1, 4},
        {"content-bad-order", 13, 0x04030201, 4},
        {"content-zero-nodes", 17, 0, 4},
        {"content-other-rank", 21, 0, 4},
        {"content-huge-count", 41, UINT64_C(1) << 62, 8},
        {"content-padded-mismatch", 49, 120, 8},
        {"content-job-unterminated", 57, 0x4141414141414141, 8},
    };
    for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
        clen = content(file, len, c, sizeof(c));
        memcpy(c + edits[i].at, &edits[i].val, edits[i].size);
        if (strcmp(edits[i].name, "content-job-unterminated") == 0)
            memset(c + 57, 'A', 64);
        put("efstate", edits[i].name, c, clen);
    }

    /* The content of content-100 re-framed: without checksums; as two
     * frames; as two frames of which the second lacks its end. */
    clen = content(file, len, c, sizeof(c));
    static uint8_t f2[1 << 16];
    size_t n = frame_of(c + 1, clen - 1, 0, f2, sizeof(f2));
    put_file("file-no-checksum", f2, n);
    n = frame_of(c + 1, 200, 1, f2, sizeof(f2));
    n += frame_of(c + 201, clen - 201, 1, f2 + n, sizeof(f2) - n);
    put_file("file-two-frames", f2, n);
    n = frame_of(c + 1, 200, 1, f2, sizeof(f2));
    n += frame_of(c + 201, clen - 201, 0, f2 + n, sizeof(f2) - n);
    put_file("file-second-frame-cut", f2, n - 4);
    /* A skippable frame before the snapshot. */
    memcpy(f2,
           "\x50\x2a\x4d\x18\x04\x00\x00\x00"
           "abcd",
           12);
    memcpy(f2 + 12, file, len);
    put_file("file-after-skippable", f2, len + 12);

    file = snapshot("other", 100, ~FUZZ_EF_FINGERPRINT, &len);
    put_file("file-other-world", file, len);
    file = snapshot("big", 3000, FUZZ_EF_FINGERPRINT, &len);
    put_file("file-3000", file, len);
    put("efstate", "empty", "", 0);
    put("efstate", "mode-0-empty", "", 1);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return EXIT_FAILURE;
    }
    root = argv[1];
    if (mkdir(root, 0755) != 0 && errno != EEXIST) {
        perror(root);
        return EXIT_FAILURE;
    }
    gen_peer();
    gen_client();
    gen_config();
    gen_efstate();
    return EXIT_SUCCESS;
}
