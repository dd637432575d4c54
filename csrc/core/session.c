/*
 * session.c - update sessions: an update pin owned by a token, not by a
 * process (protocol.c, "Update sessions", has the protocol; the model's
 * SESSION_* steps mirror the marked lines here), and the fence words.
 *
 * A weight update that spans several calls, landing on different processes
 * (begin, update, update, end), must keep the gate shut between the calls,
 * and a resume in between must wait for its end.  An update hold cannot do
 * that: it belongs to the process that took it and ends with the call.  A
 * session is the PINNED bit of the state word (resume waits while it is
 * set, as it does for UPDATE) plus a token in the header that names it, so
 * that any process can end it, and a deadline after which any attached
 * process ends it as expired (the data is then marked suspect).
 *
 * Who ends one.  Whoever takes an ending is named in the token word, so
 * that its death cannot leave the pin for ever: an attached process by its
 * slot (its slot's recovery finishes the end, session_recover), an
 * operator's handle, which owns no slot (`pyshmlock resume`, `pyshmlock
 * session end`), by one of its liveness bytes (liveness.c): an OFD write
 * lock it holds from before its ending is taken until after its unpin, and
 * which the kernel drops when it dies.  An attached process that finds an
 * operator's ending in the word with that byte free takes the ending over
 * and finishes it (session_adopt).
 */
#include "internal.h"

#include <sys/random.h>

/*
 * The token word.  A session's token never has TOKEN_ENDING set.  Ending a
 * session (its end, or its expiry) is two steps: a CAS of the token word
 * from the session's token to ENDING(slot) (with TOKEN_EXPIRING for an
 * expiry), which decides who ends it, then clearing PINNED.  Only the
 * process named in the token word clears PINNED, and a new session can pin
 * only once PINNED is clear, so no end ever clears the pin of a later
 * session.  If that process dies between the two steps, its slot's
 * recovery finishes the end (session_recover).  After an end the word
 * keeps ENDING(slot) until the next pin overwrites it; a new pin writes
 * its token before it sets PINNED.
 */
#define TOKEN_ENDING    (1ULL << 63)
#define TOKEN_EXPIRING  (1ULL << 62)
#define TOKEN_OPERATOR  (1ULL << 61)   /* the ender is an operator's liveness byte */
#define TOKEN_SLOT_MASK 0xFFFFu        /* the slot, or the operator's byte */
#define TOKEN_NONCE_MASK (((1ULL << 61) - 1) & ~(uint64_t)TOKEN_SLOT_MASK)
#define ENDING(slot, expiring) \
    (TOKEN_ENDING | ((expiring) ? TOKEN_EXPIRING : 0) | (uint64_t)(uint32_t)(slot))
#define IS_OPERATOR_ENDING(t) (((t) & (TOKEN_ENDING | TOKEN_OPERATOR)) == \
                               (TOKEN_ENDING | TOKEN_OPERATOR))

/* A fresh token: the count of sessions begun in the low half (so two
 * sessions of one segment never share a token) and random bits in the high
 * half, below the ENDING bits (so a token of an earlier segment of the same
 * name, or a guess, names no session).  Never 0. */
static uint64_t new_token(shl_lock *h)
{
    uint32_t n = atomic_fetch_add_explicit(&h->hdr->session_count, 1, memory_order_relaxed) + 1;
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd)
        rnd = (uint32_t)mono_ns() ^ ((uint32_t)getpid() << 16);
    uint64_t t = ((uint64_t)(rnd & 0x3FFFFFFFu) << 32) | n;
    return t ? t : 1;
}

/* 64 random bits (never 0 in practice; a fallback mixes the clock). */
static uint64_t random64(void)
{
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
        r = (uint64_t)mono_ns() * 0x9E3779B97F4A7C15ULL ^ ((uint64_t)getpid() << 32);
    return r;
}

/* Who takes an ending: the word that names it in the token word, and, for
 * an operator's handle, the liveness byte it holds meanwhile. */
struct ender {
    uint64_t word;
    int byte;          /* the operator's liveness byte, -1 for a slot */
};

