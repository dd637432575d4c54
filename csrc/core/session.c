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
#define TOKEN_SLOT_MASK 0xFFFFu
#define ENDING(slot, expiring) \
    (TOKEN_ENDING | ((expiring) ? TOKEN_EXPIRING : 0) | (uint64_t)(uint32_t)(slot))

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

/* Take the ending of session `token` in the name of slot `self` (this
 * process's, current: a dead owner's recovery goes by it): 1 if this caller
 * ends it now. */
static int claim_ending(shl_lock *h, uint64_t token, int32_t self, int expiring)
{
    return atomic_compare_exchange_strong_explicit(&h->hdr->session_token, &token,
                                                   ENDING(self, expiring),
                                                   memory_order_seq_cst, memory_order_relaxed);
}

/*
 * End the current session if its deadline has passed: take the ending,
 * count the mark, clear PINNED and set SUSPECT in one CAS (so a resume
 * that sees PINNED clear sees the mark: it is the same word), record the
 * lost session.  Returns 1 if it ended one (the caller reloads the state
 * word), 0 if nothing is due.
 */
int session_expire(shl_lock *h)
{
    struct shl_header *hd = h->hdr;
    /* Only a handle attached in this process may take an ending: its slot
     * names it, and a dead owner's recovery goes by that slot.  (A forked
     * child's inherited handle still carries its parent's slot until it
     * re-attaches; another process expires the session meanwhile.) */
    int32_t self = attached_slot(h);
    if (self < 0)
        return 0;
    if (!(atomic_load_explicit(&hd->state, memory_order_seq_cst) & ST_PINNED)) /* [model:SESSION_EXPIRE_LOOK] */
        return 0;
    /* acquire: pairs with session_pin's release store of the token, so
     * the deadline read is that session's (written before the token). */
    uint64_t token = atomic_load_explicit(&hd->session_token, memory_order_seq_cst); /* [model:SESSION_EXPIRE_TOKEN] */
    int64_t d = atomic_load_explicit(&hd->session_deadline_ns, memory_order_relaxed);
    if (token == 0 || (token & TOKEN_ENDING) || mono_ns() < d)
        return 0;
    if (!claim_ending(h, token, self, 1))   /* [model:SESSION_CLAIM_EXPIRE] */
        return 1;                    /* ended (or expired) by someone else meanwhile */
    /* The PINNED we saw may have been the previous session's: this token
     * may be a new session's whose pinner has written it and not set
     * PINNED yet (a ttl shorter than that gap).  Then it is not ours to
     * end: give the token back, and the next look expires it once pinned.
     * PINNED cannot be cleared meanwhile (only the ending's owner, us,
     * clears it), so seeing it set now means the session is pinned. */
    if (!(atomic_load_explicit(&hd->state, memory_order_seq_cst) & ST_PINNED)) { /* [model:SESSION_EXPIRE_RECHECK] */
        uint64_t mine = ENDING(self, 1);
        atomic_compare_exchange_strong_explicit(&hd->session_token, &mine, token,
                                                memory_order_seq_cst, memory_order_relaxed);
        return 0;
    }
    mark_counted(h);   /* [model:SESSION_MARK] */
    unpin(h, UNPIN_MARK);
    atomic_fetch_add_explicit(&hd->session_expiries, 1, memory_order_relaxed);
    record_recovery(h, atomic_load_explicit(&hd->session_pid, memory_order_relaxed),
                    SHL_LOST_SESSION, 0, 0);
    return 1;
}

/* recover_slot(i), for a dead process i: if it had taken the ending of a
 * session and died before clearing PINNED, finish that end (an expiry
 * marks the data suspect first, as session_expire does).  The caller owns
 * slot i's mutex, so nobody else recovers i meanwhile. */
void session_recover(shl_lock *h, uint32_t i)
{
    struct shl_header *hd = h->hdr;
    uint64_t t = atomic_load_explicit(&hd->session_token, memory_order_seq_cst);
    if (!(t & TOKEN_ENDING) || (t & TOKEN_SLOT_MASK) != i)   /* [model:RECOVER_SESSION] */
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
    if (ttl_ns <= 0)
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
    int r = ensure_attached(h);   /* our slot names the ending */
    if (r != SHL_OK)
        return r;
    int32_t self = self_slot(h);
    if (self < 0)
        return SHL_EINVAL;        /* an operator's handle has no slot to name it */
    /* Only the pinner had the token before PINNED was set, and it returns
     * the token after setting it: a caller's token names a pinned session,
     * or an ended one (then the CAS fails). */
    if (token == 0 || (token & TOKEN_ENDING) ||
        !(atomic_load_explicit(&h->hdr->state, memory_order_seq_cst) & ST_PINNED) ||
        !claim_ending(h, token, self, 0))   /* [model:SESSION_CLAIM_END] */
        return SHL_ENOSESSION;
    /* The session completed: it rewrote the data, unless a mark was made
     * since it began (a lost update call, say). */
    unpin(h, UNPIN_UNMARK);
    return SHL_OK;
}

int shl_session_end(shl_lock *h, uint64_t token)
{
    RUN_IN_FLIGHT(h, do_session_end(h, token));
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