/* Become an ender of this handle: its slot (attached in this process), or
 * an operator's handle's liveness byte, taken now (released by
 * ender_done).  An operator's ending word carries random bits, so that no
 * two endings are ever the same word: an adopter's CAS from the word it
 * loaded can only take over that very ending.  0 if this handle cannot
 * end a session now (a forked child's inherited handle before it
 * re-attaches; an operator whose every liveness byte is held). */
static int ender_begin(shl_lock *h, int expiring, struct ender *e)
{
    int32_t self = attached_slot(h);
    e->byte = -1;
    if (self >= 0) {
        e->word = ENDING(self, expiring);
        return 1;
    }
    if (!h->no_slot)
        return 0;
    e->byte = liveness_take_operator(h);
    if (e->byte < 0)
        return 0;
    e->word = TOKEN_ENDING | (expiring ? TOKEN_EXPIRING : 0) | TOKEN_OPERATOR |
              (random64() & TOKEN_NONCE_MASK) | (uint64_t)(uint32_t)e->byte;
    return 1;
}

/* Done ending (after the unpin, or after giving up): let the byte go. */
static void ender_done(shl_lock *h, const struct ender *e)
{
    if (e->byte >= 0)
        liveness_drop_operator(h, e->byte);
}

/* How unpin leaves the data-suspect mark. */
enum { UNPIN_MARK, UNPIN_KEEP, UNPIN_UNMARK };

/* Clear PINNED (the caller owns the ending, see above) and wake the
 * sleepers: resume, wait_unpinned, a second begin.  The same CAS marks the
 * data suspect (an expiry: counted before, mark_counted), or clears the
 * mark if no mark was made since the session began (a normal end: the
 * session rewrote the data), or leaves it. */
static void unpin(shl_lock *h, int how)
{
    struct shl_header *hd = h->hdr;
    uint32_t began = atomic_load_explicit(&hd->session_marks, memory_order_relaxed);
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
    for (;;) {
        uint32_t ns = s & ~(ST_PINNED | ST_SLEEPERS);
        if (how == UNPIN_MARK)
            ns |= ST_SUSPECT;
        else if (how == UNPIN_UNMARK)
            ns = suspect_after(h, ns, began);   /* [model:SESSION_UNMARK] */
        if (atomic_compare_exchange_weak_explicit(&hd->state, &s, ns, /* [model:SESSION_UNPIN] */
                                                  memory_order_seq_cst, memory_order_seq_cst))
            break;
    }
    if (s & ST_SLEEPERS)
        futex_wake_all(&hd->state);
}

/* Take the ending of session `token` in the name of e (this process's
 * slot, or an operator's byte): 1 if this caller ends it now. */
static int claim_ending(shl_lock *h, uint64_t token, const struct ender *e)
{
    return atomic_compare_exchange_strong_explicit(&h->hdr->session_token, &token, e->word,
                                                   memory_order_seq_cst, memory_order_relaxed);
}

/*
 * End session `token` as lost (its expiry, or an operator's abort): take
 * the ending, count the mark, clear PINNED and set SUSPECT in one CAS (so
 * a resume that sees PINNED clear sees the mark: it is the same word),
 * record the lost session.  1 if it ended it (or someone else did
 * meanwhile: the caller reloads the state word), 0 if it is not pinned
 * (yet), -1 if this handle cannot end it now.
 */
static int end_lost(shl_lock *h, uint64_t token)
{
    struct shl_header *hd = h->hdr;
    struct ender e;
    if (!ender_begin(h, 1, &e))
        return -1;
    if (!claim_ending(h, token, &e)) {   /* [model:SESSION_CLAIM_EXPIRE] */
        ender_done(h, &e);
        return 1;                    /* ended (or expired) by someone else meanwhile */
    }
    /* The PINNED we saw may have been the previous session's: this token
     * may be a new session's whose pinner has written it and not set
     * PINNED yet (a ttl shorter than that gap).  Then it is not ours to
     * end: give the token back, and the next look expires it once pinned.
     * PINNED cannot be cleared meanwhile (only the ending's owner, us,
     * clears it), so seeing it set now means the session is pinned. */
    if (!(atomic_load_explicit(&hd->state, memory_order_seq_cst) & ST_PINNED)) { /* [model:SESSION_EXPIRE_RECHECK] */
        uint64_t mine = e.word;
        atomic_compare_exchange_strong_explicit(&hd->session_token, &mine, token,
                                                memory_order_seq_cst, memory_order_relaxed);
        ender_done(h, &e);
        return 0;
    }
    mark_counted(h);   /* [model:SESSION_MARK] */
    unpin(h, UNPIN_MARK);
    atomic_fetch_add_explicit(&hd->session_expiries, 1, memory_order_relaxed);
    record_recovery(h, atomic_load_explicit(&hd->session_pid, memory_order_relaxed),
                    SHL_LOST_SESSION, 0, 0);
    ender_done(h, &e);
    return 1;
}

/*
 * The token word holds an operator's ending, t.  If that operator is gone
 * or done (its liveness byte is free), take the ending over and finish it.
 * Order, as session_recover's: the token (the caller loaded t), then the
 * byte, then PINNED, then a CAS from t.  t was written after its operator
 * took its byte, and the byte is let go only after the operator's unpin:
 * a free byte means the operator does nothing more.  A CAS from t that
 * succeeds means no new pin has written its token since t (a pin writes
 * its token before it sets PINNED), so a PINNED seen set is the pin that
 * operator owed to clear.  (Ending words carry random bits: a later ending
 * of another operator on the same byte is another word, and the CAS
 * fails.)  Then every sleeper is woken: the operator may have died between
 * its unpin and its wake-up.  1 if it took the ending over (the caller
 * reloads the state word), 0 otherwise.
 */
static int session_adopt(shl_lock *h, uint64_t t)
{
    struct shl_header *hd = h->hdr;
    if (liveness_operator_held(h->lockfd, (uint32_t)(t & TOKEN_SLOT_MASK)) != 0) /* [model:SESSION_ADOPT_GONE] */
        return 0;            /* it is still at work (or we cannot tell) */
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst); /* [model:SESSION_ADOPT_PINNED] */
    int expiring = (t & TOKEN_EXPIRING) != 0;
    struct ender e;
    if (!ender_begin(h, expiring, &e))
        return 0;
    if (!atomic_compare_exchange_strong_explicit(&hd->session_token, &t, e.word, /* [model:SESSION_ADOPT_CLAIM] */
                                                 memory_order_seq_cst, memory_order_seq_cst)) {
        ender_done(h, &e);
        return 0;            /* someone else took it over, or a new session began */
    }
    if (s & ST_PINNED) {
        if (expiring)
            mark_counted(h);
        /* A normal end that died before its unpin cleared no mark: the
         * mark stays as it is (as in session_recover). */
        unpin(h, expiring ? UNPIN_MARK : UNPIN_KEEP);
        if (expiring)
            record_recovery(h, atomic_load_explicit(&hd->session_pid, memory_order_relaxed),
                            SHL_LOST_SESSION, 0, 0);
    }
    /* [model:SESSION_ADOPT_WAKE] bits or not */
    atomic_fetch_and_explicit(&hd->state, ~ST_SLEEPERS, memory_order_seq_cst);
    futex_wake_all(&hd->state);
    ender_done(h, &e);
    return 1;
}

/*
 * End the current session if its deadline has passed (end_lost), or take
 * over an operator's ending that its operator left (session_adopt).
 * Returns 1 if it ended one (the caller reloads the state word), 0 if
 * nothing is due.
 */
int session_expire(shl_lock *h)
{
    struct shl_header *hd = h->hdr;
    if (!(atomic_load_explicit(&hd->state, memory_order_seq_cst) & ST_PINNED)) /* [model:SESSION_EXPIRE_LOOK] */
        return 0;
    /* acquire: pairs with session_pin's release store of the token, so
     * the deadline read is that session's (written before the token). */
    uint64_t token = atomic_load_explicit(&hd->session_token, memory_order_seq_cst); /* [model:SESSION_EXPIRE_TOKEN] [model:SESSION_ADOPT_TOKEN] */
    if (IS_OPERATOR_ENDING(token))
        return session_adopt(h, token);
    int64_t d = atomic_load_explicit(&hd->session_deadline_ns, memory_order_relaxed);
    if (token == 0 || (token & TOKEN_ENDING) || mono_ns() < d)
        return 0;
    return end_lost(h, token) == 1;
}

/* recover_slot(i), for a dead process i: if it had taken the ending of a
 * session and died before clearing PINNED, finish that end (an expiry
 * marks the data suspect first, as session_expire does).  The caller owns
 * slot i's mutex, so nobody else recovers i meanwhile. */
void session_recover(shl_lock *h, uint32_t i)
{
    struct shl_header *hd = h->hdr;
    uint64_t t = atomic_load_explicit(&hd->session_token, memory_order_seq_cst);
    if (!(t & TOKEN_ENDING) || (t & TOKEN_OPERATOR) ||   /* an operator's: session_adopt's */
        (t & TOKEN_SLOT_MASK) != i)   /* [model:RECOVER_SESSION] */
        return;
    /* PINNED, read before the token is taken back: if set, it is the pin
     * i owed to clear (a new pin writes its token before it sets PINNED,
     * and no other process clears a pin it does not own the ending of). */
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_seq_cst);
    if (!atomic_compare_exchange_strong_explicit(&hd->session_token, &t, 0,
                                                 memory_order_seq_cst, memory_order_relaxed))
        return;   /* a new session's token replaced it: i's end had completed */
    if (!(s & ST_PINNED))
        return;
    if (t & TOKEN_EXPIRING)
        mark_counted(h);
    /* A normal end that died before its unpin cleared no mark (the unpin
     * is what clears it): the mark stays as it is, which errs on the side
     * of a suspect lock (an operator's forced resume, or the next update,
     * clears it). */
    unpin(h, (t & TOKEN_EXPIRING) ? UNPIN_MARK : UNPIN_KEEP);
}

/*
 * Pin the pause for a new session.  The caller holds the update hold, so no
 * other pin can be made meanwhile, every reader was drained or is frozen by
 * a pause, and resume cannot clear the pause (UPDATE pins it).  Order: the
 * pause, then the session's fields and token, then PINNED: a process that
 * dies before PINNED is set leaves a token that no pin backs (expire and
 * end ignore it, the next pin overwrites it), and its update hold is
 * reclaimed (data suspect) as usual.
 */
static int do_session_pin(shl_lock *h, int64_t ttl_ns, uint64_t *token)
{
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    struct shl_header *hd = h->hdr;
    if (atomic_load_explicit(&h->held_excl, memory_order_relaxed) != SHL_KIND_UPDATE)
        return SHL_ENOHOLD;
    if (ttl_ns <= 0 || ttl_ns > (int64_t)SHL_SESSION_TTL_MAX_S * 1000000000LL)
        return SHL_EINVAL;
    session_expire(h);
    if (atomic_load_explicit(&hd->state, memory_order_seq_cst) & ST_PINNED)
        return SHL_AGAIN;   /* another session: wait until unpinned, then retry */
    do_pause(h);
    uint64_t t = new_token(h);
    int64_t now = mono_ns();
    atomic_store_explicit(&hd->session_deadline_ns,
                          ttl_ns > INT64_MAX - now ? INT64_MAX : now + ttl_ns,
                          memory_order_relaxed);
    atomic_store_explicit(&hd->session_began_ns, real_ns(), memory_order_relaxed);
    atomic_store_explicit(&hd->session_pid, h->pid, memory_order_relaxed);
    /* relaxed: no mark can be made while we hold the update hold (a mark
     * ends a held exclusive section or a session: neither can run now) */
    atomic_store_explicit(&hd->session_marks,
                          atomic_load_explicit(&hd->marks, memory_order_relaxed),
                          memory_order_relaxed);
    /* release: whoever reads this token (acquire) reads the fields above.
     * A plain store: PINNED is clear and we hold the update hold, so no
     * session exists and no other pin can be written. */
    atomic_store_explicit(&hd->session_token, t, memory_order_release);
    uint32_t s = atomic_load_explicit(&hd->state, memory_order_relaxed);
    /* seq_cst: ordered with resume's load; PAUSED cannot be clear here
     * (our update hold pins it), and nobody else sets PINNED. */
    while (!atomic_compare_exchange_weak_explicit(&hd->state, &s, s | ST_PINNED, /* [model:SESSION_PIN] */
                                                  memory_order_seq_cst, memory_order_seq_cst)) {
    }
    *token = t;
    return SHL_OK;
}

int shl_session_pin(shl_lock *h, int64_t ttl_ns, uint64_t *token)
{
    RUN_IN_FLIGHT(h, do_session_pin(h, ttl_ns, token));
}

/* End session `token`: take its ending (the token CAS decides), then clear
 * PINNED.  SHL_ENOSESSION if it is not the current session. */
static int do_session_end(shl_lock *h, uint64_t token)
{
    int r = ensure_attached(h);   /* our slot (or an operator's byte) names the ending */
    if (r != SHL_OK)
        return r;
    if (token == 0 || (token & TOKEN_ENDING) ||
        !(atomic_load_explicit(&h->hdr->state, memory_order_seq_cst) & ST_PINNED))
        return SHL_ENOSESSION;
    struct ender e;
    if (!ender_begin(h, 0, &e))
        return SHL_EBUSY;         /* every liveness byte of an operator is held */
    /* Only the pinner had the token before PINNED was set, and it returns
     * the token after setting it: a caller's token names a pinned session,
     * or an ended one (then the CAS fails). */
    if (!claim_ending(h, token, &e)) {   /* [model:SESSION_CLAIM_END] */
        ender_done(h, &e);
        return SHL_ENOSESSION;
    }
    /* The session completed: it rewrote the data, unless a mark was made
     * since it began (a lost update call, say). */
    unpin(h, UNPIN_UNMARK);
    ender_done(h, &e);
    return SHL_OK;
}

int shl_session_end(shl_lock *h, uint64_t token)
{
    RUN_IN_FLIGHT(h, do_session_end(h, token));
}

/* End session `token` now as lost, whoever began it (an operator's
 * abort of a session whose owner died): as an expiry, the data is marked
 * suspect.  SHL_ENOSESSION if it is not the current session. */
static int do_session_abort(shl_lock *h, uint64_t token)
{
    int r = ensure_attached(h);
    if (r != SHL_OK)
        return r;
    if (token == 0 || (token & TOKEN_ENDING) ||
        !(atomic_load_explicit(&h->hdr->state, memory_order_seq_cst) & ST_PINNED) ||
        atomic_load_explicit(&h->hdr->session_token, memory_order_seq_cst) != token)
        return SHL_ENOSESSION;
    r = end_lost(h, token);
    if (r < 0)
        return SHL_EBUSY;
    /* 1: ended, by us or by whoever took its ending meanwhile; 0: the
     * token is a session whose pinner has not set PINNED yet */
    return r == 1 ? SHL_OK : SHL_ENOSESSION;
}

int shl_session_abort(shl_lock *h, uint64_t token)
{
    RUN_IN_FLIGHT(h, do_session_abort(h, token));
}

/* ------------------------------------------------------------- fences */

static int do_fence_raise(shl_lock *h, uint64_t token, uint64_t *now)
{
    uint64_t f = atomic_load_explicit(&h->hdr->fence, memory_order_relaxed);
    /* relaxed: the fence is compared by fenced updates under their update
     * hold; it orders nothing else. */
    while (f < token && !atomic_compare_exchange_weak_explicit(&h->hdr->fence, &f, token,
                                                               memory_order_relaxed,
                                                               memory_order_relaxed)) {
    }
    *now = f < token ? token : f;
    return SHL_OK;
}

int shl_fence_raise(shl_lock *h, uint64_t token, uint64_t *now)
{
    RUN_IN_FLIGHT(h, do_fence_raise(h, token, now));
}

static int do_fence_applied(shl_lock *h, uint64_t token)
{
    if (atomic_load_explicit(&h->held_excl, memory_order_relaxed) != SHL_KIND_UPDATE)
        return SHL_ENOHOLD;
    atomic_store_explicit(&h->hdr->applied, token, memory_order_relaxed);
    return SHL_OK;
}

int shl_fence_applied(shl_lock *h, uint64_t token)
{
    RUN_IN_FLIGHT(h, do_fence_applied(h, token));
}

static int do_fence_get(shl_lock *h, uint64_t *fence, uint64_t *applied)
{
    *fence = atomic_load_explicit(&h->hdr->fence, memory_order_relaxed);
    *applied = atomic_load_explicit(&h->hdr->applied, memory_order_relaxed);
    return SHL_OK;
}

int shl_fence_get(shl_lock *h, uint64_t *fence, uint64_t *applied)
{
    RUN_IN_FLIGHT(h, do_fence_get(h, fence, applied));
}
